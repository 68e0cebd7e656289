"""Before a run touches anything: is the stored state the checkpoint describes still there?

* Every Spark log file of the checkpoint is readable, and a checkpoint with batches has what
  Spark reads on a start: ``metadata``, an ``offsets/N`` for its newest ``commits/N``, and the
  file source log entries its newest offsets reach
  (:func:`cdc_lake.checkpoint_log.validate_checkpoint`).
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
* No table lost a commit of this pipeline's or holds a row change another writer made since the
  last run (:mod:`cdc_lake.table_marks`: the recorded version's commit fingerprint, and every
  later commit that changes rows must carry a transaction of this pipeline; maintenance's
  OPTIMIZE/VACUUM pass). A commit lost and then replaced by a maintenance commit at the same
  version, or a RESTORE/DELETE by hand, otherwise went unnoticed (rows lost, exit 0).
* No table holds a batch of this checkpoint that its offset log does not reach: every write
  carries the Delta transaction id ``(app_id, batch_id)`` (:func:`app_id`); a table at
  transaction version M while ``offsets/`` ends at N < M means the checkpoint was set back (an
  older copy restored, the last batches' log files or Spark's subfolders removed). Batches
  N+1..M would then count as already written everywhere and be skipped (seen: the new files'
  rows silently lost, exit 0). A batch planned but not committed (``offsets/N`` without
  ``commits/N``, tables at N) is the ordinary replay after a crash and passes.
* The files of ours in the checkpoint (``cdc_instance.json``, ``cdc_tables.json``,
  ``cdc_table_versions.json``) can be read.

All raise a :class:`~cdc_lake.checkpoint_log.PipelineStateError` that names the file or table
and the recovery command; the CLI exits 3 (no retry helps). After a successful check and after
every run the tables that exist are recorded in ``<checkpoint>/cdc_tables.json`` and their
versions in ``<checkpoint>/cdc_table_versions.json``
(:mod:`cdc_lake.cdc.table_records`).

Example::

    check_state(cfg)            # before the fast path and before Spark starts
    ...                         # the run
    record_tables(cfg)          # under the lock, after the run (cdc.table_records)
    record_versions(cfg)        # after every run, a full refresh too (cdc.table_records)
"""

from __future__ import annotations

from pathlib import Path

from cdc_lake.checkpoint import INSTANCE_FILE, instance_id, read_instance_id, written_tables
from cdc_lake.checkpoint_log import (PipelineStateError, last_offset_batch, remove_unfinished_writes,
                                     validate_checkpoint)
from cdc_lake.cdc.config import PipelineConfig
from cdc_lake.cdc.table_records import VERSIONS_FILE, is_table, load_table, recorded_versions
from cdc_lake.paths import mv_aside, q
from cdc_lake.table_marks import (changed_behind, checkpoint_bypass, commit_fingerprint,
                                   missing_data_files)


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


class TableChangedBehind(TableStateError):
    """A Delta table the checkpoint has written lost a commit of the pipeline's, or holds a
    row change another writer made since the last run (:mod:`cdc_lake.table_marks`)."""

    consequence = ("the table no longer holds what the checkpoint counts as written, so this run "
                   "stops instead of building on it")


class CheckpointRolledBack(PipelineStateError):
    """A table holds a transaction of this checkpoint for a batch its offset log does not reach."""

    def __init__(self, tables: list[str], detail: str, recovery: str) -> None:
        self.tables = tables
        super().__init__(
            f"{detail}; the next batches would get ids the tables already count as written, so "
            f"every write of theirs would be skipped and their changes lost for good. Recovery: "
            f"{recovery}")


def app_id(cfg: PipelineConfig) -> str:
    """The Delta transaction app id of this pipeline's checkpoint (minted with the checkpoint)."""
    return _app_id(cfg, instance_id(cfg.checkpoint_path))


def _app_id(cfg: PipelineConfig, instance: str) -> str:
    return f"cdc-{cfg.name}-{instance}"


def _job_cmd(cfg: PipelineConfig, *extra: str) -> str:
    return " ".join(["spark-submit", "spark_jobs/cdc_ingest.py", "--pipeline", q(cfg.file), *extra])


def refresh_command(cfg: PipelineConfig, tables: list[str]) -> str:
    names = ",".join(sorted(tables))
    return (f"rebuild it from the landing history with a full refresh: `{_job_cmd(cfg, '--full-refresh', '--tables', names)}` "
            f"(or trigger the DAG {cfg.name!r} with conf {{\"full_refresh\": true, \"tables\": "
            f"[{', '.join(repr(t).replace(chr(39), chr(34)) for t in sorted(tables))}]}})")


def reset_command(cfg: PipelineConfig) -> str:
    cp = cfg.checkpoint_path
    return (f"move the checkpoint aside and run again: `{mv_aside(cp)} && {_job_cmd(cfg)}`; the new "
            "checkpoint re-reads the whole landing history, and because every MERGE is ordered by "
            "binlog sequence, re-applied changes leave the tables as they are")


def check_state(cfg: PipelineConfig) -> None:
    """Raise :class:`PipelineStateError` if the checkpoint or a table it wrote is damaged/missing."""
    for f in remove_unfinished_writes(cfg.checkpoint_path):
        print(f"[cdc] removed {f}: left by a checkpoint log write a killed run never finished, "
              "or the checksum of a log file that was deleted", flush=True)
    validate_checkpoint(cfg.checkpoint_path, recovery=reset_command(cfg))
    instance = read_instance_id(cfg.checkpoint_path, recovery=_instance_recovery(cfg))
    app = None if instance is None else _app_id(cfg, instance)
    written = written_tables(cfg.checkpoint_path)
    left_at = recorded_versions(cfg.checkpoint_path, strict=True)
    fingerprints = recorded_versions(cfg.checkpoint_path, key="fingerprints")
    # a table whose version a run recorded was written too, even if cdc_tables.json (moved
    # aside, lost) does not say so: else a deleted table went unnoticed, exit 0 (tester)
    for name in cfg.tables:
        for kind, path in (("tables", cfg.tables[name].path), ("tombstones", cfg.tombstone_path(name))):
            if str(path) in left_at:
                written[kind].setdefault(name, str(path))
    changed: list[tuple[str, Path, str]] = []  # (table, path, why)
    txns: dict[str, tuple[str, int]] = {}  # table path -> (label, last txn version of `app`)
    missing: dict[str, str] = {}
    damaged: list[tuple[str, Path, str]] = []  # (table, path of the table or its tombstones, why)
    rolled_back: list[tuple[str, Path, int, int]] = []  # (table, path, version now, recorded)
    for kind, recorded in written.items():
        for name, old_path in recorded.items():
            if name not in cfg.tables:
                continue  # no longer configured: not this pipeline's business any more
            path = cfg.tables[name].path if kind == "tables" else cfg.tombstone_path(name)
            if not is_table(path):
                where = str(path) if str(path) == old_path else f"{path} (it was written at {old_path})"
                missing.setdefault(name, f"{'table' if kind == 'tables' else 'tombstone table'} "
                                         f"{name!r}: no Delta table at {where}")
                continue
            problem, version, txn = load_table(path, app)
            label = f"{'table' if kind == 'tables' else 'tombstone table of'} {name!r}"
            txns[str(path)] = (label, -1 if txn is None else txn)
            if problem is not None:
                damaged.append((name, path, problem))
            elif (last := left_at.get(str(path))) is not None and version is not None and version < last:
                rolled_back.append((name, path, version, last))
            elif last is not None and (why := changed_behind(
                    path, last, fingerprints.get(str(path)), app_prefix=f"cdc-{cfg.name}-",
                    current=version)):
                changed.append((name, path, why))
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
    if changed:
        names = sorted({n for n, _, _ in changed})
        versions = cfg.checkpoint_path / VERSIONS_FILE
        detail = f"pipeline {cfg.name!r}: " + "; ".join(
            f"the Delta table of {n!r} at {path}: {why}" for n, path, why in changed)
        raise TableChangedBehind(names, detail, (
            f"put removed _delta_log commit files back if that is what happened; else "
            f"{refresh_command(cfg, names)}. To keep a change made on purpose (knowing the table "
            f"then differs from its source), move {versions} aside (`{mv_aside(versions, '.accepted')}`)"
            f": the next run records the tables as they are"))
    _check_side_tables(cfg, app, txns)
    if app is not None:
        _check_checkpoint_not_behind(cfg, app, txns)


class TableFileMissing(TableStateError):
    """A data file a Delta table's log references is gone (found when a run failed on it)."""

    consequence = "its log still references it, so no run can read or MERGE into the table"


def missing_data_file(cfg: PipelineConfig, error_text: str) -> TableFileMissing | None:
    """The state error for a run that failed because a data file of one of the pipeline's
    tables is gone (deleted by hand, or a VACUUM by another tool), else None. Found in the
    failure's text (delta-rs: ``Object at location <f> not found``; Spark: ``File <f> does not
    exist``): it used to end the run with exit 1 (retried for nothing) and the cause on line
    ~550 of a plan dump."""
    if getattr(cfg, "kind", "cdc") != "cdc":
        return None
    for f in missing_data_files(error_text):
        for name in cfg.tables:
            for label, path in ((f"table {name!r}", cfg.tables[name].path),
                                (f"tombstone table of {name!r}", cfg.tombstone_path(name))):
                if path in f.parents:
                    return TableFileMissing([name], (
                        f"pipeline {cfg.name!r}: the data file {f} of the {label} at {path} "
                        "is gone (deleted by hand, or removed by a VACUUM outside this "
                        "pipeline's maintenance)"), (
                        f"put the file back from a copy if you have one; else move the table "
                        f"aside (`{mv_aside(path)}`) and {refresh_command(cfg, [name])}"))
    return None


def _check_checkpoint_not_behind(cfg: PipelineConfig, app: str,
                                 txns: dict[str, tuple[str, int]]) -> None:
    """Stop if a table holds a transaction of ``app`` above the last batch of ``offsets/``."""
    for name in cfg.tables:  # configured tables cdc_tables.json does not list (a set-back copy)
        for kind, path in (("table", cfg.tables[name].path),
                           ("tombstone table of", cfg.tombstone_path(name))):
            if str(path) not in txns and is_table(path):
                problem, _, txn = load_table(path, app)
                if problem is None and txn is not None:
                    txns[str(path)] = (f"{kind} {name!r}", txn)
    last = last_offset_batch(cfg.checkpoint_path)
    floor = -1 if last is None else last
    ahead = sorted(((label, path, txn) for path, (label, txn) in txns.items() if txn > floor),
                   key=lambda a: (-a[2], a[0]))
    if not ahead:
        return
    cp = cfg.checkpoint_path
    planned = (f"its offset log ends at batch {last} ({cp / 'offsets' / str(last)})"
               if last is not None else f"its offset log holds no batch ({cp / 'offsets'} is "
               f"{'empty' if (cp / 'offsets').is_dir() else 'missing'})")
    detail = (f"pipeline {cfg.name!r}: checkpoint {cp} was set back (an older copy restored, or "
              f"log files or Spark's subfolders of it removed): {planned}, but "
              + "; ".join(f"the {label} at {path} holds batch {txn} of this checkpoint "
                          f"(Delta transaction {app!r} version {txn})" for label, path, txn in ahead))
    raise CheckpointRolledBack(sorted({label for label, _, _ in ahead}), detail, (
        f"if you have a copy of the checkpoint as it was after batch {ahead[0][2]}, put it back; "
        f"else {reset_command(cfg)}, so nothing is lost. A full refresh does not help: it leaves "
        "the checkpoint as it is"))


def _instance_recovery(cfg: PipelineConfig) -> str:
    f = cfg.checkpoint_path / INSTANCE_FILE
    return (f"restore it from a copy if you have one; else move it aside and run again: "
            f"`{mv_aside(f)} && {_job_cmd(cfg)}`: that run mints a new id, so its batches are "
            "new transactions, and a batch replayed after a crash is written again, which leaves "
            "the tables as they are (every MERGE is ordered by binlog sequence; quarantine and "
            "DDL-log rows are keyed by file and line)")


def _raise_damaged(cfg: PipelineConfig, damaged: list[tuple[str, Path, str]]) -> None:
    names = sorted({n for n, _, _ in damaged})
    detail = f"pipeline {cfg.name!r}: " + "; ".join(
        f"the Delta log of {n!r} at {path} cannot be read ({why})" for n, path, why in damaged)
    aside = " && ".join(mv_aside(path) for _, path, _ in damaged)
    bypass = [(path, cmd) for _, path, _ in damaged if (cmd := checkpoint_bypass(path))]
    first = ("; ".join(f"every commit file of {path} is there: move its Delta checkpoint files "
                       f"aside and run again (`{cmd}`), readers then replay the commits, nothing "
                       "is lost" for path, cmd in bypass) + ". Otherwise " if bypass else "")
    raise TableDamaged(names, detail, (
        f"{first}restore the damaged file under _delta_log from a copy if you have one; else "
        f"move the table aside (`{aside}`) and {refresh_command(cfg, names)}"))


def _check_side_tables(cfg: PipelineConfig, app: str | None,
                       txns: dict[str, tuple[str, int]]) -> None:
    """The quarantine and DDL log: every run appends to them, so an unreadable log fails all.
    Adds their last transaction version of ``app`` to ``txns``."""
    broken = []
    marks = recorded_versions(cfg.checkpoint_path, key="side_tables")
    rolled_back = []
    for label, path in (("quarantine", cfg.quarantine_path), ("DDL log", cfg.ddl_log_path)):
        if not is_table(path):
            continue
        why, version, txn = load_table(path, app)
        if why is not None:
            broken.append((label, path, why))
            continue
        if txn is not None:
            txns[str(path)] = (f"{label} table", txn)
        mark = marks.get(str(path))
        # the same table (its first commit as recorded) at a lower version: commits removed.
        # (a new table, e.g. after the move-aside below, has another first commit: accepted)
        if (isinstance(mark, list) and len(mark) == 2 and version is not None and version < mark[0]
                and commit_fingerprint(path, 0) == mark[1]):
            rolled_back.append((label, path, version, mark[0]))
    if rolled_back:
        labels = [label for label, _, _, _ in rolled_back]
        raise TableRolledBack(labels, f"pipeline {cfg.name!r}: " + "; ".join(
            f"the {label} table at {path} is at version {now}, but a run of this checkpoint left "
            f"it at version {last}: the newest commit files of its _delta_log were removed, and "
            "with them rows it held" for label, path, now, last in rolled_back), (
            f"put the missing _delta_log commit files back if you have them; else "
            f"{reset_command(cfg)}; lines already in the table are not added twice (keyed by "
            "file and line)"))
    if not broken:
        return
    detail = f"pipeline {cfg.name!r}: " + "; ".join(
        f"the Delta log of the {label} table at {path} cannot be read ({why})"
        for label, path, why in broken)
    aside = " && ".join(mv_aside(path) for _, path, _ in broken)
    raise TableDamaged([label for label, _, _ in broken], detail, (
        f"restore the damaged file under _delta_log from a copy if you have one; else move the "
        f"table aside (`{aside}`): the next run creates a new one, and the rows recorded so far "
        f"stay readable in the moved copy up to its last readable version"))
