"""One dimension refresh run: apply the snapshot of one date to the dimension Delta table.

Steps, all under the pipeline lock (``<state>/cdc.lock`` or the ``lock:`` backend):

1. the last applied date = the table's Delta transaction version of app id
   ``dimension-<pipeline>`` (the date as ``yyyymmdd``, committed with the data) or, if later,
   ``<state>/last_applied.json`` (covers a date whose snapshot changed nothing); an existing
   table marked by another writer, or unmarked with rows, is not this pipeline's (exit 3,
   :func:`check_owner`);
2. a date **older** than that changes nothing (status ``skipped_older_date``, exit 0): a
   backfill of old dates never rolls the dimension back; the **same** date again changes
   nothing (status ``already_applied``): a refresh is idempotent per date;
3. the snapshot file ``snapshots.path/pattern`` must exist (:class:`SnapshotMissing`, naming
   the expected path) and be a full snapshot (:class:`SnapshotInvalid`: NULL/duplicate keys, a
   table column missing, a column named like one the job maintains (``_snapshot_date``; SCD2
   ``_valid_from``/``_valid_to``/``_is_current``; any case), a value its column's type cannot
   hold exactly —
   :mod:`cdc_lake.dimensions.types`); all of this is checked before anything is written;
4. a table column whose type cannot hold the snapshot's values but has a lossless widening that
   can (``int -> double`` for ``1`` then ``1.5``) is widened first (one same-rows commit);
5. the diff against the table's current rows (:mod:`cdc_lake.dimensions.diff`) is written by
   **one** MERGE with ``Txn("dimension-<pipeline>", yyyymmdd)``; a re-run after a crash after
   that commit sees the date as applied.

Example::

    summary = run_refresh(load_pipeline("pipelines/product_categories.yaml"), date="2026-01-02")
    summary["status"], summary["inserted"], summary["delta_version"]
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdc_lake.dimensions.config import SCD1_META, SCD2_META, DimensionPipelineConfig, parse_date
from cdc_lake.dimensions.diff import SnapshotInvalid, check_snapshot, scd1_changes, scd2_changes
from cdc_lake.dimensions.snapshot import SnapshotMissing, malformed_csv, read_snapshot
from cdc_lake.dimensions.types import plan_types, quote
from cdc_lake.engines import Engine, Txn, select_engine
from cdc_lake.checkpoint import claim_checkpoint
from cdc_lake.locks import pipeline_lock
from cdc_lake.runids import safe_run_id
from cdc_lake.summary import record_failure, record_summary

__all__ = ["SnapshotInvalid", "SnapshotMissing", "last_applied", "run_refresh", "read_snapshot"]
STATE_FILE = "last_applied.json"


def date_version(date: str) -> int:
    """``'2026-01-02'`` -> ``20260102`` (the Delta transaction version of that date's refresh)."""
    return int(date.replace("-", ""))


def version_date(v: int | None) -> str | None:
    if v is None:
        return None
    s = f"{v:08d}"
    return f"{s[:4]}-{s[4:6]}-{s[6:]}"


def read_state(state: Path) -> dict[str, Any]:
    """The state file (``{}`` when there is none). One that exists but cannot be read stops the
    run (:class:`~cdc_lake.checkpoint.StateFileDamaged`, exit 3): read as "nothing applied", it
    let an older date roll the dimension back (tester)."""
    from cdc_lake.checkpoint import read_state_file
    from cdc_lake.paths import mv_aside

    f = state / STATE_FILE
    data = read_state_file(
        f, "the last date applied to the dimension table (a date that changed nothing is recorded "
           "only here), by which an older date never rolls the table back",
        f"restore it from a copy; or move it aside (`{mv_aside(f)}`) and re-run the newest "
        "date already applied: that run records it again", lambda d: True)
    return data or {}


def damaged_table(cfg: DimensionPipelineConfig, error_text: str) -> str | None:
    """After a failed run: why the dimension table cannot be read (a data file gone, a Delta
    log delta-rs cannot load) with the recovery, else None: exit 3 instead of exit 1 and a
    traceback retried for nothing (tester)."""
    from cdc_lake.paths import mv_aside
    from cdc_lake.table_marks import missing_data_files

    rebuild = (f"restore it from a copy if you have one; else rebuild it: move the table and the "
               f"state aside (`{mv_aside(cfg.table)}` and `{mv_aside(cfg.checkpoint_path / STATE_FILE)}`), "
               "then apply the snapshots again from the first date (SCD1: the newest date alone "
               "rebuilds it)")
    gone = [f for f in missing_data_files(error_text) if Path(cfg.table) in f.parents]
    if gone:
        return (f"pipeline {cfg.name}: the data file {gone[0]} of the dimension table {cfg.table} is "
                f"gone; its Delta log still references it. Recovery: put the file back, or {rebuild}")
    if not (Path(cfg.table) / "_delta_log").is_dir():
        return None
    from deltalake import DeltaTable

    try:
        DeltaTable(str(cfg.table))
    except OSError:
        return None
    except Exception as e:  # noqa: BLE001 - DeltaError and kin: the log is damaged
        first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        return (f"pipeline {cfg.name}: the Delta log of the dimension table {cfg.table} cannot be "
                f"read ({type(e).__name__}: {first}). Recovery: {rebuild}")
    return None


def check_table(engine: Engine, cfg: DimensionPipelineConfig, state: dict[str, Any]) -> None:
    """:class:`~cdc_lake.checkpoint_log.PipelineStateError` when the table is below the Delta
    version the last refresh left it at, or gone (tester: its newest commit removed, the date
    counted as applied: an empty dimension table, exit 0)."""
    from cdc_lake.checkpoint_log import PipelineStateError
    from cdc_lake.paths import mv_aside

    left = state.get("delta_version")
    if not isinstance(left, int) or isinstance(left, bool):
        return
    now = engine.version(str(cfg.table)) if engine.exists(str(cfg.table)) else None
    if now is not None and now >= left:
        return
    where = "is gone" if now is None else f"is at version {now}"
    raise PipelineStateError(
        f"pipeline {cfg.name}: the dimension table {cfg.table} {where}, but the refresh of "
        f"{state.get('date')} left it at version {left} ({cfg.checkpoint_path / STATE_FILE}): "
        "commits were lost. Recovery: put the removed _delta_log commits back from a copy; else "
        f"rebuild it: move the table and the state aside (`{mv_aside(cfg.table)}` and "
        f"`{mv_aside(cfg.checkpoint_path / STATE_FILE)}`), then apply the snapshots again from the "
        "first date (SCD1: the newest date alone rebuilds it; docs/dimensions.md, backfill)")


def check_owner(cfg: DimensionPipelineConfig, state: dict[str, Any]) -> None:
    """:class:`~cdc_lake.checkpoint_log.PipelineStateError` when the table exists and is not
    this pipeline's: marked by another writer (a CDC pipeline, another dimension pipeline: two
    YAMLs naming one ``table:``, run by hand), or unmarked with rows this pipeline never recorded
    (made by hand). Its diff would have made the other's table this snapshot, exit 0 (tester)."""
    from cdc_lake.checkpoint_log import PipelineStateError
    from cdc_lake.table_writers import describe_writers, foreign_writers, holds_rows

    table = Path(cfg.table)
    if not (table / "_delta_log").is_dir():
        return
    foreign, mine = foreign_writers(table, "dimension", cfg.name)
    if foreign:
        why = (f"belongs to {describe_writers(foreign)}"
               + (f" and was also written by this pipeline {cfg.name!r}: its rows are mixed"
                  if mine else ""))
    elif not mine and "delta_version" not in state and holds_rows(table):
        why = ("holds rows but carries no owner mark (no Delta transaction of a cdc-lake job) and "
               "no refresh of this pipeline is recorded: made by hand, by another tool, or "
               "copied without its log")
    else:
        return
    raise PipelineStateError(
        f"pipeline {cfg.name}: the dimension table {cfg.table} {why}; a refresh would make it this "
        f"pipeline's snapshot, so nothing was written. Recovery: give `table:` in {cfg.file} a "
        "path of its own")


def _write_state(state: Path, data: dict[str, Any]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    f = state / STATE_FILE
    tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, f)


def last_applied(engine: Engine, cfg: DimensionPipelineConfig) -> int | None:
    """Last applied date as ``yyyymmdd`` (Delta txn version or the state file, the later)."""
    txn = engine.txn_version(str(cfg.table), cfg.app_id) if engine.exists(str(cfg.table)) else None
    state = read_state(cfg.checkpoint_path).get("version")
    found = [v for v in (txn, state) if isinstance(v, int)]
    return max(found) if found else None


def _fix(cfg: DimensionPipelineConfig) -> str:
    return (f"If the export is wrong, fix the file and re-run this date. If the values are right, "
            f"give the column a type that holds them in `schema:` of {cfg.file} (e.g. string, "
            f"double or decimal(p,s)); a type the table's column cannot be widened to losslessly "
            f"needs a rebuild: delete {cfg.table} and {cfg.checkpoint_path}, then backfill from "
            "the first date")


def run_refresh(cfg: DimensionPipelineConfig, *, date: str, spark: SparkSession | None = None,
                run_id: str | None = None) -> dict[str, Any]:
    """Apply the snapshot of ``date`` (``YYYY-MM-DD``) and return the run summary.

    Raises:
        ConfigError: ``date`` is not a date.
        PipelineLocked: another run holds the pipeline lock.
        SnapshotMissing / SnapshotInvalid: see the module docstring.
    """
    parse_date(date)
    run_id = run_id or f"manual_{datetime.now(timezone.utc):%Y%m%dT%H%M%S}_{uuid.uuid4().hex[:6]}"
    started, t0 = datetime.now(timezone.utc), time.monotonic()
    if spark is None:
        from cdc_lake.spark_session import build_session

        spark = build_session(cfg, app_name=f"dimension-{cfg.name}")  # type: ignore[arg-type]
    from cdc_lake.spark_session import check_file_name_encoding

    check_file_name_encoding(spark, cfg)  # a JVM without a UTF-8 locale: exit 2
    engine = select_engine(spark, cfg.engine)
    summary: dict[str, Any] = {
        "pipeline": cfg.name, "kind": "dimension", "run_id": run_id, "status": "running",
        "date": date, "scd": cfg.scd, "engine": engine.name, "table": str(cfg.table),
        "snapshot_file": str(cfg.snapshot_file(date)), "snapshot_rows": None,
        "inserted": 0, "updated": 0, "deleted": 0, "closed": 0, "unchanged": 0,
        "skipped_writes": 0, "widened": {}, "started_at": started.isoformat(timespec="seconds"),
    }
    with pipeline_lock(cfg) as lock:
        lock.acquire(run_id)
        try:
            _refresh(spark, engine, cfg, date, run_id, summary, t0)
        except Exception as e:  # recorded like the other kinds' failures (docs tester: none)
            record_failure(cfg.runs_path, cfg.name, {
                **summary, "status": "failed", "error": f"{type(e).__name__}: {str(e)[:2000]}",
                "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "duration_s": round(time.monotonic() - t0, 2)})
            raise
    return summary


def _refresh(spark: SparkSession, engine: Engine, cfg: DimensionPipelineConfig, date: str,
             run_id: str, summary: dict[str, Any], t0: float) -> None:
    """The run under the pipeline lock: fills ``summary`` and records it."""
    claim_checkpoint(cfg.checkpoint_path, cfg.name, "dimension", cfg.file)  # another's: exit 3
    state = read_state(cfg.checkpoint_path)
    check_table(engine, cfg, state)
    check_owner(cfg, state)  # another pipeline's table (or a hand-made one): exit 3
    before = last_applied(engine, cfg)
    summary["last_applied_before"] = version_date(before)
    want = date_version(date)
    if before is not None and want < before:
        summary["status"] = "skipped_older_date"
        summary["message"] = (f"{date} is older than the last applied date "
                              f"{version_date(before)}: nothing changed (no rollback)")
    elif before == want:
        summary["status"] = "already_applied"
        summary["message"] = f"{date} was already applied: nothing changed (idempotent per date)"
        summary["skipped_writes"] = 1
        if not state:  # the state file was moved aside (its recovery): record the date again
            _write_state(cfg.checkpoint_path, {
                "date": date, "version": want, "run_id": safe_run_id(run_id),
                "delta_version": engine.version(str(cfg.table)) if engine.exists(str(cfg.table)) else None,
                "applied_at": datetime.now(timezone.utc).isoformat()})
    else:
        try:
            _apply(spark, engine, cfg, date, run_id, summary)
        except Exception as e:  # noqa: BLE001 - Spark's CSV parse failure: an invalid snapshot
            bad = malformed_csv(cfg, cfg.snapshot_file(date), e)
            if bad is None:
                raise
            raise bad from None
    after = last_applied(engine, cfg)
    summary["last_applied_date"] = version_date(after)
    summary["delta_version"] = engine.version(str(cfg.table))
    summary["tables"] = {"table": {"delta_version": summary["delta_version"],
                                   **{k: summary[k] for k in ("inserted", "updated", "deleted")}}}
    summary["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    summary["duration_s"] = round(time.monotonic() - t0, 2)
    record_summary(cfg.runs_path, cfg.name, summary)


def _check_deletes(cfg: DimensionPipelineConfig, counts: dict[str, int], where: str) -> None:
    """``snapshots.max_deleted_fraction``: refuse a snapshot that would delete more than that
    share of the table's current rows (a header-only or cut-off export deletes every row it
    lacks, exit 0: tester)."""
    limit = cfg.snapshots.max_deleted_fraction
    current = counts["updated"] + counts["deleted"] + counts["unchanged"]
    if limit is None or not current or counts["deleted"] / current <= limit:
        return
    raise SnapshotInvalid(
        f"{where}: the snapshot would delete {counts['deleted']} of the table's {current} current "
        f"row(s) ({100.0 * counts['deleted'] / current:.1f}%), more than "
        f"snapshots.max_deleted_fraction {limit:g} of {cfg.file} allows; nothing was written. A "
        "cut-off or partial export? Land the complete file and re-run this date; if the rows "
        "are really gone, raise the limit for this run")


def _apply(spark: SparkSession, engine: Engine, cfg: DimensionPipelineConfig, date: str,
           run_id: str, summary: dict[str, Any]) -> None:
    path, where = str(cfg.table), str(cfg.snapshot_file(date))
    stored = engine.schema(path) if engine.exists(path) else None
    snap = read_snapshot(spark, cfg, date, stored)
    summary["snapshot_rows"] = check_snapshot(snap, cfg.keys, where)
    meta = SCD1_META if cfg.scd == 1 else SCD2_META
    # every check before the first write: a refused snapshot leaves the table as it was
    plan, snap = plan_types(snap, stored, meta=meta, where=where, fix=_fix(cfg))
    table = engine.read(path)
    if plan.widen and table is not None:  # diffed as widened; the widening commit comes after
        table = table.select(*[F.col(quote(c)).cast(plan.widen[c]).alias(c) if c in plan.widen
                               else F.col(quote(c)) for c in table.columns])
    build = scd1_changes if cfg.scd == 1 else scd2_changes
    changes = build(snap, table, cfg.keys, date, where)  # counted (one Spark job, cached)
    try:
        # the delete limit before any commit: a refused snapshot had widened the table already
        # although its message said nothing was written (tester K)
        _check_deletes(cfg, changes.counts, where)
        if plan.widen:
            print(f"[dimension] widening {path}: " + ", ".join(
                f"{c} {t}" for c, t in plan.describe().items()) + " (lossless; one same-rows "
                "commit)", flush=True)
            engine.widen(path, plan.widen)
            summary["widened"] = plan.describe()
        summary.update(changes.counts)
        txn = Txn(cfg.app_id, date_version(date))
        if not engine.exists(path):  # an empty first snapshot still makes the table
            # every column nullable: a later snapshot may have NULLs anywhere, and delta-rs
            # MERGE validates NOT NULL columns of rows it only copies (timestamps among them)
            engine.create(path, StructType([StructField(f.name, f.dataType, True)
                                            for f in changes.source.schema.fields]))
        if sum(v for k, v in changes.counts.items() if k != "unchanged"):
            result = engine.merge(path, changes.source, changes.spec, txn=txn)
            summary["skipped_writes"] = int(result.skipped)
    finally:
        changes.release()
    _write_state(cfg.checkpoint_path, {"date": date, "version": date_version(date),
                                       "run_id": safe_run_id(run_id),
                                       "delta_version": engine.version(path),
                                       "applied_at": datetime.now(timezone.utc).isoformat()})
    summary["status"] = "succeeded"
