"""What an enrichment run counts: :class:`EnrichStats` (the run summary's figures) and
:func:`batch_counts`, a micro-batch's counts from one Spark job.

Example::

    stats = EnrichStats()
    counts, ties, deletes, fates = batch_counts(norm_counts, fated)
    stats.facts_read += sum(counts.values())
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

__all__ = ["EnrichStats", "batch_counts"]


@dataclass
class EnrichStats:
    """One run's figures, added up over its micro-batches (the run summary reports them)."""

    batch_ids: list[int] = field(default_factory=list)
    facts_read: int = 0
    enriched_upserted: int = 0
    enriched_deleted: int = 0
    parked: int = 0
    released: int = 0
    released_unknown: int = 0
    restated: int = 0
    aggregate_rows_touched: int = 0
    quarantined: int = 0
    dropped_late: int = 0  # events at or before the batch's watermark (kept in quarantine)
    skipped_writes: int = 0
    replayed_batches: int = 0
    driver_read_batches: int = 0  # micro-batches read by delta-rs in the driver
    dimension_versions: dict[str, int | None] = field(default_factory=dict)
    tables: dict[str, int | None] = field(default_factory=dict)
    batch_seconds: list[float] = field(default_factory=list)
    # the earliest start pinned by a batch of this run (a replayed batch keeps its first
    # attempt's): facts parked from then on were parked by this run (enrich.rejoin.due)
    planned_from: datetime | None = None


def batch_counts(norm_counts: DataFrame, fated: DataFrame) -> tuple[dict[tuple[bool, bool], int], int, int, dict[str, int]]:
    """``(counts, ties, deletes, fates)`` of a batch from one Spark job: the normalized changes
    per (bad, late) with the number of fact keys changed twice in the commit and the number of
    deletes among the good ones, and the candidates per fate. Two collects were two jobs on a
    cold JVM (800-fact-change spark-submits in alternating pairs: the batch's steps 0.4-1.2 s
    faster in each of 7, the wall faster in 5 of 7, median -0.8 s; docs/benchmarks.md)."""
    tag, none = F.lit(None).cast("boolean"), F.lit(None).cast("bigint")
    both = norm_counts.select(F.lit("norm").alias("_of"), F.lit(None).cast("string").alias("_fate"),
                              "_bad", "late", "n", "ties", "dels").unionByName(
        fated.groupBy("_fate").agg(F.count("*").alias("n")).select(
            F.lit("fate").alias("_of"), "_fate", tag.alias("_bad"), tag.alias("late"), "n",
            none.alias("ties"), none.alias("dels")))
    counts: dict[tuple[bool, bool], int] = {}
    ties, dels, fates = 0, 0, {}
    for r in both.collect():
        if r["_of"] == "norm":
            counts[(r["_bad"], r["late"])] = r["n"]
            ties, dels = ties + (r["ties"] or 0), dels + (r["dels"] or 0)
        else:
            fates[r["_fate"]] = r["n"]
    return counts, ties, dels, fates
