"""The enrichment job's fact source as a streaming DataFrame.

* ``change_feed``: the Delta change feed (:mod:`cdc_lake.sources.change_feed`), from the version
  a ``--reprocess`` snapshot left in ``<checkpoint>/enrich_start.json`` (:func:`start_version`);
* ``events``: an append-only JSON folder, read into ``fact.events.schema`` with Spark's
  corrupt-record column (:data:`~cdc_lake.enrich.config.CORRUPT`: a malformed line keeps its
  text for the quarantine) and deduplicated by the event id within the watermark, every event
  without an id kept apart (:func:`_dedupe_events`).

Example::

    df = fact_stream(spark, cfg, engine, recovery="spark-submit spark_jobs/enrich.py ... --reprocess")
    df.writeStream.foreachBatch(...)
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_lake.config import FILE_SOURCE_MAX_AGE
from cdc_lake.engines import Engine
from cdc_lake.enrich.config import CORRUPT, EnrichConfig

START_FILE = "enrich_start.json"


def start_version(cfg: EnrichConfig) -> int | None:
    """The change-feed version a --reprocess run left for the stream to start at (None: from
    the table's first version)."""
    p = cfg.checkpoint_path / START_FILE
    return int(json.loads(p.read_text(encoding="utf-8"))["starting_version"]) if p.is_file() else None


def fact_stream(spark: SparkSession, cfg: EnrichConfig, engine: Engine, recovery: str) -> DataFrame:
    """The fact source as a streaming DataFrame (change feed rows, or deduplicated events)."""
    f = cfg.fact
    if f.kind == "events":
        ev = f.events
        assert ev is not None
        df = (spark.readStream.schema(f"{ev.ddl}, `{CORRUPT}` string")
              .option("columnNameOfCorruptRecord", CORRUPT)
              .option("maxFilesPerTrigger", str(ev.max_files_per_trigger))
              .option("maxFileAge", FILE_SOURCE_MAX_AGE).json(str(ev.path)))
        return _dedupe_events(df, ev.id, ev.time, ev.watermark, ev.schema.get(ev.id, ""))
    from cdc_lake.sources.change_feed import read_change_feed

    start = start_version(cfg)
    return read_change_feed(spark, str(f.change_feed), engine=engine.name,
                            max_versions_per_trigger=f.max_versions_per_trigger,
                            max_rows_per_trigger=f.max_rows_per_trigger, starting_version=start,
                            recovery=recovery)


_NULL_ID = "\u0000cdc-lake:no-id:"  # no real event id starts with a NUL character


def _dedupe_events(df: DataFrame, id_col: str, time_col: str, watermark: str,
                   id_type: str) -> DataFrame:
    """Spark's streaming dedup by the event id — but every event without an id (a null id, a
    malformed line) is one of its own: the dedup took all null ids for one id and let one row
    through, so the others (and the text of malformed lines) were lost without a trace
    (tester). A string id stands in for the missing one during the dedup (NUL-prefixed, a
    UUID: unique per row; its state entry expires with the watermark like any other) and is
    null again after it; for another id type the rows without an id bypass the dedup (a second
    scan of the batch's files). Either way they reach the batch, where a null key is
    quarantined. The dedup's state keeps its key schema (``[id]``): existing checkpoints go on
    (checked with a checkpoint written by the previous code)."""
    idc = F.col(f"`{id_col}`")
    if id_type.strip().lower() == "string":
        # unique per row (a replayed batch starts again from the state before it)
        stand_in = F.concat(F.lit(_NULL_ID), F.expr("uuid()"))
        out = (df.withColumn(id_col, F.coalesce(idc, stand_in))
               .withWatermark(time_col, watermark).dropDuplicatesWithinWatermark([id_col]))
        return out.withColumn(id_col, F.when(idc.startswith(_NULL_ID), F.lit(None)).otherwise(idc))
    keyed = (df.where(idc.isNotNull()).withWatermark(time_col, watermark)
             .dropDuplicatesWithinWatermark([id_col]))
    return keyed.unionByName(df.where(idc.isNull()))
