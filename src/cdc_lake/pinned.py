"""A micro-batch's intermediate DataFrames, computed once for the batch's several uses.

Spark analyzes every new DataFrame against its whole logical plan (``DeduplicateRelations``,
``checkAnalysis``; a cache does not shorten the plan the analyzer walks). An enrichment batch
derives its outputs' sources in dozens of steps from a few shared frames, so for a small batch
the driver spent most of its time analyzing ever longer plans, not computing (JFR of a warm
local session, one event per batch: ``unionByName`` and ``select`` alone were 45% of the stream
thread's CPU; docs/benchmarks.md).

:func:`pin` computes a frame now and returns it as a leaf: in local mode (``local[...]``: the
only executor is this JVM, no block of it can be lost on its own) a local checkpoint; on a
cluster a cache, which Spark recomputes from the lineage when an executor is lost (a local
checkpoint's blocks would be gone with it and fail the batch). :func:`release` frees either.

Example::

    norm = pin(latest_per_key(cfg, rows, batch_id))   # one Spark job, now
    ...                                                 # every later step analyzes a leaf
    release(norm)
"""

from __future__ import annotations

from pyspark.sql import DataFrame


def local_master(master: str) -> bool:
    """True for Spark's local masters (``local``, ``local[4]``, ``local[*, 2]``: driver and
    executor one JVM); False for a cluster, ``local-cluster[...]`` included (its executors are
    JVMs of their own, so a block can be lost with one)."""
    return master == "local" or master.startswith("local[")


def local_mode(df: DataFrame) -> bool:
    """True when ``df``'s session runs one of Spark's local masters (:func:`local_master`)."""
    return local_master(df.sparkSession.sparkContext.master)


def pin(df: DataFrame) -> DataFrame:
    """``df`` computed once: a local checkpoint (computed now, lineage cut) in local mode, else a
    cache (computed on first use, recomputed after an executor loss)."""
    if local_mode(df):
        return df.localCheckpoint(eager=True)
    return df.persist()


def release(df: DataFrame) -> None:
    """Free what :func:`pin` kept: the checkpoint's blocks (Spark would drop them only when the
    driver's garbage collector reaches the RDD) or the cache."""
    try:
        plan = df._jdf.queryExecution().analyzed()
        if plan.getClass().getSimpleName() == "LogicalRDD":
            plan.rdd().unpersist(False)
            return
    except Exception:  # noqa: BLE001 - a plan of another shape: it was cached, not checkpointed
        pass
    df.unpersist()
