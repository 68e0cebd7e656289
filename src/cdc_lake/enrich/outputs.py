"""What each output table of an enrichment batch receives: its MERGE rule and the frames of the
tables written without a key (quarantine, manifest). The batch writer
(:mod:`cdc_lake.enrich.writer`) computes the sources and writes them in order.

A source row of ``enriched`` with ``_enriched_batch`` null is a delete marker, as a ``pending``
row with ``_parked_at`` null is; every other row replaces or adds the fact's row::

    enriched_merge(("order_id", "line_no")).predicate()   # 't.`order_id` <=> s.`order_id` AND ...'
    quarantine_rows(cfg, norm, fact_cols, run_id="r1", batch_id=7)   # the batch's bad changes
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (ArrayType, DataType, LongType, MapType, NullType, StringType,
                               StructField, StructType, TimestampType)

from cdc_lake.engines import MergeSpec
from cdc_lake.engines.base import arrow_frame
from cdc_lake.enrich.columns import CORRUPT, SOURCE_FILE
from cdc_lake.enrich.config import EnrichConfig
from cdc_lake.enrich.plan import BatchPlan

MANIFEST_SCHEMA = StructType([
    StructField("pipeline", StringType()), StructField("batch_id", LongType()),
    StructField("run_id", StringType()), StructField("batch_started_at", TimestampType()),
    StructField("dimension_versions", MapType(StringType(), LongType())),
    StructField("enriched_version_before", LongType()),
    StructField("pending_version_before", LongType())])


def enriched_merge(keys: tuple[str, ...]) -> MergeSpec:
    """Delete markers (``_enriched_batch`` null) delete the fact's row; others upsert it."""
    return (MergeSpec(on=keys)
            .when_matched_delete("s._enriched_batch IS NULL")
            .when_matched_update_all("s._enriched_batch IS NOT NULL")
            .when_not_matched_insert_all("s._enriched_batch IS NOT NULL"))


def pending_merge(keys: tuple[str, ...]) -> MergeSpec:
    """Released facts (``_parked_at`` null) leave the pending table; parked ones are upserted."""
    return (MergeSpec(on=keys)
            .when_matched_delete("s._parked_at IS NULL")
            .when_matched_update_all("s._parked_at IS NOT NULL")
            .when_not_matched_insert_all("s._parked_at IS NOT NULL"))


def raw_line(norm: DataFrame, fact_cols: list[str]) -> Column:
    """A quarantined fact as text: an events line Spark could not read as it was (its corrupt
    record), otherwise the fact's columns as JSON (the values the job read, in the schema's
    types; timestamps to the microsecond: Spark's default format cut them to milliseconds,
    tester)."""
    as_json = F.to_json(F.struct(*[F.col(f"`{c}`") for c in fact_cols if c in norm.columns]),
                        {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
                         "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"})
    # valid UTF-8 (a byte such as \xff of a landed line kept as it was made the shared
    # quarantine table unreadable by Arrow/pandas: tester), as the CDC quarantine does
    return F.make_valid_utf8(F.coalesce(F.col(CORRUPT), as_json) if CORRUPT in norm.columns
                             else as_json)


def quarantine_rows(cfg: EnrichConfig, norm: DataFrame, fact_cols: list[str], *, run_id: str,
                    batch_id: int) -> DataFrame:
    """The batch's bad changes (``_bad``) as rows of the shared quarantine table."""
    # events: the line's own file; a change feed: the table (its rows have no file)
    source_file = (F.coalesce(F.col(SOURCE_FILE), F.lit(cfg.fact.label))
                   if SOURCE_FILE in norm.columns else F.lit(cfg.fact.label))
    return norm.where("_bad").select(
        source_file.alias("source_file"),
        raw_line(norm, fact_cols).alias("raw_line"),
        F.make_valid_utf8("_reason").alias("reason"),
        F.lit(cfg.fact.label).alias("source_table"), F.lit(cfg.name).alias("pipeline"),
        F.lit(run_id).alias("run_id"), F.lit(batch_id).cast("bigint").alias("batch_id"),
        F.current_timestamp().alias("quarantined_at"))


def manifest_row(spark: SparkSession, cfg: EnrichConfig, plan: BatchPlan, *, batch_id: int,
                 run_id: str, dim_versions: dict[str, int | None]) -> DataFrame:
    """The batch's manifest row: what it read (dimension versions, own tables' versions before
    it) and when it started (the point in time of its joins)."""
    return arrow_frame(spark, pa.Table.from_pylist([{
        "pipeline": cfg.name, "batch_id": batch_id, "run_id": run_id,
        "batch_started_at": plan.started_at, "dimension_versions": list(dim_versions.items()),
        "enriched_version_before": plan.versions.get("enriched"),
        "pending_version_before": plan.versions.get("pending")}],
        schema=to_arrow_schema(MANIFEST_SCHEMA, timezone="UTC")), MANIFEST_SCHEMA)


def no_void(df: DataFrame, target: StructType | None) -> DataFrame:
    """Columns of unknown type (a dimension with no table yet) take the target table's type, or
    string for a column the table does not have yet (table_types widens it later)."""
    types = {} if target is None else {f.name: f.dataType for f in target.fields}
    return df.select(*[F.col(f"`{f.name}`").cast(types.get(f.name, StringType())).alias(f.name)
                       if isinstance(f.dataType, NullType) else F.col(f"`{f.name}`")
                       for f in df.schema.fields])


def nullable(t: DataType) -> Any:
    """``t`` with every field, element and value nullable (a table created for a MERGE source
    whose delete markers carry nulls)."""
    if isinstance(t, StructType):
        return StructType([StructField(f.name, nullable(f.dataType), True) for f in t.fields])
    if isinstance(t, ArrayType):
        return ArrayType(nullable(t.elementType), True)
    if isinstance(t, MapType):
        return MapType(t.keyType, nullable(t.valueType), True)
    return t
