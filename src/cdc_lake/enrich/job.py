"""One enrichment run: lock, stream the fact changes (availableNow/once), write, summarize.

Example::

    from cdc_lake.config import load_pipeline
    from cdc_lake.enrich.job import run_enrich
    cfg = load_pipeline("pipelines/shop_order_lines.yaml")
    summary = run_enrich(cfg, run_id="manual_1")
    summary["parked"], summary["dimension_versions"]

``reprocess=True`` resets this pipeline's checkpoint and output tables (enriched, pending,
aggregates, manifest) and rebuilds them from the fact table's current snapshot, then follows
the change feed from the next version: the recovery after an upstream rewrite
(:class:`EnrichNeedsReprocess`, exit 3 from ``spark_jobs/enrich.py``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_lake.checkpoint import claim_checkpoint, instance_id
from cdc_lake.checkpoint_log import (PipelineStateError, remove_unfinished_writes,
                                      validate_checkpoint)
from cdc_lake.engines import DeltaRsEngine, Engine, select_engine
from cdc_lake.enrich import aggregate as agg_mod
from cdc_lake.enrich import rejoin
from cdc_lake.enrich.rejoin import Passes
from cdc_lake.enrich.config import EnrichConfig
from cdc_lake.enrich.fact_source import fact_stream, prefetch_source, start_version
from cdc_lake.enrich.preflight import preflight
from cdc_lake.enrich.reprocess import REPROCESS_MARK, bootstrap, reset
from cdc_lake.enrich.state import (EnrichNeedsReprocess, check_definitions, check_tables,
                                   recovery_command)
from cdc_lake.enrich.table_damage import check_dimensions_present
from cdc_lake.enrich.counts import EnrichStats
from cdc_lake.enrich.fast_path import nothing_to_do
from cdc_lake.enrich.writer import EnrichBatch
from cdc_lake.locks import pipeline_lock
from cdc_lake.runids import safe_run_id
from cdc_lake.sources.landing_files import driver_listing_conf
from cdc_lake.spark_session import (batch_handler, build_session, check_file_name_encoding,
                                    session_settings, start_without_no_data_batches)
from cdc_lake.summary import record_failure, record_summary

__all__ = ["EnrichNeedsReprocess", "run_enrich", "fact_stream"]


def _recovery(cfg: EnrichConfig) -> str:
    return recovery_command(cfg)


def _instance(cfg: EnrichConfig) -> str:
    """The checkpoint's id (it names every write in the Delta txn appIds
    ``enrich-<pipeline>-<id>-<table>``, by which a replayed batch skips what it wrote). Minted
    only for a checkpoint without batches: a new id on a checkpoint with a planned batch would
    write that batch's aggregate contributions a second time (tester: counts 136 for 114 rows,
    exit 0). A missing or damaged file stops the run (exit 3) naming the id the tables hold."""
    import re

    from cdc_lake.checkpoint import INSTANCE_FILE, StateFileDamaged, read_instance_id
    from cdc_lake.checkpoint_log import last_offset_batch
    from cdc_lake.paths import q
    from cdc_lake.table_writers import table_app_ids

    f = cfg.checkpoint_path / INSTANCE_FILE

    def recovery() -> str:  # reads the output tables' logs: only when the id is not readable
        own = re.compile(rf"^enrich-{re.escape(cfg.name)}-([0-9a-f]{{16}})-")
        ids = sorted({m.group(1) for path in cfg.output_tables.values()
                      for app in table_app_ids(path) if (m := own.match(app))})
        write_back = (f"`echo '{{\"instance_id\": \"{ids[0]}\"}}' > {q(f)}` (the id the pipeline's "
                      "tables hold in their Delta txn appIds) and run again" if len(ids) == 1 else
                      "write the id back: `{\"instance_id\": \"<id>\"}`, <id> as in the txn appIds "
                      f"enrich-{cfg.name}-<id>-<table> of its output tables" + (f" (found: {ids})" if ids else ""))
        return f"restore it from a copy, or {write_back}; or rebuild: `{_recovery(cfg)}`"

    try:
        found = read_instance_id(cfg.checkpoint_path)
    except StateFileDamaged:
        read_instance_id(cfg.checkpoint_path, recovery=recovery())  # raises, naming the id
        raise
    if found is None and last_offset_batch(cfg.checkpoint_path) is not None:
        raise PipelineStateError(
            f"pipeline {cfg.name}: {f} is missing, but the checkpoint has batches: a new id would "
            f"write a replayed batch's aggregate contributions again. Recovery: {recovery()}")
    return instance_id(cfg.checkpoint_path)


def _no_op_engine(cfg: EnrichConfig, run_started: datetime) -> Engine | None:
    """The engine (delta-rs, no Spark session) of a run with nothing to do, after the checks a
    run makes before its stream; None when the run needs Spark (:mod:`.fast_path`)."""
    engine = DeltaRsEngine(None)  # type: ignore[arg-type]  (reads versions and logs only)
    if not nothing_to_do(cfg, engine, run_started):
        return None
    validate_checkpoint(cfg.checkpoint_path, recovery=_recovery(cfg))  # damaged: exit 3
    check_definitions(cfg)  # aggregate new or changed: exit 2
    check_tables(cfg)       # own tables lost commits / deleted: exit 3
    check_dimensions_present(cfg)  # a dimension batches read is gone: exit 3
    print(f"[enrich] pipeline {cfg.name}: no new fact and no re-join pass due; "
          "Spark not started", flush=True)
    return engine


class FactTableMissing(RuntimeError):
    """The change-feed fact table does not exist: the run fails before reading or writing
    (exit 1, retried by Airflow: the upstream pipeline may create it)."""


def run_enrich(cfg: EnrichConfig, *, spark: SparkSession | None = None, run_id: str | None = None,
               reprocess: bool = False, batch_hook: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Process everything new in the fact source, then stop. Returns the run summary.

    ``batch_hook(batch_id)`` (tests) runs after each batch's writes, before Spark's commit.

    Raises:
        PipelineLocked: another run holds this pipeline's lock (exit 75).
        EnrichNeedsReprocess: upstream rewritten or change feed gone, or an own table lost
            commits / was deleted behind the checkpoint (exit 3).
        PipelineStateError: a damaged state file, or an upstream data file deleted by hand that
            must be put back (or its table rebuilt) before anything else (exit 3).
        ConfigError: an aggregate is new or changed on a running pipeline; ``--reprocess``
            would delete something the job does not own (exit 2).
    """
    run_id = safe_run_id(run_id or datetime.now(timezone.utc).strftime("run_%Y%m%dT%H%M%S_")
                         + uuid.uuid4().hex[:6])
    started_at = datetime.now(timezone.utc)
    t0 = time.monotonic()
    lock = pipeline_lock(cfg)
    lock.acquire(run_id)
    try:
        stats = EnrichStats()
        passes = Passes()
        label: str | None = None  # the summary's engine when no engine was started
        source_ready: Callable[[], None] = lambda: None  # noqa: E731
        try:
            claim_checkpoint(cfg.checkpoint_path, cfg.name, "enrich", cfg.file)  # another's: exit 3
            run_started = rejoin.run_started(cfg, started_at)  # an unfinished run's, if any
            # nothing to do (no new fact, no re-join pass due): no Spark
            fast = None if spark is not None or reprocess else _no_op_engine(cfg, run_started)
            if fast is not None:
                engine, progress, snapshot = fast, [], EnrichStats()
                if cfg.engine != "deltalake":  # delta-rs read the state; no table was written
                    label = f"{cfg.engine} (not started: nothing new)"
            else:
                spark = spark or build_session(cfg, app_name=f"enrich-{cfg.name}")
                check_file_name_encoding(spark, cfg)  # a JVM without a UTF-8 locale: exit 2
                source_ready = prefetch_source(spark, cfg)  # overlaps the checks below
                engine = select_engine(spark, cfg.engine)
                preflight(spark, cfg, engine)  # YAML vs the tables' schemas / Spark SQL: exit 2
                if cfg.fact.kind == "change_feed" and not engine.exists(str(cfg.fact.change_feed)):
                    raise FactTableMissing(
                        f"pipeline {cfg.name}: the fact table {cfg.fact.change_feed} (fact.change_feed "
                        f"in {cfg.file}) does not exist (yet): run the pipeline that writes it first "
                        "(its first run creates it), or correct the path. Nothing was read or written"
                        + (", nothing reset" if reprocess else ""))
                if reprocess:
                    reset(cfg)  # what the rebuild reads must all be there first (exit 3, nothing reset)
                elif (cfg.checkpoint_path / REPROCESS_MARK).is_file():
                    raise EnrichNeedsReprocess(
                        f"pipeline {cfg.name}: an earlier --reprocess did not finish; run it again: "
                        f"{_recovery(cfg)}")
                else:
                    check_definitions(cfg)  # aggregate new or changed: exit 2
                    check_tables(cfg)       # own tables lost commits / deleted: exit 3
                    check_dimensions_present(cfg)  # a dimension batches read is gone: exit 3
                snapshot = EnrichStats()  # the --reprocess snapshot batch, reported on its own
                if reprocess:
                    bootstrap(spark, cfg, engine, run_id, snapshot)
                source_ready()
                progress = _run_stream(spark, cfg, engine, run_id, stats, batch_hook,
                                       started_at=run_started, passes=passes)
            rejoin.run_finished(cfg)
        except Exception as e:
            source_ready()  # no Py4J call of the background registration outlives the run
            record_failure(cfg.runs_path, cfg.name, {
                "pipeline": cfg.name, "run_id": run_id, "status": "failed", "kind": "enrich",
                "error": f"{type(e).__name__}: {str(e)[:2000]}",
                "started_at": started_at.isoformat(timespec="seconds"),
                "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
            raise
        summary = _summary(cfg, engine, run_id, started_at, time.monotonic() - t0, stats,
                           progress, reprocess, snapshot, passes, engine_label=label)
        record_summary(cfg.runs_path, cfg.name, summary)
    finally:
        lock.release()
    return summary


def _run_stream(spark: SparkSession, cfg: EnrichConfig, engine: Engine, run_id: str,
                stats: EnrichStats, hook: Callable[[int], None] | None, *,
                started_at: datetime | None = None,
                passes: Passes | None = None) -> list[dict[str, Any]]:
    for f in remove_unfinished_writes(cfg.checkpoint_path):
        print(f"[enrich] removed {f}: left by a checkpoint log write a killed run never finished, "
              "or the checksum of a log file that was deleted", flush=True)
    # every Spark log file readable, metadata and the events' file-source log complete (exit 3);
    # a missing source log entry made a run skip new event files silently (tester)
    validate_checkpoint(cfg.checkpoint_path, recovery=_recovery(cfg))
    instance = _instance(cfg)
    passes = passes or Passes()
    # a re-join pass a crash interrupted: finished first (a stream batch planned on its
    # half-written tables would release its facts a second time)
    if (n := rejoin.interrupted(cfg, engine, instance)) is not None:
        print(f"[enrich] re-join pass {n} was interrupted: finishing it before the stream", flush=True)
        passes.run(cfg, engine, instance, run_id, n)
        passes.resumed.append(n)
    writer = EnrichBatch(cfg, engine, instance=instance, run_id=run_id, stats=stats, hook=hook)
    errors: list[BaseException] = []
    guard = _delta_spark_guard(cfg, engine)
    driver_read = _driver_read(cfg, engine, stats)

    def handler(df: DataFrame, batch_id: int) -> None:
        try:
            if _empty_first_batch(cfg, engine, batch_id):
                print(f"[enrich] batch {batch_id}: no fact change (Spark plans a first batch "
                      "at the start offset); nothing to do", flush=True)
                return
            if guard is not None:
                df = guard(df)
            if driver_read is not None:
                df = driver_read(df, batch_id)
            writer(df, batch_id)
        except BaseException as e:  # keep the Python error: Spark wraps it in a Java one
            errors.append(e)
            raise

    try:
        source = fact_stream(spark, cfg, engine, _recovery(cfg))  # may raise ChangeFeedUnavailable at once
        ws = (source.writeStream.queryName(f"enrich_{cfg.name}_{uuid.uuid4().hex[:6]}")
              .foreachBatch(batch_handler(handler))
              .option("checkpointLocation", str(cfg.checkpoint_path)))
        ws = ws.trigger(availableNow=True) if cfg.trigger == "available_now" else ws.trigger(once=True)
        # an events batch's files listed on the driver, not by a Spark job of one task per file
        # (set for the query's life, as the CDC job does)
        listing = (driver_listing_conf([str(cfg.fact.events.path)]) if cfg.fact.events is not None
                   else {})
        with session_settings(spark, listing):
            query = start_without_no_data_batches(spark, ws)  # (no batch without facts)
            query.awaitTermination()
    except Exception as e:
        overflow = agg_mod.overflow_in(cfg, errors[0] if errors else e)
        if overflow is not None:
            raise overflow from None
        if errors:
            if cfg.fact.kind == "change_feed":
                _raise_unavailable(cfg, errors[0])
            raise errors[0] from None
        if cfg.fact.kind == "change_feed":
            _raise_unavailable(cfg, e)
        raise
    progress = [json.loads(p.json) for p in query.recentProgress]
    # parked / unknown facts whose fate may have changed without a fact change (a member
    # arrived, a wait ran out): one pass now instead of waiting for the next fact change
    # facts parked by this run's batches (a replayed one's too) have not waited since
    parked_by_run = min(t for t in (started_at or datetime.now(timezone.utc), stats.planned_from) if t)
    reason = rejoin.due(cfg, engine, parked_by_run)
    if reason is not None:
        n = rejoin.next_pass(cfg, engine, instance)
        print(f"[enrich] re-join pass {n}: {reason}", flush=True)
        passes.reason = reason
        passes.run(cfg, engine, instance, run_id, n)
        passes.ran.append(n)
    return progress


def _empty_first_batch(cfg: EnrichConfig, engine: Engine, batch_id: int) -> bool:
    """Spark runs a stream's batch 0 even when its end offset is the source's initial offset
    (no committed offset to compare with): after a ``--reprocess`` snapshot with nothing newer
    in the change feed, that batch holds no fact change. Running it would re-join (and, after
    ``late_members.wait``, release) pending facts although nothing new arrived: a run with
    nothing new changes nothing. deltalake change feed only (its offsets are read here)."""
    if batch_id != 0 or cfg.fact.kind != "change_feed" or engine.name != "deltalake":
        return False
    from cdc_lake.checkpoint_log import batch_source_offsets

    span = batch_source_offsets(cfg.checkpoint_path, 0)
    if span is None or not isinstance(span[1], dict):
        return False
    first = start_version(cfg) or 0
    return span[1].get("version") == first - 1


def _delta_spark_guard(cfg: EnrichConfig, engine: Engine) -> Callable[[DataFrame], DataFrame] | None:
    """delta-spark's change feed reads an upstream overwrite as deletes + inserts instead of
    refusing it (the deltalake source refuses it itself): apply the same rule to each
    micro-batch's version range before anything is written, and drop the rows of the rewrites
    that changed no row (a type widening, tagged ``cdc_lake.same_rows``; the deltalake source
    skips them): read as deletes + inserts they would re-enrich every fact with today's
    dimension versions. Runs with the delta-spark engine only (no Delta jars here; the rule is
    tested on real Spark frames in ``tests/test_change_feed_source.py``)."""
    if cfg.fact.kind != "change_feed" or engine.name != "delta-spark":
        return None
    return same_rows_guard(str(cfg.fact.change_feed), _recovery(cfg))


def same_rows_guard(path: str, recovery: str) -> Callable[[DataFrame], DataFrame]:
    """``guard(df)``: ``df`` (a micro-batch of delta-spark's change feed of ``path``) without
    the rows of same-rows rewrites; raises :class:`ChangeFeedUnavailable` as the deltalake
    source would for its version range."""
    from cdc_lake.sources.change_feed import check_versions

    def guard(df: DataFrame) -> DataFrame:
        lo, hi = df.agg(F.min("_commit_version"), F.max("_commit_version")).first()  # type: ignore[misc]
        if lo is None:
            return df
        skip = check_versions(path, int(lo), int(hi), recovery=recovery)
        return df.where(~F.col("_commit_version").isin(skip)) if skip else df
    return guard


def _driver_read(cfg: EnrichConfig, engine: Engine,
                 stats: EnrichStats) -> Callable[[DataFrame, int], DataFrame] | None:
    """deltalake change feed: a micro-batch up to ``DRIVER_READ_MAX_ROWS`` is read by delta-rs
    in the driver from the offsets Spark logged for it (no Python worker processes, about a
    second less per small run); the stream's own DataFrame is the fallback (bigger batches,
    offsets not readable). Same checks, same rows: see ``read_batch_on_driver``."""
    if cfg.fact.kind != "change_feed" or engine.name != "deltalake":
        return None
    from cdc_lake.checkpoint_log import batch_source_offsets
    from cdc_lake.sources import change_feed

    starting_version = start_version(cfg)

    def read(df: DataFrame, batch_id: int) -> DataFrame:
        span = batch_source_offsets(cfg.checkpoint_path, batch_id)
        if span is None:
            return df
        got = change_feed.read_batch_on_driver(
            engine.spark, str(cfg.fact.change_feed), df.schema, *span,
            starting_version=starting_version, recovery=_recovery(cfg),
            max_rows=change_feed.DRIVER_READ_MAX_ROWS, max_bytes=change_feed.DRIVER_READ_MAX_BYTES)
        if got is None:
            return df
        stats.driver_read_batches += 1
        return got
    return read


def _raise_unavailable(cfg: EnrichConfig, e: BaseException) -> None:
    from cdc_lake.sources.errors import ChangeFeedUnavailable

    cfu = ChangeFeedUnavailable.find_in(e)
    if cfu is not None and cfu.recovery.startswith("put the file back"):  # the upstream table
        raise PipelineStateError(  # lost a file: NEEDS RECOVERY (repair it before a --reprocess)
            f"pipeline {cfg.name}: the change feed of table {cfu.table} is unavailable for "
            f"versions {cfu.from_version}..{cfu.to_version}: {cfu.reason}. Nothing was written "
            f"for those versions. Recovery: {cfu.recovery}") from None
    if cfu is not None:
        raise EnrichNeedsReprocess(
            f"pipeline {cfg.name}: the change feed of table {cfu.table} is unavailable for "
            f"versions {cfu.from_version}..{cfu.to_version}: {cfu.reason}. Nothing was written "
            f"for those versions. Recover with: {_recovery(cfg)} (resets this pipeline's "
            "checkpoint and outputs and rebuilds them from the current upstream snapshot)") from None


def _summary(cfg: EnrichConfig, engine: Engine, run_id: str, started_at: datetime, duration: float,
             stats: EnrichStats, progress: list[dict[str, Any]], reprocess: bool,
             snapshot: EnrichStats | None = None, passes: Passes | None = None, *,
             engine_label: str | None = None) -> dict[str, Any]:
    """Counts and ``batches``/``batch_ids`` are the stream's micro-batches of this run; the
    ``--reprocess`` snapshot batch (its own checkpoint, id 0 like the stream's first) is
    ``reprocess_snapshot`` (None otherwise)."""
    snap = None if not reprocess or snapshot is None else {
        k: getattr(snapshot, k) for k in ("facts_read", "enriched_upserted", "parked", "released",
                                          "released_unknown", "quarantined")}
    # every late event once: the ones Spark's dedup dropped (its numRowsDroppedByWatermark) are
    # read again by the batch and counted there with the others (normalize.latest_per_key)
    dropped = stats.dropped_late
    rejoined = passes.summary() if passes is not None else None
    dims = (dict(passes.stats.dimension_versions) if rejoined and passes is not None and passes.ran
            else dict(stats.dimension_versions)) or {d.name: engine.version(str(d.table))
                                                     for d in cfg.dimensions}
    extra = passes.stats if passes is not None else EnrichStats()
    tables = {name: engine.version(str(path)) for name, path in cfg.output_tables.items()}
    batch_ids = sorted(set(stats.batch_ids))
    return {
        "pipeline": cfg.name, "run_id": run_id, "status": "succeeded", "kind": "enrich",
        "engine": engine_label or engine.name, "trigger": cfg.trigger, "reprocess": reprocess,
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(duration, 3),
        "batches": len(batch_ids), "batch_ids": batch_ids,
        "facts_read": stats.facts_read, "enriched_upserted": stats.enriched_upserted,
        "enriched_deleted": stats.enriched_deleted, "parked": stats.parked,
        "released": stats.released, "released_unknown": stats.released_unknown,
        "restated": stats.restated,
        "pending_rows": engine.count(str(cfg.outputs.pending)),
        "aggregate_rows_touched": stats.aggregate_rows_touched,
        "dropped_by_watermark": dropped, "quarantined": stats.quarantined,
        "dimension_versions": dims, "tables": tables,
        # (with the re-join passes': the operator announces every output after a replay)
        "skipped_writes": stats.skipped_writes + extra.skipped_writes,
        "replayed_batches": stats.replayed_batches + extra.replayed_batches,
        "driver_read_batches": stats.driver_read_batches,
        "batch_seconds": stats.batch_seconds, "checkpoint": str(cfg.checkpoint_path),
        "reprocess_snapshot": snap and {**snap, "seconds": sum(snapshot.batch_seconds)},  # type: ignore[union-attr]
        "rejoin": rejoined,
    }
