"""Before a run touches anything: is the stored state the checkpoint describes still there?

* Every Spark log file of the checkpoint is readable (:func:`cdc_lake.checkpoint_log.validate_checkpoint`).
* Every Delta table (and tombstone table) the checkpoint has written still exists. A table
  deleted while its checkpoint survives would otherwise be re-created holding only the changes
  that arrive from now on (seen: 5 rows became 1, exit 0).
* Each of those tables' Delta log, and the quarantine's and DDL log's, can be read (a truncated
  or garbled log file would otherwise fail the run deep inside a micro-batch with a Spark stack
  trace).
* None of those tables is at a lower Delta version than the last run left it at
  (``<checkpoint>/cdc_table_versions.json``): the newest commit files of its log were removed, so
  the changes they held are gone while the checkpoint counts them as written (seen: the last
  batch's updates silently lost, exit 0).

Both raise a :class:`~cdc_lake.checkpoint_log.PipelineStateError` that names the file or table
and the recovery command; the CLI exits 3 (no retry helps). After a successful check and after
every run the tables that exist are recorded in ``<checkpoint>/cdc_tables.json`` and their
versions in ``<checkpoint>/cdc_table_versions.json`` (:func:`record_versions`).

Example::

    check_state(cfg)            # before the fast path and before Spark starts
    ...                         # the run
    record_tables(cfg)          # under the lock, after the run
    record_versions(cfg)        # after every run, a full refresh too
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from deltalake import DeltaTable

from cdc_lake.checkpoint import record_written_tables, written_tables
from cdc_lake.checkpoint_log import PipelineStateError, remove_unfinished_writes, validate_checkpoint
from cdc_lake.cdc.config import PipelineConfig


class TableStateError(PipelineStateError):
    """A Delta table the checkpoint has written needs an operator: ``detail`` (what is wrong),
    the class's ``consequence`` (why the run stops), ``recovery`` (the command)."""

    consequence = ""

    def __init__(self, tables: list[str], detail: str, recovery: str) -> None:
        self.tables = tables
        super().__init__(f"{detail}; {self.consequence}. Recovery: {recovery}")


class TableMissing(TableStateError):
    """A Delta table the checkpoint has written is gone."""

    consequence = ("this run stops so nothing is silently lost (an incremental run would "
                   "re-create it with only the changes that arrive from now on)")


class TableDamaged(TableStateError):
    """A Delta table the checkpoint has written exists but its log cannot be read."""

    consequence = "no run can read or write it"


class TableRolledBack(TableStateError):
    """A Delta table the checkpoint has written is at a lower version than a run left it at."""

    consequence = ("the changes those commits held are gone while the checkpoint counts them as "
                   "written, so this run stops instead of building on them")


VERSIONS_FILE = "cdc_table_versions.json"


def _job_cmd(cfg: PipelineConfig, *extra: str) -> str:
    return " ".join(["spark-submit", "spark_jobs/cdc_ingest.py", "--pipeline", str(cfg.file), *extra])


def refresh_command(cfg: PipelineConfig, tables: list[str]) -> str:
    names = ",".join(sorted(tables))
    return (f"rebuild it from the landing history with a full refresh: `{_job_cmd(cfg, '--full-refresh', '--tables', names)}` "
            f"(or trigger the DAG {cfg.name!r} with conf {{\"full_refresh\": true, \"tables\": "
            f"[{', '.join(repr(t).replace(chr(39), chr(34)) for t in sorted(tables))}]}})")


def reset_command(cfg: PipelineConfig) -> str:
    cp = cfg.checkpoint_path
    return (f"move the checkpoint aside and run again: `mv {cp} {cp}.damaged && {_job_cmd(cfg)}`; the new "
            "checkpoint re-reads the whole landing history, and because every MERGE is ordered by "
            "binlog sequence, re-applied changes leave the tables as they are")


def _exists(path: Path) -> bool:
    return DeltaTable.is_deltatable(str(path))


def _unreadable(path: Path) -> str | None:
    """Why the Delta table at ``path`` cannot be loaded (its log replayed), else None."""
    return _load(path)[0]


def _load(path: Path) -> tuple[str | None, int | None]:
    """``(why the table cannot be loaded, None)`` or ``(None, its version)``."""
    try:
        version = DeltaTable(str(path)).version()
    except OSError:
        raise  # the storage, not the table (may be transient): an ordinary failure, retried
    except Exception as e:  # noqa: BLE001 - DeltaError (log JSON/parquet/protocol) and kin
        return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}", None
    return None, version


def check_state(cfg: PipelineConfig) -> None:
    """Raise :class:`PipelineStateError` if the checkpoint or a table it wrote is damaged/missing."""
    for f in remove_unfinished_writes(cfg.checkpoint_path):
        print(f"[cdc] removed {f}: left by a checkpoint log write a killed run never finished, "
              "or the checksum of a log file that was deleted", flush=True)
    validate_checkpoint(cfg.checkpoint_path, recovery=reset_command(cfg))
    written = written_tables(cfg.checkpoint_path)
    left_at = _recorded_versions(cfg.checkpoint_path)
    missing: dict[str, str] = {}
    damaged: list[tuple[str, Path, str]] = []  # (table, path of the table or its tombstones, why)
    rolled_back: list[tuple[str, Path, int, int]] = []  # (table, path, version now, recorded)
    for kind, recorded in written.items():
        for name, old_path in recorded.items():
            if name not in cfg.tables:
                continue  # no longer configured: not this pipeline's business any more
            path = cfg.tables[name].path if kind == "tables" else cfg.tombstone_path(name)
            if not _exists(path):
                where = str(path) if str(path) == old_path else f"{path} (it was written at {old_path})"
                missing.setdefault(name, f"{'table' if kind == 'tables' else 'tombstone table'} "
                                         f"{name!r}: no Delta table at {where}")
                continue
            problem, version = _load(path)
            if problem is not None:
                damaged.append((name, path, problem))
            elif (last := left_at.get(str(path))) is not None and version is not None and version < last:
                rolled_back.append((name, path, version, last))
    if missing:
        detail = (f"pipeline {cfg.name!r}: checkpoint {cfg.checkpoint_path} has written "
                  + "; ".join(missing[n] for n in sorted(missing)))
        raise TableMissing(sorted(missing), detail, refresh_command(cfg, sorted(missing)))
    if damaged:
        _raise_damaged(cfg, damaged)
    if rolled_back:
        names = sorted({n for n, _, _, _ in rolled_back})
        detail = f"pipeline {cfg.name!r}: " + "; ".join(
            f"the Delta table of {n!r} at {path} is at version {now}, but a run of this checkpoint "
            f"left it at version {last} (the newest commit files of its _delta_log were removed "
            f"or the table was replaced by an older copy)"
            for n, path, now, last in rolled_back)
        raise TableRolledBack(names, detail, (
            f"put the missing _delta_log commit files back if you have them; else "
            f"{refresh_command(cfg, names)}"))
    _check_side_tables(cfg)


def _raise_damaged(cfg: PipelineConfig, damaged: list[tuple[str, Path, str]]) -> None:
    names = sorted({n for n, _, _ in damaged})
    detail = f"pipeline {cfg.name!r}: " + "; ".join(
        f"the Delta log of {n!r} at {path} cannot be read ({why})" for n, path, why in damaged)
    aside = " && ".join(f"mv {path} {path}.damaged" for _, path, _ in damaged)
    raise TableDamaged(names, detail, (
        f"restore the damaged file under _delta_log from a copy if you have one; else move the "
        f"table aside (`{aside}`) and {refresh_command(cfg, names)}"))


def _check_side_tables(cfg: PipelineConfig) -> None:
    """The quarantine and DDL log: every run appends to them, so an unreadable log fails all."""
    broken = [(label, path, why) for label, path in (("quarantine", cfg.quarantine_path),
                                                     ("DDL log", cfg.ddl_log_path))
              if _exists(path) and (why := _unreadable(path)) is not None]
    if not broken:
        return
    detail = f"pipeline {cfg.name!r}: " + "; ".join(
        f"the Delta log of the {label} table at {path} cannot be read ({why})"
        for label, path, why in broken)
    aside = " && ".join(f"mv {path} {path}.damaged" for _, path, _ in broken)
    raise TableDamaged([label for label, _, _ in broken], detail, (
        f"restore the damaged file under _delta_log from a copy if you have one; else move the "
        f"table aside (`{aside}`): the next run creates a new one, and the rows recorded so far "
        f"stay readable in the moved copy up to its last readable version"))


def record_tables(cfg: PipelineConfig) -> None:
    """Record the configured tables that exist now as written by this checkpoint."""
    tables = {n: str(t.path) for n, t in cfg.tables.items() if _exists(t.path)}
    tombstones = {n: str(cfg.tombstone_path(n)) for n in cfg.tables if _exists(cfg.tombstone_path(n))}
    if tables or tombstones:
        record_written_tables(cfg.checkpoint_path, tables, tombstones)


def _recorded_versions(checkpoint: Path) -> dict[str, int]:
    """``table path -> Delta version`` a run of this checkpoint left it at (empty if unknown)."""
    f = checkpoint / VERSIONS_FILE
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (ValueError, OSError):
        return {}  # unreadable record (it is ours, not Spark's): no check rather than a false stop
    versions = data.get("versions") if isinstance(data, dict) else None
    return {p: v for p, v in (versions or {}).items() if isinstance(v, int) and not isinstance(v, bool)}


def record_versions(cfg: PipelineConfig) -> None:
    """Record the Delta version of every configured table and tombstone table that exists now
    (atomically), for :func:`check_state`'s rolled-back check. Call after every run under the
    lock, a full refresh included (it may rebuild a moved-aside table at a lower version)."""
    paths = [t.path for t in cfg.tables.values()] + [cfg.tombstone_path(n) for n in cfg.tables]
    versions = dict(_recorded_versions(cfg.checkpoint_path))
    for path in paths:
        if _exists(path):
            problem, version = _load(path)
            if problem is None and version is not None:
                versions[str(path)] = version
    if not versions:
        return
    cfg.checkpoint_path.mkdir(parents=True, exist_ok=True)
    f = cfg.checkpoint_path / VERSIONS_FILE
    tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps({"versions": versions}, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, f)
