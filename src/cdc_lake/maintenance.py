"""Table maintenance for a pipeline: compaction, Delta checkpoint + log cleanup, VACUUM.

Incremental runs leave small files (one or more per MERGE) and one Delta log entry per commit;
without maintenance every read of a table lists and opens more of them as history grows. The
maintenance DAG of a pipeline (``<pipeline>__maintenance``, schedule ``maintenance.schedule``)
runs this module, which does, for every Delta table the pipeline writes (CDC: targets,
tombstones, quarantine, DDL log; enrichment: its outputs; dimension: its table)::

    compact      delta-rs OPTIMIZE (bin-packing small files into ~target_file_mb files); a
                 rewrite with ``dataChange=false``: change-feed readers see no changes from it
    checkpoint   a Delta checkpoint at the current version + expired log cleanup
                 (``delta.logRetentionDuration``, default 30 days), held back for lagging
                 readers (below)
    vacuum       delete files no version inside the retention window references, and the
                 change-data files (``_change_data/``) older than that window, which
                 delta-rs's VACUUM leaves behind

and reports what it reclaimed (files and bytes before/after, files removed by VACUUM).

**Lagging readers.** VACUUM must not remove files a downstream reader still needs: an enrichment
pipeline reading this table's change feed from its checkpoint at version *v* needs the change
files of versions *v+1…*. The retention used for a table is therefore
``max(vacuum_retention_hours, age of the oldest commit some reader still has to read + 1 h)``,
where readers are the enrichment pipelines in the same pipelines folder whose fact or dimension
source is this table (read from their checkpoints' last committed offsets), and batches an
enrichment pipeline planned but has not committed (its replay reads the planned versions of its
dimensions and own tables: :func:`cdc_lake.retention.pinned_readers`). A YAML in the folder that
does not load could be such a reader: while one does not, VACUUM and log cleanup of every table
wait (reported as ``held_by_unloadable`` and a warning). The report names the reader that held
retention back.

The same readers hold back the **log cleanup**: a change-feed reader reads the ``_delta_log``
commits of the versions it has not read yet (and the commit of the last version it read, to see
that the table was not re-created). delta-rs cannot bound ``cleanup_metadata()`` by version, so
when a commit from the oldest such version on is already older than the table's log retention
(a reader paused for longer than ``delta.logRetentionDuration``), the cleanup of that table is
skipped (the checkpoint is still written) and the report says so and names the reader
(``log_cleanup``). Maintenance's own commits (OPTIMIZE, VACUUM) then run without delta-rs's
post-commit log cleanup.

**Damaged tables.** Before touching a table, maintenance checks it against the pipeline's record of
the versions its runs left (an unreadable record stops it: exit 3, nothing maintained), that
every data file of its snapshot is on disk, and that a table a run wrote still exists (each:
``status`` ``changed_behind`` / ``missing_file`` / ``missing_table``, exit 3, not maintained),
and that no other pipeline's owner mark is in its log (``owned_elsewhere``: two YAMLs naming one
table path, run by hand; the pipelines' shared quarantine and DDL log excepted).
Every table is maintained on its own: a table whose Delta log cannot be read
(a truncated or garbled ``_delta_log`` file) is reported by name and path with delta-rs's error
and the recovery the pipeline's own job prints for that state, and the other tables are still
maintained; a table that fails otherwise is reported with its error. The report is printed
either way; the CLI then exits **3** (a damaged table: an operator has to act, no retry helps)
or **1** (another failure: a retry may help).

The run takes the pipeline's lock, so it never races an ingest run (that run's lock wins; a
maintenance run that finds the lock held exits 75 and its Airflow task is skipped).

Example::

    python -m cdc_lake.maintenance --pipeline pipelines/shop_maxwell.yaml [--dry-run]
    # exit 0 ok, 1 a table failed, 2 config error, 3 a table's Delta log cannot be read, 75 locked
    report = run_maintenance(load_pipeline("pipelines/shop_maxwell.yaml"))
    report["tables"]["orders"]["files_before"], report["tables"]["orders"]["files_after"]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc_lake.pipeline_tables import (changed_behind_run, damaged_recovery, owned_elsewhere,
                                     pipeline_tables, recorded_marks)
from cdc_lake.retention import (expired_change_files, expired_log_versions, lagging_readers,
                                log_hold, log_retention_seconds, pinned_readers, remove_files,
                                vacuum_retention_hours)
from cdc_lake.table_marks import absent_snapshot_files, missing_data_files

if TYPE_CHECKING:  # deltalake is imported where tables are touched: config/DAG parsing stays light
    from deltalake import DeltaTable

MAINTENANCE_SUMMARY_PREFIX = "CDC_MAINTENANCE_SUMMARY "
EXIT_CONFIG, EXIT_LOCKED, EXIT_FAILED, EXIT_NEEDS_RECOVERY = 2, 75, 1, 3
NEEDS_RECOVERY = ("damaged", "changed_behind", "missing_file", "missing_table", "owned_elsewhere")


@dataclass(frozen=True)
class MaintenanceSettings:
    """``maintenance:`` of a pipeline YAML (all optional)."""

    schedule: str | None = "@daily"        # cron/preset of the maintenance DAG; None: manual only
    compact: bool = True
    target_file_mb: int = 128
    vacuum: bool = True
    vacuum_retention_hours: int = 168      # Delta default (7 days); 0 only if no reader can lag
    checkpoint: bool = True

    @classmethod
    def parse(cls, reader: Any) -> MaintenanceSettings:
        """From a ``cdc_lake.config.Reader`` positioned at ``maintenance``; errors name the key."""
        reader.check_known({"schedule", "compact", "target_file_mb", "vacuum",
                            "vacuum_retention_hours", "checkpoint"})
        schedule = reader.raw.get("schedule", "@daily")
        if schedule is not None and not isinstance(schedule, str):
            raise reader.fail("schedule", f"expected a cron string like '@daily' or null, got {schedule!r}")
        return cls(schedule=schedule,
                   compact=reader.bool("compact", True),
                   target_file_mb=reader.int("target_file_mb", default=128) or 128,
                   vacuum=reader.bool("vacuum", True),
                   vacuum_retention_hours=_int0(reader, "vacuum_retention_hours", 168),
                   checkpoint=reader.bool("checkpoint", True))


MAX_RETENTION_HOURS = 1_000_000  # ~114 years; delta-rs's VACUUM panics past ~2.5e12 hours


def _int0(reader: Any, name: str, default: int) -> int:
    v = reader.int(name, default=default, minimum=0)
    if v is not None and v > MAX_RETENTION_HOURS:
        raise reader.fail(name, f"expected at most {MAX_RETENTION_HOURS} hours, got {v!r}")
    return default if v is None else int(v)


def _files(dt: DeltaTable) -> tuple[int, int]:
    """(data files, bytes) of the current snapshot."""
    actions = dt.get_add_actions(flatten=True)
    table = actions.read_all() if hasattr(actions, "read_all") else actions
    sizes = table.column("size_bytes").to_pylist() if table.num_rows else []
    return len(sizes), int(sum(sizes))


def _gone_message(f: Path) -> str:
    return (f"its data file {f} is gone (deleted by hand, or by a VACUUM outside this "
            "pipeline's maintenance); its Delta log still references it")


def _load(path: Path) -> tuple[DeltaTable | None, str | None]:
    """``(the table, None)``, or ``(None, why delta-rs cannot load its log)``. Storage errors
    (OSError, maybe transient) are raised: the table then counts as failed, not as damaged."""
    from deltalake import DeltaTable

    try:
        return DeltaTable(str(path)), None
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - DeltaError (log JSON/parquet/protocol) and kin
        first = str(e).splitlines()[0][:300] if str(e) else ""
        return None, f"{type(e).__name__}: {first}"


def maintain_table(path: Path, settings: MaintenanceSettings, *, readers: list[tuple[str, int]] = (),
                   dry_run: bool = False) -> dict[str, Any]:
    """Compact, checkpoint and vacuum one table; returns the report for it (``status``: ``ok``,
    ``absent``, or ``damaged`` with ``error`` when its Delta log cannot be read)."""
    from deltalake import DeltaTable, PostCommitHookProperties

    if not DeltaTable.is_deltatable(str(path)):
        return {"path": str(path), "status": "absent"}
    t0 = time.monotonic()
    dt, problem = _load(path)
    if dt is None:
        return {"path": str(path), "status": "damaged", "error": problem}
    readers = list(readers)
    gone = absent_snapshot_files(dt.file_uris())
    if gone:  # noticed up front: compaction reads files only when a table has several (tester)
        return {"path": str(path), "status": "missing_file", "error": _gone_message(gone[0])}
    files_before, bytes_before = _files(dt)
    report: dict[str, Any] = {"path": str(path), "status": "ok", "version_before": dt.version(),
                              "files_before": files_before, "bytes_before": bytes_before}
    hold = log_hold(dt, readers)
    # a lagging reader: no log cleanup behind our back in the post-commit hooks of our own commits
    hooks = PostCommitHookProperties(cleanup_expired_logs=False) if hold is not None else None
    if settings.compact and not dry_run and files_before > 1:
        metrics = dt.optimize.compact(target_size=settings.target_file_mb * 1024 * 1024,
                                      post_commithook_properties=hooks)
        report["compacted"] = {"files_removed": metrics.get("numFilesRemoved", 0),
                               "files_added": metrics.get("numFilesAdded", 0)}
        dt = DeltaTable(str(path))
    if settings.checkpoint:
        cleanup: dict[str, Any] = {"held_back_by": None, "skipped": False}
        if hold is not None:
            keep_from, reader = hold
            retention_s = log_retention_seconds(dt)
            expired = expired_log_versions(path, keep_from, retention_s)
            cleanup.update(held_back_by=reader, keep_from_version=keep_from)
            if expired:
                cleanup.update(skipped=True, reason=(
                    f"reader {reader!r} still needs the commits from version {keep_from} on, and "
                    f"{len(expired)} of them (versions {expired[0]}..{expired[-1]}) are older than "
                    f"the log retention ({retention_s / 3600:g} h): "
                    + ("log cleanup would be skipped" if dry_run
                       else "log cleanup skipped, checkpoint written")))
        if not dry_run:
            dt.create_checkpoint()
            if not cleanup["skipped"]:
                dt.cleanup_metadata()
            report["checkpoint_version"] = dt.version()
        report["log_cleanup"] = cleanup
    if settings.vacuum:
        hours, held_by = vacuum_retention_hours(dt, settings.vacuum_retention_hours, readers)
        removed = _vacuum(dt, path, hours, dry_run, hooks)
        change = expired_change_files(path, hours, hold[0] if hold is not None else None)
        if not dry_run:
            remove_files(path, change)
        report["vacuum"] = {"retention_hours": hours, "held_back_by": held_by,
                            ("would_remove" if dry_run else "files_removed"): len(removed),
                            ("change_files_would_remove" if dry_run else "change_files_removed"):
                                len(change),
                            "change_bytes": sum(size for _, size in change)}
    dt = DeltaTable(str(path))
    report["files_after"], report["bytes_after"] = _files(dt)
    report["version_after"] = dt.version()
    report["seconds"] = round(time.monotonic() - t0, 3)
    return report


def _vacuum(dt: Any, path: Path, hours: int, dry_run: bool, hooks: Any) -> list[Path]:
    """The files VACUUM deletes (or would), counted on disk: delta-rs lists every file a
    tombstone past the retention names, also the ones an earlier VACUUM already deleted (an
    unchanged table reported files vacuumed on every maintenance run, each adding a VACUUM
    START/END commit pair). The real VACUUM runs only when there is a file to delete."""
    listed = dt.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False)
    if any("%" in x for x in listed):  # an escaped name (a partition value): not resolved here,
        if dry_run:                    # so delta-rs's own list and VACUUM, as before
            return [Path(x) for x in listed]
        return [Path(x) for x in dt.vacuum(retention_hours=hours, dry_run=False,
                                           enforce_retention_duration=False,
                                           post_commithook_properties=hooks)]
    present = [f for f in (Path(x) if x.startswith("/") else path / x for x in listed) if f.exists()]
    if present and not dry_run:
        dt.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False,
                  post_commithook_properties=hooks)
        return [f for f in present if not f.exists()]
    return present


def run_maintenance(cfg: Any, *, settings: MaintenanceSettings | None = None, dry_run: bool = False,
                    pipelines: list[Any] | None = None) -> dict[str, Any]:
    """Maintain every table of ``cfg`` under its pipeline lock; returns the report.

    ``pipelines``: the other pipelines (to find lagging change-feed readers); default: every
    valid YAML in the folder of ``cfg.file``. Each table is maintained on its own: one that is
    damaged (``status: damaged``, with ``error`` and ``recovery``) or fails (``status: failed``,
    ``error``) does not stop the others; ``report["failed"]`` lists them.
    """
    from cdc_lake.config import load_all
    from cdc_lake.locks import pipeline_lock

    settings = settings or getattr(cfg, "maintenance", None) or MaintenanceSettings()
    held: list[str] = []
    if pipelines is None:
        pipelines, errors = load_all(Path(cfg.file).parent)
        # A YAML that does not load may be a change-feed reader of these tables: which ones is
        # unknown, so it holds VACUUM and log cleanup of every table until it loads (tester: a
        # typo in an enrichment YAML dropped it from the readers; its history was vacuumed).
        held = sorted({f"{e.file} (does not load: {_first_line(str(e), 600)})" for e in errors
                       if Path(e.file).resolve() != Path(cfg.file).resolve()})
    if not any(Path(p.file).resolve() == Path(cfg.file).resolve() for p in pipelines
               if getattr(p, "file", None)):
        pipelines = [*pipelines, cfg]  # its own plans pin its own tables (enrichment)
    started = datetime.now(timezone.utc)
    lock = pipeline_lock(cfg)
    if not dry_run or cfg.checkpoint_path.is_dir():  # a dry run creates nothing (tester)
        lock.acquire(f"maintenance-{started:%Y%m%dT%H%M%S}")
    else:
        lock = None
    tables: dict[str, dict[str, Any]] = {}
    try:
        marks = recorded_marks(cfg)
        for name, path in sorted(pipeline_tables(cfg).items()):
            try:
                why = changed_behind_run(cfg, path, marks)
                other = None if why else owned_elsewhere(cfg, name, path)
                readers = [*lagging_readers(path, pipelines), *pinned_readers(path, pipelines),
                           *[(h, -1) for h in held]]
                t = ({"path": str(path), "status": "changed_behind", "error": why} if why
                     else {"path": str(path), "status": "owned_elsewhere", "error": other} if other
                     else maintain_table(path, settings, readers=readers, dry_run=dry_run))
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - one table's failure must not stop the
                first = str(e).splitlines()[0][:300] if str(e) else ""  # others (a delta-rs panic too)
                t = {"path": str(path), "status": "failed", "error": f"{type(e).__name__}: {first}"}
                gone = [f for f in missing_data_files(str(e)) if Path(path) in f.parents]
                if gone:  # a data file deleted behind the table: an operator must act (exit 3)
                    t.update(status="missing_file", error=_gone_message(gone[0]))
            if t["status"] == "absent" and str(path) in marks:  # a run wrote it; it is gone
                t.update(status="missing_table", error=(
                    f"the pipeline's runs wrote this table (last at version {marks[str(path)][0]}) "
                    "and it is gone: not a Delta table any more (its folder or _delta_log removed)"))
            if t["status"] in NEEDS_RECOVERY:
                t["recovery"] = damaged_recovery(cfg, name, path, t["status"])
            tables[name] = t
    finally:
        if lock is not None:
            lock.release()
    present = [t for t in tables.values() if t["status"] == "ok"]
    return {
        "pipeline": cfg.name, "dry_run": dry_run,
        "started_at": started.isoformat(timespec="seconds"),
        "tables": tables,
        "failed": sorted(n for n, t in tables.items() if t["status"] in (*NEEDS_RECOVERY, "failed")),
        "held_by_unloadable": held,
        "files_before": sum(t["files_before"] for t in present),
        "files_after": sum(t["files_after"] for t in present),
        "bytes_before": sum(t["bytes_before"] for t in present),
        "bytes_after": sum(t["bytes_after"] for t in present),
        "files_vacuumed": sum(t.get("vacuum", {}).get("files_removed", 0) for t in present),
        "change_files_vacuumed": sum(t.get("vacuum", {}).get("change_files_removed", 0)
                                     for t in present),
        # a dry run removes nothing; what a real run would (tester: its totals said 0)
        **({"files_would_vacuum": sum(t.get("vacuum", {}).get("would_remove", 0) for t in present),
            "change_files_would_vacuum": sum(t.get("vacuum", {}).get("change_files_would_remove", 0)
                                             for t in present)} if dry_run else {}),
    }


def _first_line(text: str, limit: int) -> str:
    line = (text.splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cdc_lake.maintenance", description=__doc__.splitlines()[0],
                                allow_abbrev=False)
    p.add_argument("--pipeline", required=True, help="pipeline YAML file")
    p.add_argument("--dry-run", action="store_true", help="report only: no compaction, no deletes")
    args = p.parse_args(argv)
    from cdc_lake.checkpoint import PipelineLocked
    from cdc_lake.checkpoint_log import PipelineStateError
    from cdc_lake.config import ConfigError, load_pipeline

    try:
        report = run_maintenance(load_pipeline(args.pipeline), dry_run=args.dry_run)
    except ConfigError as e:
        print(f"[maintenance] CONFIG ERROR: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except PipelineLocked as e:
        print(f"[maintenance] PIPELINE LOCKED: {e}", file=sys.stderr)
        return EXIT_LOCKED
    except PipelineStateError as e:  # its record of the tables' versions cannot be read
        print(f"[maintenance] NEEDS RECOVERY: nothing maintained: {e}", file=sys.stderr)
        return EXIT_NEEDS_RECOVERY
    from cdc_lake.maintenance_report import print_report

    return print_report(report)


if __name__ == "__main__":
    sys.exit(main())
