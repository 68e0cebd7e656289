"""Before a run touches anything: is the stored state the checkpoint describes still there?

* Every Spark log file of the checkpoint is readable (:func:`cdc_lake.checkpoint_log.validate_checkpoint`).
* Every Delta table (and tombstone table) the checkpoint has written still exists. A table
  deleted while its checkpoint survives would otherwise be re-created holding only the changes
  that arrive from now on (seen: 5 rows became 1, exit 0).
* Each of those tables' Delta log, and the quarantine's and DDL log's, can be read (a truncated
  or garbled log file would otherwise fail the run deep inside a micro-batch with a Spark stack
  trace).

Both raise a :class:`~cdc_lake.checkpoint_log.PipelineStateError` that names the file or table
and the recovery command; the CLI exits 3 (no retry helps). After a successful check and after
every run the tables that exist are recorded in ``<checkpoint>/cdc_tables.json``.

Example::

    check_state(cfg)            # before the fast path and before Spark starts
    ...                         # the run
    record_tables(cfg)          # under the lock, after the run
"""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from cdc_lake.checkpoint import record_written_tables, written_tables
from cdc_lake.checkpoint_log import PipelineStateError, remove_unfinished_writes, validate_checkpoint
from cdc_lake.cdc.config import PipelineConfig


class TableMissing(PipelineStateError):
    """A Delta table the checkpoint has written is gone."""

    def __init__(self, tables: list[str], detail: str, recovery: str) -> None:
        self.tables = tables
        super().__init__(f"{detail}; this run stops so nothing is silently lost (an incremental "
                         f"run would re-create it with only the changes that arrive from now on). "
                         f"Recovery: {recovery}")


class TableDamaged(PipelineStateError):
    """A Delta table the checkpoint has written exists but its log cannot be read."""

    def __init__(self, tables: list[str], detail: str, recovery: str) -> None:
        self.tables = tables
        super().__init__(f"{detail}; no run can read or write it. Recovery: {recovery}")


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
    try:
        DeltaTable(str(path))
    except OSError:
        raise  # the storage, not the table (may be transient): an ordinary failure, retried
    except Exception as e:  # noqa: BLE001 - DeltaError (log JSON/parquet/protocol) and kin
        return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return None


def check_state(cfg: PipelineConfig) -> None:
    """Raise :class:`PipelineStateError` if the checkpoint or a table it wrote is damaged/missing."""
    for f in remove_unfinished_writes(cfg.checkpoint_path):
        print(f"[cdc] removed {f}: left by a checkpoint log write a killed run never finished, "
              "or the checksum of a log file that was deleted", flush=True)
    validate_checkpoint(cfg.checkpoint_path, recovery=reset_command(cfg))
    written = written_tables(cfg.checkpoint_path)
    missing: dict[str, str] = {}
    damaged: list[tuple[str, Path, str]] = []  # (table, path of the table or its tombstones, why)
    for kind, recorded in written.items():
        for name, old_path in recorded.items():
            if name not in cfg.tables:
                continue  # no longer configured: not this pipeline's business any more
            path = cfg.tables[name].path if kind == "tables" else cfg.tombstone_path(name)
            if not _exists(path):
                where = str(path) if str(path) == old_path else f"{path} (it was written at {old_path})"
                missing.setdefault(name, f"{'table' if kind == 'tables' else 'tombstone table'} "
                                         f"{name!r}: no Delta table at {where}")
            elif (problem := _unreadable(path)) is not None:
                damaged.append((name, path, problem))
    if missing:
        detail = (f"pipeline {cfg.name!r}: checkpoint {cfg.checkpoint_path} has written "
                  + "; ".join(missing[n] for n in sorted(missing)))
        raise TableMissing(sorted(missing), detail, refresh_command(cfg, sorted(missing)))
    if damaged:
        _raise_damaged(cfg, damaged)
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
