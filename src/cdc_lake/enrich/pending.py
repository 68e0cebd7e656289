"""Late-arriving members: which facts are enriched, parked, released (known or unknown), restated.

One batch's candidates are the new fact versions, the pending (parked) facts, and the enriched
facts released with unknown members (restatement candidates). After the dimension join each
candidate gets a ``_fate``:

=========  =========================================  =======================================
origin     all members found                          a member missing
=========  =========================================  =======================================
new        ``enrich``                                 ``park`` (``_parked_at`` = batch start)
pending    ``release``                                ``unknown`` if parked >= wait, else ``wait``
restate    ``restate`` (``_unknown_members`` emptied)  ``keep`` (stays as released)
=========  =========================================  =======================================

Example::

    cands = candidates(new_upserts, pending_before, enriched_before, fact_cols, job_cols)
    fated = with_fate(join_dimensions(cands, ...), batch_start, wait)
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_lake.enrich.normalize import cols

ENRICHED_META = ("_unknown_members", "_fact_version", "_enriched_batch", "_dim_versions")
PENDING_META = ("_missing", "_parked_at", "_fact_version")
RELEASED = ("enrich", "release", "unknown", "restate")


def fact_columns(df: DataFrame, exclude: set[str]) -> list[str]:
    return [c for c in df.columns if c not in exclude]


def candidates(new: DataFrame, new_keys: DataFrame, pending: DataFrame | None,
               enriched: DataFrame | None, keys: tuple[str, ...], dim_outputs: set[str]) -> DataFrame:
    """New versions + parked facts + unknown-member facts, minus keys that have a new version."""
    parts = [new.select("*", F.lit(None).cast("timestamp").alias("_parked_at"),
                        F.lit("new").alias("_origin"),
                        F.lit(None).cast("array<string>").alias("_prev_missing"))]
    if pending is not None:
        p = pending.join(new_keys, list(keys), "left_anti")
        parts.append(p.withColumnRenamed("_missing", "_prev_missing")
                     .select("*", F.lit("pending").alias("_origin")))
    if enriched is not None:
        e = (enriched.where(F.size("_unknown_members") > 0).join(new_keys, list(keys), "left_anti")
             .drop(*[c for c in enriched.columns if c in dim_outputs],
                   "_enriched_batch", "_dim_versions")
             .withColumnRenamed("_unknown_members", "_prev_missing"))
        parts.append(e.select("*", F.lit(None).cast("timestamp").alias("_parked_at"),
                              F.lit("restate").alias("_origin")))
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p, allowMissingColumns=True)
    return out


def with_fate(joined: DataFrame, batch_start: datetime, wait: timedelta) -> DataFrame:
    """Add ``_fate`` (see the module table); parked rows get ``_parked_at`` = batch start."""
    matched = F.size("_missing") == 0
    origin = F.col("_origin")
    bs = F.lit(batch_start).cast("timestamp")
    waited = (F.unix_micros(bs) - F.unix_micros(F.col("_parked_at"))) >= int(wait / timedelta(microseconds=1))
    fate = (F.when(matched & (origin == "new"), "enrich")
            .when(matched & (origin == "pending"), "release")
            .when(matched, "restate")
            .when(origin == "new", "park")
            .when((origin == "pending") & waited, "unknown")
            .when(origin == "pending", "wait")
            .otherwise("keep"))
    return (joined.withColumn("_fate", fate)
            .withColumn("_parked_at", F.when(F.col("_fate") == "park", bs)
                        .otherwise(F.col("_parked_at"))))


def enriched_upserts(fated: DataFrame, fact_cols: list[str], dim_outputs: list[str],
                     batch_id: int, dim_versions: dict[str, int | None]) -> DataFrame:
    """Rows to write into the enriched table (released, enriched, restated)."""
    versions = F.create_map(*[x for name, v in dim_versions.items()
                              for x in (F.lit(name), F.lit(v).cast("bigint"))]) \
        if dim_versions else F.create_map().cast("map<string,bigint>")
    unknown = F.when(F.col("_fate") == "unknown", F.col("_missing")) \
        .otherwise(F.array().cast("array<string>"))
    return fated.where(F.col("_fate").isin(*RELEASED)).select(
        *[F.col(f"`{c}`") for c in fact_cols + dim_outputs],
        unknown.cast("array<string>").alias("_unknown_members"),
        F.col("_fact_version").cast("bigint").alias("_fact_version"),
        F.lit(batch_id).cast("bigint").alias("_enriched_batch"),
        versions.cast("map<string,bigint>").alias("_dim_versions"))


def enriched_deletes(fated: DataFrame, deletes: DataFrame, enriched: DataFrame | None,
                     keys: tuple[str, ...]) -> DataFrame | None:
    """Delete markers (``_enriched_batch`` null) for enriched rows that must go: deleted facts
    and facts whose new version is parked. Only keys present in the enriched table."""
    if enriched is None:
        return None
    k = list(keys)
    gone = (fated.where(F.col("_fate") == "park").select(*cols(k), "_fact_version")
            .unionByName(deletes.select(*cols(k), "_fact_version")))
    return (gone.join(enriched.select(*cols(k)), k, "left_semi")
            .select(*cols(k), F.col("_fact_version").cast("bigint").alias("_fact_version"),
                    F.lit(None).cast("bigint").alias("_enriched_batch")))


def pending_changes(fated: DataFrame, deletes: DataFrame, pending: DataFrame | None,
                    keys: tuple[str, ...], fact_cols: list[str]) -> DataFrame:
    """Pending upserts (newly parked, or still waiting with a changed ``_missing``) and delete
    markers (``_parked_at`` null) for pending rows released, superseded or deleted."""
    k = list(keys)
    changed = (F.col("_fate") == "park") | (
        (F.col("_fate") == "wait") & ~F.coalesce(F.col("_missing") == F.col("_prev_missing"), F.lit(False)))
    ups = fated.where(changed).select(
        *[F.col(f"`{c}`") for c in fact_cols], F.col("_missing"), F.col("_parked_at"),
        F.col("_fact_version").cast("bigint").alias("_fact_version"))
    if pending is None:
        return ups
    leaving = (fated.where(F.col("_fate").isin("enrich", "release", "unknown")).select(*cols(k))
               .unionByName(deletes.select(*cols(k))))
    dels = (pending.select(*cols(k)).join(leaving, k, "left_semi")
            .select(*cols(k), F.lit(None).cast("timestamp").alias("_parked_at")))
    return ups.unionByName(dels, allowMissingColumns=True)
