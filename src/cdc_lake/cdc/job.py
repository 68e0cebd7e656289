"""One pipeline run: lock the checkpoint, stream what is new (availableNow/once), summarize.

Example::

    cfg = load_pipeline("pipelines/shop_maxwell.yaml")
    summary = run_pipeline(cfg, run_id="manual_1")
    summary["tables"]["orders"]["inserted"]

A full refresh (``full_refresh=True``, optionally for a table subset) rebuilds the chosen
tables from the whole landing history with a fresh, throw-away checkpoint into staging tables,
then replaces each target in one Delta commit: readers see the old table until then. The main
checkpoint is untouched; the next incremental run re-applies files the refresh already saw,
which changes nothing because every write is ordered by binlog sequence.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_lake.cdc.batch_writer import BatchWriter, RunStats, TableStats, Targets
from cdc_lake.cdc.definitions import check_definitions, record_definitions
from cdc_lake.cdc.owners import check_owners
from cdc_lake.cdc.state import app_id as pipeline_app_id, check_state
from cdc_lake.cdc.table_records import record_tables, record_versions
from cdc_lake.cdc.backlog import (LandedFileChanged, backlog, check_history_complete,
                                  check_landed_files_unchanged, check_landing_names, nothing_new)
from cdc_lake.checkpoint_log import PipelineStateError
from cdc_lake.checkpoint import claim_checkpoint, written_tables
from cdc_lake.cdc.config import PipelineConfig
from cdc_lake.config import FILE_SOURCE_MAX_AGE, ConfigError
from cdc_lake.launch import class_archive, codegen_mode, driver_jit
from cdc_lake.engines import DeltaRsEngine, Engine, select_engine
from cdc_lake.engines.base import Txn
from cdc_lake.cdc.formats import parser_for
from cdc_lake.locks import pipeline_lock
from cdc_lake.quarantine_limits import enforce as enforce_quarantine_limits
from cdc_lake.runids import safe_run_id
from cdc_lake.sources.landing_files import driver_listing_conf, rerun_command
from cdc_lake.sources.landing_history import history_pattern
from cdc_lake.spark_session import (batch_handler, build_session, check_file_name_encoding,
                                    driver_java_options, session_settings)
from cdc_lake.summary import SUMMARY_PREFIX, record_failure, record_summary

__all__ = ["SUMMARY_PREFIX", "nothing_new", "read_events", "run_pipeline"]
MAX_FILE_AGE = FILE_SOURCE_MAX_AGE  # (see cdc_lake.config)


# A blank line (empty, or only whitespace: space, tab, form feed, vertical tab; Hadoop splits at
# \r and \n) is skipped, not quarantined as malformed JSON. Spark's ``trim`` strips spaces only,
# so "\t" used to be quarantined. Java's ``\S`` is any character but [ \t\n\x0B\f\r] and
# ``rlike`` is ``find()``: the scan stops at the first one (a JSON line's first, ``{``).
# Unicode spaces (U+00A0, U+2028...) are not JSON whitespace: such a line is quarantined.
NOT_BLANK = r"\S"


def read_events(spark: SparkSession, cfg: PipelineConfig, max_files: int | None, *,
                history: bool = False) -> DataFrame:
    """The landing folder as a bounded file stream of normalized change events.

    With ``source.archive_dir`` the pipeline's own stream archives the files of each committed
    micro-batch (Spark's ``cleanSource=archive``; Spark moves them when it plans the next batch,
    so the last batch's files wait for the next run with new files), and ``history=True`` (a
    full refresh: its own throw-away checkpoint, nothing moved) reads the archived files and the
    landing folder together."""
    reader = (spark.readStream.format("text")
              .option("maxFilesPerTrigger", str(max_files or cfg.max_files_per_trigger))
              .option("maxFileAge", MAX_FILE_AGE))
    if cfg.max_bytes_per_trigger:
        reader = reader.option("maxBytesPerTrigger", str(cfg.max_bytes_per_trigger))
    if cfg.file_glob:
        reader = reader.option("pathGlobFilter", cfg.file_glob)
    path = str(cfg.landing_path)
    if cfg.archive_path is not None:
        if history:
            path = history_pattern(cfg.landing_path, cfg.archive_path)
        else:
            reader = (reader.option("cleanSource", "archive")
                      .option("sourceArchiveDir", str(cfg.archive_path)))
    lines = (reader.load(path)
             .select(F.col("value").alias("_line"), F.col("_metadata.file_path").alias("_file"))
             .where(F.col("_line").rlike(NOT_BLANK)))
    return parser_for(cfg.source_format)(lines)


def _start(events: DataFrame, writer: BatchWriter, checkpoint: Path, trigger: str,
           name: str):  # type: ignore[no-untyped-def]
    ws = events.writeStream.queryName(name).foreachBatch(batch_handler(writer)).option(
        "checkpointLocation", str(checkpoint))
    ws = ws.trigger(availableNow=True) if trigger == "available_now" else ws.trigger(once=True)
    return ws.start()


def _validate_request(cfg: PipelineConfig, tables: Sequence[str] | None, full_refresh: bool) -> set[str]:
    chosen = list(tables or [])
    unknown = [t for t in chosen if t not in cfg.tables]
    if unknown:
        raise ConfigError(cfg.file, "tables", f"unknown table(s) {unknown!r}; configured: "
                          f"{sorted(cfg.tables)}")
    if chosen and not full_refresh and set(chosen) != set(cfg.tables):
        raise ConfigError(cfg.file, "tables", "a table subset only applies to a full refresh: "
                          "incremental runs share one checkpoint, so they always process every "
                          "table (otherwise the others would miss those files)")
    if not cfg.landing_path.is_dir():
        raise ConfigError(cfg.file, "source.path",
                          f"landing folder {str(cfg.landing_path)!r} does not exist")
    return set(chosen) if chosen else set(cfg.tables)


def run_pipeline(cfg: PipelineConfig, *, spark: SparkSession | None = None, run_id: str | None = None,
                 tables: Sequence[str] | None = None, max_files_per_trigger: int | None = None,
                 full_refresh: bool = False) -> dict[str, Any]:
    """Process everything new in the landing folder, then stop. Returns the run summary.

    Raises:
        ConfigError: bad request (unknown table, missing landing folder).
        PipelineLocked: another run holds this pipeline's checkpoint.
        PipelineStateError: a damaged checkpoint file or a table deleted behind the checkpoint.
        QuarantineThresholdExceeded: the run quarantined more than ``quarantine:`` allows (what
            it wrote is kept; ``.summary`` is the recorded summary).
    """
    selected = _validate_request(cfg, tables, full_refresh)
    run_id = safe_run_id(run_id or datetime.now(timezone.utc).strftime("run_%Y%m%dT%H%M%S_")
                         + uuid.uuid4().hex[:6])
    started_at = datetime.now(timezone.utc)
    t0 = time.monotonic()
    lock = pipeline_lock(cfg)
    lock.acquire(run_id)  # before Spark starts: a losing run fails in milliseconds
    try:  # the summary is recorded while the lock is held: no later run can record first
        try:
            engine, stats, progress = _process(cfg, spark, run_id, selected, full_refresh,
                                               max_files_per_trigger, t0)
        except Exception as e:
            if not full_refresh and not isinstance(e, PipelineStateError):
                _best_effort(record_tables, cfg)  # tables a failed run created are ours too
            record_failure(cfg.runs_path, cfg.name, {
                "pipeline": cfg.name, "run_id": run_id, "status": "failed",
                "error": f"{type(e).__name__}: {str(e)[:2000]}",
                "started_at": started_at.isoformat(timespec="seconds"),
                "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "checkpoint": str(cfg.checkpoint_path)})
            raise
        summary = _summary(cfg, engine, run_id, started_at, time.monotonic() - t0, stats,
                           progress, full_refresh, selected)
        if not full_refresh:
            record_tables(cfg)
        record_versions(cfg, rebuilt=selected if full_refresh else frozenset())
        record_definitions(cfg, rebuilt=selected if full_refresh else frozenset(),
                           checked=not full_refresh)
        try:  # too much quarantined: the summary says failed_quarantine_threshold, then raise
            if not full_refresh:  # (a rebuild's left-out lines were judged by the runs that read them)
                enforce_quarantine_limits(cfg.quarantine_limits, summary, cfg.quarantine_path)
        finally:
            record_summary(cfg.runs_path, cfg.name, summary)
    finally:
        lock.release()
    return summary


def _process(cfg: PipelineConfig, spark: SparkSession | None, run_id: str, selected: set[str],
             full_refresh: bool, max_files_per_trigger: int | None,
             t0: float) -> tuple[Engine, RunStats, list[dict[str, Any]]]:
    """The run's work under the lock: fast no-op path, full refresh, or the incremental stream."""
    stats = RunStats()
    claim_checkpoint(cfg.checkpoint_path, cfg.name, "cdc", cfg.file,
                     recorded_elsewhere=lambda: _recorded_elsewhere(cfg))  # another's: exit 3
    if not full_refresh:  # a full refresh neither reads the main checkpoint nor needs the tables
        check_state(cfg)  # damaged checkpoint file / table deleted behind its back: stop, say how
        check_owners(cfg)  # a table another pipeline (or a hand) wrote: never merge into it
        check_definitions(cfg)  # a table's keys / scd / source changed in the YAML: exit 2
        check_landed_files_unchanged(cfg)  # appended to after it was read: never read again
    else:  # (the incremental path checks file names in check_landed_files_unchanged)
        check_owners(cfg, selected)  # never replace another pipeline's table
        check_landing_names(cfg)  # a ':' in a file name fails Hadoop's read of every file
        check_history_complete(cfg)  # archived/deleted landing files: the rebuild would lack them
        _warn_changed_files(cfg)
    fast_engine = None if full_refresh else _fast_path_engine(cfg, spark)
    if fast_engine is not None and nothing_new(cfg):
        # Nothing the file source would pick up: no Spark session, no query, no commit.
        if spark is None and cfg.engine != "deltalake":
            stats.engine_label = f"{cfg.engine} (not started: nothing new)"
        stats.startup_s = round(time.monotonic() - t0, 3)
        return fast_engine, stats, []
    if spark is None:
        pending = backlog(cfg, full_refresh=full_refresh)
        spark = build_session(cfg, backlog_bytes=pending.bytes if pending else None)
    check_file_name_encoding(spark, cfg)  # a JVM without a UTF-8 locale skips such files
    java_options = driver_java_options(spark)
    stats.driver_jit, stats.jvm_archive = driver_jit(java_options), class_archive(java_options)
    stats.codegen = codegen_mode(spark.conf.get)
    engine = select_engine(spark, cfg.engine)
    stats.startup_s = round(time.monotonic() - t0, 3)
    if full_refresh:
        return engine, stats, _full_refresh(spark, cfg, engine, run_id, selected, stats,
                                            max_files_per_trigger)
    app_id = pipeline_app_id(cfg)  # the id check_state compares the tables' transactions with
    writer = BatchWriter(cfg, engine, app_id=app_id, run_id=run_id, selected=selected,
                         targets=Targets(tables={n: t.path for n, t in cfg.tables.items()},
                                         tombstones={n: cfg.tombstone_path(n) for n in cfg.tables},
                                         write_side_tables=True),
                         stats=stats)
    return engine, stats, _run_stream(spark, cfg, writer, cfg.checkpoint_path,
                                      max_files_per_trigger)


def _warn_changed_files(cfg: PipelineConfig) -> None:
    """A full refresh rebuilds from the landing files as they are now: right for a file appended
    to after the stream read it, but a file cut short since has lost lines the tables held.
    The file source records times only, not sizes, so the two look alike: say which files."""
    try:
        check_landed_files_unchanged(cfg)
    except LandedFileChanged as e:
        print(f"[cdc] WARNING: this full refresh reads {len(e.files)} landing file(s) that changed "
              f"after the stream first read them ({', '.join(e.files[:5])}"
              f"{' ...' if len(e.files) > 5 else ''}): lines added since are included; lines "
              "removed since (a file cut short or replaced) are not in the rebuilt tables",
              file=sys.stderr, flush=True)
    except PipelineStateError:
        pass  # the checkpoint's own problems are not this run's business (it does not read it)


def _recorded_elsewhere(cfg: PipelineConfig) -> list[str]:
    """Tables of this pipeline's names that its checkpoint recorded at other paths (for
    :func:`~cdc_lake.checkpoint.claim_checkpoint`; an unreadable record: none, check_state
    reports it)."""
    try:
        recorded = written_tables(cfg.checkpoint_path)["tables"]
    except PipelineStateError:
        return []
    return [f"{name!r} at {old} (this pipeline: {cfg.tables[name].path})"
            for name, old in sorted(recorded.items())
            if name in cfg.tables and old != str(cfg.tables[name].path)]


def _fast_path_engine(cfg: PipelineConfig, spark: SparkSession | None) -> Engine | None:
    """The engine a no-op run would report, if it can be had without starting Spark."""
    if spark is not None and cfg.engine != "deltalake":  # the session exists: asking is cheap
        return select_engine(spark, cfg.engine)
    # No session: only table versions are read for the summary, and the Delta log format is the
    # protocol, so delta-rs reads them whichever engine wrote the tables.
    return DeltaRsEngine(spark)  # type: ignore[arg-type]


def _run_stream(spark: SparkSession, cfg: PipelineConfig, writer: BatchWriter, checkpoint: Path,
                max_files: int | None) -> list[dict[str, Any]]:
    events = read_events(spark, cfg, max_files, history=checkpoint != cfg.checkpoint_path)
    writer.checkpoint = checkpoint
    writer.rerun = rerun_command("cdc_ingest.py", cfg.file) + (
        "" if checkpoint == cfg.checkpoint_path else " --full-refresh" + (
            "" if writer.selected == set(cfg.tables) else f" --tables {','.join(sorted(writer.selected))}"))
    # A micro-batch names its files one by one; above 32 paths Spark lists them with a Spark job
    # of one task per file (~1 s for 40 local files; 3.5 s for 1,000). The landing folder is a
    # local folder: list on the driver (landing_files.driver_listing_conf), for the query's life.
    with session_settings(spark, driver_listing_conf([str(cfg.landing_path)])):
        query = _start(events, writer, checkpoint, cfg.trigger,
                       f"cdc_{cfg.name}_{uuid.uuid4().hex[:6]}")
        try:
            query.awaitTermination()
        except Exception:
            if writer.stop_error is not None:  # Spark wraps the batch's error in a Java one
                raise writer.stop_error from None
            raise
    if query.exception() is not None:  # awaitTermination raises already; keep the guard explicit
        raise RuntimeError(str(query.exception()))
    return [json.loads(p.json) for p in query.recentProgress]


def _full_refresh(spark: SparkSession, cfg: PipelineConfig, engine: Engine, run_id: str,
                  selected: set[str], stats: RunStats, max_files: int | None) -> list[dict[str, Any]]:
    # Only this pipeline's staging: pipelines may share one storage root (and run concurrently).
    staging_root = cfg.lake_root / "_staging" / cfg.name
    shutil.rmtree(staging_root, ignore_errors=True)  # leftovers of a refresh of ours that died
    work = staging_root / run_id
    checkpoint = work / "_checkpoint"
    targets = Targets(tables={n: work / "tables" / n for n in selected},
                      tombstones={n: work / "tombstones" / n for n in selected},
                      write_side_tables=False,
                      type_seeds={n: cfg.tables[n].path for n in selected})
    writer = BatchWriter(cfg, engine, app_id=f"cdc-{cfg.name}-refresh-{uuid.uuid4().hex[:12]}",
                         run_id=run_id, selected=selected, targets=targets, stats=stats)
    progress = _run_stream(spark, cfg, writer, checkpoint, max_files)
    for name in sorted(selected):
        for staged, final in ((targets.tables[name], cfg.tables[name].path),
                              (targets.tombstones[name], cfg.tombstone_path(name))):
            df = engine.read(str(staged))
            if df is None:  # no events at all for this table: an empty table is the truth
                current = engine.read(str(final))
                if current is None:
                    continue  # never existed and nothing to build: nothing to replace
                df = current.limit(0)  # same schema, no rows: still one atomic swap commit
            result = engine.replace(str(final), df, txn=Txn(writer.app_id, 0))  # the owner mark
            if final == cfg.tables[name].path:
                stats.tables.setdefault(name, TableStats()).delta_version = result.version
    shutil.rmtree(staging_root, ignore_errors=True)
    try:
        staging_root.parent.rmdir()  # `_staging` itself only if no other pipeline uses it
    except OSError:
        pass
    return progress


def _summary(cfg: PipelineConfig, engine: Engine, run_id: str, started_at: datetime, duration: float,
             stats: RunStats, progress: list[dict[str, Any]], full_refresh: bool,
             selected: set[str]) -> dict[str, Any]:
    tables = {}
    for name in sorted(selected):
        st = stats.tables.get(name)
        version = st.delta_version if st and st.delta_version is not None else \
            _version_or_none(engine, cfg.tables[name].path)
        tables[name] = {"inserted": st.inserted if st else 0, "updated": st.updated if st else 0,
                        "deleted": st.deleted if st else 0, "delta_version": version,
                        "skipped_batches": st.skipped_batches if st else 0}
    batch_ids = sorted(set(stats.batch_ids))
    return {
        "pipeline": cfg.name, "run_id": run_id, "status": "succeeded",
        "engine": stats.engine_label or engine.name,
        "trigger": cfg.trigger, "full_refresh": full_refresh,
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(duration, 3),
        "spark_startup_s": stats.startup_s,
        "driver_jit": stats.driver_jit,  # "C1" / "C1+C2" (launch.launch_conf); None: Spark not started
        "jvm_archive": stats.jvm_archive,  # class-data-sharing archive (cdc_lake.jvm_archive) or None
        "codegen": stats.codegen,  # "interpreted" / "generated" (launch.codegen_conf); None: no Spark
        "stream_s": round(duration - stats.startup_s, 3),
        "batches": len(batch_ids), "batch_ids": batch_ids,
        "last_batch_id": batch_ids[-1] if batch_ids else None,
        "events_read": stats.events,
        "row_changes": stats.rows,
        "quarantined": stats.quarantined, "ddl_events": stats.ddl_events,
        # a full refresh: "quarantined" counts the lines it left out, this those of them it
        # added to the quarantine (the others are there from the runs that first read them)
        **({"newly_quarantined": stats.newly_quarantined} if full_refresh else {}),
        "skipped_lines": stats.skipped_lines, "ignored": stats.ignored,
        "tables": tables,
        "quarantine_version": stats.quarantine_version if stats.quarantine_version is not None
        else _version_or_none(engine, cfg.quarantine_path),
        "ddl_log_version": stats.ddl_log_version if stats.ddl_log_version is not None
        else _version_or_none(engine, cfg.ddl_log_path),
        "batch_seconds": stats.batch_seconds,
        # StreamingQueryProgress: planning + execution time of each micro-batch as Spark saw it.
        "progress": [{"batch_id": p.get("batchId"),
                      "trigger_ms": p.get("durationMs", {}).get("triggerExecution"),
                      "latest_offset_ms": p.get("durationMs", {}).get("latestOffset")}
                     for p in progress],
        "checkpoint": str(cfg.checkpoint_path),
    }


def _version_or_none(engine: Engine, path: Path) -> int | None:
    """A table's version for the summary; a table this engine cannot read reports None."""
    try:
        return engine.version(str(path))
    except Exception:  # noqa: BLE001 - the summary must not fail a run that succeeded
        return None


def _best_effort(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - never hide the run's own error behind this one
        pass
