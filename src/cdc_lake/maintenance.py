"""Table maintenance for a pipeline: compaction, Delta checkpoint + log cleanup, VACUUM.

Incremental runs leave small files (one or more per MERGE) and one Delta log entry per commit;
without maintenance every read of a table lists and opens more of them as history grows. The
maintenance DAG of a pipeline (``<pipeline>__maintenance``, schedule ``maintenance.schedule``)
runs this module, which does, for every Delta table the pipeline writes (targets, tombstones,
quarantine, DDL log)::

    compact      delta-rs OPTIMIZE (bin-packing small files into ~target_file_mb files); a
                 rewrite with ``dataChange=false``: change-feed readers see no changes from it
    checkpoint   a Delta checkpoint at the current version + expired log cleanup
                 (``delta.logRetentionDuration``, default 30 days)
    vacuum       delete files no version inside the retention window references

and reports what it reclaimed (files and bytes before/after, files removed by VACUUM).

**Lagging readers.** VACUUM must not remove files a downstream reader still needs: an enrichment
pipeline reading this table's change feed from its checkpoint at version *v* needs the change
files of versions *v+1…*. The retention used for a table is therefore
``max(vacuum_retention_hours, age of the oldest commit some reader still has to read + 1 h)``,
where readers are the enrichment pipelines in the same pipelines folder whose fact or dimension
source is this table (read from their checkpoints' last committed offsets). The report names the
reader that held retention back.

The run takes the pipeline's lock, so it never races an ingest run (that run's lock wins; a
maintenance run that finds the lock held exits 75 and its Airflow task is skipped).

Example::

    python -m cdc_lake.maintenance --pipeline pipelines/shop_maxwell.yaml [--dry-run]
    report = run_maintenance(load_pipeline("pipelines/shop_maxwell.yaml"))
    report["tables"]["orders"]["files_before"], report["tables"]["orders"]["files_after"]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # deltalake is imported where tables are touched: config/DAG parsing stays light
    from deltalake import DeltaTable

MAINTENANCE_SUMMARY_PREFIX = "CDC_MAINTENANCE_SUMMARY "
EXIT_CONFIG, EXIT_LOCKED, EXIT_FAILED = 2, 75, 1


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


def _int0(reader: Any, name: str, default: int) -> int:
    v = reader.int(name, default=default, minimum=0)
    return default if v is None else int(v)


def pipeline_tables(cfg: Any) -> dict[str, Path]:
    """Every Delta table a pipeline writes, by a display name (kinds that do not know tables: {})."""
    if getattr(cfg, "kind", "cdc") == "cdc":
        out = {name: t.path for name, t in cfg.tables.items()}
        out.update({f"_tombstones/{name}": cfg.tombstone_path(name) for name in cfg.tables})
        out["_quarantine"] = cfg.quarantine_path
        out["_ddl_log"] = cfg.ddl_log_path
        return out
    tables = getattr(cfg, "output_tables", None)
    return dict(tables() if callable(tables) else (tables or {}))


def _files(dt: DeltaTable) -> tuple[int, int]:
    """(data files, bytes) of the current snapshot."""
    actions = dt.get_add_actions(flatten=True)
    table = actions.read_all() if hasattr(actions, "read_all") else actions
    sizes = table.column("size_bytes").to_pylist() if table.num_rows else []
    return len(sizes), int(sum(sizes))


def _commit_time(dt: DeltaTable, version: int) -> datetime | None:
    for entry in dt.history():
        if entry.get("version") == version and entry.get("timestamp") is not None:
            return datetime.fromtimestamp(entry["timestamp"] / 1000, tz=timezone.utc)
    return None


def committed_source_versions(checkpoint: Path) -> list[int]:
    """Delta versions in the last committed offsets of a streaming checkpoint whose sources
    record ``{"version": n}`` offsets (the change-feed source), one per such source. A damaged
    offsets file counts as "reads from the beginning" (-1): VACUUM then keeps everything."""
    from cdc_lake.checkpoint_log import last_committed_batch, read_offsets

    last = last_committed_batch(checkpoint)
    if last is None:
        return []
    try:
        entry = read_offsets(checkpoint, last)
    except (OSError, ValueError):
        return [-1]
    return [o["version"] for o in entry.sources if o and isinstance(o.get("version"), int)]


def lagging_readers(table: Path, pipelines: list[Any]) -> list[tuple[str, int]]:
    """``(reader pipeline, last version it has read)`` for pipelines reading ``table``'s change feed."""
    resolved = table.resolve()
    found = []
    for p in pipelines:
        sources = getattr(p, "change_feed_sources", None)
        paths = sources() if callable(sources) else (sources or [])
        if not any(Path(s).resolve() == resolved for s in paths):
            continue
        versions = committed_source_versions(Path(p.checkpoint_path))
        found.append((p.name, min(versions) if versions else -1))
    return found


def _retention_hours(dt: DeltaTable, settings: MaintenanceSettings,
                     readers: list[tuple[str, int]]) -> tuple[int, str | None]:
    hours, held_by = max(0, settings.vacuum_retention_hours), None
    now = datetime.now(timezone.utc)
    for name, version in readers:
        needed = version + 1
        if needed > dt.version():
            continue
        when = _commit_time(dt, max(needed, 0))
        if when is None:  # history no longer has it: keep everything we can
            return 10 ** 6, name
        age = int((now - when).total_seconds() // 3600) + 1
        if age >= hours:
            hours, held_by = age + 1, name
    return hours, held_by


def maintain_table(path: Path, settings: MaintenanceSettings, *, readers: list[tuple[str, int]] = (),
                   dry_run: bool = False) -> dict[str, Any]:
    """Compact, checkpoint and vacuum one table; returns the report for it."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(path)):
        return {"path": str(path), "status": "absent"}
    t0 = time.monotonic()
    dt = DeltaTable(str(path))
    files_before, bytes_before = _files(dt)
    report: dict[str, Any] = {"path": str(path), "status": "ok", "version_before": dt.version(),
                              "files_before": files_before, "bytes_before": bytes_before}
    if settings.compact and not dry_run and files_before > 1:
        metrics = dt.optimize.compact(target_size=settings.target_file_mb * 1024 * 1024)
        report["compacted"] = {"files_removed": metrics.get("numFilesRemoved", 0),
                               "files_added": metrics.get("numFilesAdded", 0)}
        dt = DeltaTable(str(path))
    if settings.checkpoint and not dry_run:
        dt.create_checkpoint()
        dt.cleanup_metadata()
        report["checkpoint_version"] = dt.version()
    if settings.vacuum:
        hours, held_by = _retention_hours(dt, settings, list(readers))
        removed = dt.vacuum(retention_hours=hours, dry_run=dry_run, enforce_retention_duration=False)
        report["vacuum"] = {"retention_hours": hours, "held_back_by": held_by,
                            ("would_remove" if dry_run else "files_removed"): len(removed)}
    dt = DeltaTable(str(path))
    report["files_after"], report["bytes_after"] = _files(dt)
    report["version_after"] = dt.version()
    report["seconds"] = round(time.monotonic() - t0, 3)
    return report


def run_maintenance(cfg: Any, *, settings: MaintenanceSettings | None = None, dry_run: bool = False,
                    pipelines: list[Any] | None = None) -> dict[str, Any]:
    """Maintain every table of ``cfg`` under its pipeline lock; returns the report.

    ``pipelines``: the other pipelines (to find lagging change-feed readers); default: every
    valid YAML in the folder of ``cfg.file``.
    """
    from cdc_lake.config import load_all
    from cdc_lake.locks import pipeline_lock

    settings = settings or getattr(cfg, "maintenance", None) or MaintenanceSettings()
    if pipelines is None:
        pipelines, _ = load_all(Path(cfg.file).parent)
    started = datetime.now(timezone.utc)
    lock = pipeline_lock(cfg)
    lock.acquire(f"maintenance-{started:%Y%m%dT%H%M%S}")
    try:
        tables = {name: maintain_table(path, settings, readers=lagging_readers(path, pipelines),
                                       dry_run=dry_run)
                  for name, path in sorted(pipeline_tables(cfg).items())}
    finally:
        lock.release()
    present = [t for t in tables.values() if t["status"] == "ok"]
    return {
        "pipeline": cfg.name, "dry_run": dry_run,
        "started_at": started.isoformat(timespec="seconds"),
        "tables": tables,
        "files_before": sum(t["files_before"] for t in present),
        "files_after": sum(t["files_after"] for t in present),
        "bytes_before": sum(t["bytes_before"] for t in present),
        "bytes_after": sum(t["bytes_after"] for t in present),
        "files_vacuumed": sum(t.get("vacuum", {}).get("files_removed", 0) for t in present),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cdc_lake.maintenance", description=__doc__.splitlines()[0])
    p.add_argument("--pipeline", required=True, help="pipeline YAML file")
    p.add_argument("--dry-run", action="store_true", help="report only: no compaction, no deletes")
    args = p.parse_args(argv)
    from cdc_lake.checkpoint import PipelineLocked
    from cdc_lake.config import ConfigError, load_pipeline

    try:
        report = run_maintenance(load_pipeline(args.pipeline), dry_run=args.dry_run)
    except ConfigError as e:
        print(f"[maintenance] CONFIG ERROR: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except PipelineLocked as e:
        print(f"[maintenance] PIPELINE LOCKED: {e}", file=sys.stderr)
        return EXIT_LOCKED
    for name, t in report["tables"].items():
        if t["status"] != "ok":
            print(f"[maintenance] {name:<28} {t['status']}")
            continue
        vac = t.get("vacuum", {})
        print(f"[maintenance] {name:<28} files {t['files_before']} -> {t['files_after']}, "
              f"bytes {t['bytes_before']} -> {t['bytes_after']}, vacuumed "
              f"{vac.get('files_removed', vac.get('would_remove', 0))} (retention "
              f"{vac.get('retention_hours')} h{', held by ' + vac['held_back_by'] if vac.get('held_back_by') else ''})")
    print(MAINTENANCE_SUMMARY_PREFIX + json.dumps(report, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
