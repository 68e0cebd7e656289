"""What each pipeline kind writes and records about its Delta tables, for maintenance.

* :func:`pipeline_tables` — every Delta table a pipeline writes (CDC: targets, tombstones,
  quarantine, DDL log; enrichment: its outputs; dimension: its table);
* :func:`recorded_marks` — the version (and commit fingerprint) the pipeline's last run left
  each table at, from the kind's own record (an unreadable record raises: exit 3);
* :func:`changed_behind_run` — why a table must not be maintained (it lost commits of the
  pipeline's, or another writer changed its rows since); :func:`owned_elsewhere` — nor one
  another pipeline writes;
* :func:`damaged_recovery` — the recovery the kind's own job prints for a damaged table.

Example::

    marks = recorded_marks(cfg)
    for name, path in pipeline_tables(cfg).items():
        if (why := changed_behind_run(cfg, path, marks)):
            print(name, why, damaged_recovery(cfg, name, path, "changed_behind"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdc_lake.paths import mv_aside


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


def recorded_marks(cfg: Any) -> dict[str, tuple[int, str | None]]:
    """What the pipeline's last run recorded per table (:mod:`cdc_lake.table_marks`)."""
    kind = getattr(cfg, "kind", "cdc")
    if kind == "cdc":
        from cdc_lake.cdc.table_records import recorded_marks
    elif kind == "enrich":
        from cdc_lake.enrich.state import recorded_marks
    elif kind == "dimension":  # the version the last refresh left the table at (its state file)
        from cdc_lake.dimensions.refresh import read_state

        left = read_state(cfg.checkpoint_path).get("delta_version")  # unreadable: exit 3
        ok = isinstance(left, int) and not isinstance(left, bool)
        return {str(cfg.table): (left, None)} if ok else {}
    else:
        return {}
    # strict: an unreadable record stops maintenance (exit 3). Without it nothing could tell a
    # table that lost commits, and maintenance's own commits would take the lost versions'
    # numbers (tester: rows lost, exit 0 everywhere after).
    return recorded_marks(cfg, strict=True)


def changed_behind_run(cfg: Any, path: Path, marks: dict[str, tuple[int, str | None]]) -> str | None:
    """Why a table must not be maintained: it lost a commit of the pipeline's or another writer
    changed its rows since the last run. Maintenance would then bury the evidence: its OPTIMIZE
    and VACUUM commits took the lost commit's version number (the job's version check then saw
    nothing wrong: rows lost, exit 0) and VACUUM deleted the lost commit's data files."""
    from cdc_lake.table_marks import changed_behind, latest_commit

    mark = marks.get(str(path))
    if mark is None or not (Path(path) / "_delta_log").is_dir():
        return None
    # the log ends below the recorded version: its newest commits were removed (a record
    # without a fingerprint, as a dimension's, cannot tell that otherwise)
    newest = latest_commit(path)
    if newest is not None and newest < mark[0]:
        return (f"its Delta log ends at version {newest}, but a run of this pipeline left it "
                f"at version {mark[0]}: the newest commit files were removed, or the table was "
                "replaced by an older copy")
    kind = getattr(cfg, "kind", "cdc")
    # (a dimension's writes carry the app id dimension-<pipeline>, the date as txn version)
    prefix = cfg.app_id if kind == "dimension" else f"{kind}-{cfg.name}-"
    return changed_behind(path, mark[0], mark[1], app_prefix=prefix)


# Tables several pipelines share by design (their rows carry the pipeline's name).
_SHARED = {"cdc": ("_quarantine", "_ddl_log"), "enrich": ("quarantine",)}


def owned_elsewhere(cfg: Any, name: str, path: Path) -> str | None:
    """Why a table must not be maintained by this pipeline: its Delta log carries another
    writer's owner mark (:mod:`cdc_lake.table_writers`): two YAMLs naming one table path, run
    by hand. Maintenance would compact and VACUUM the other's table with this pipeline's
    settings and readers (its own jobs refuse to write there)."""
    from cdc_lake.table_writers import describe_writers, foreign_writers

    kind = getattr(cfg, "kind", "cdc")
    if name in _SHARED.get(kind, ()) or not (Path(path) / "_delta_log").is_dir():
        return None
    foreign, mine = foreign_writers(Path(path), kind, cfg.name)
    if not foreign:
        return None
    return (f"its Delta log carries the owner mark of {describe_writers(foreign)}"
            + (f" besides this pipeline's ({cfg.name!r}): two pipelines have written into it"
               if mine else f", not of this pipeline ({cfg.name!r})"))


def damaged_recovery(cfg: Any, name: str, path: Path, status: str = "damaged") -> str:
    """What to do about table ``name`` of ``cfg`` whose Delta log cannot be read (or, ``status``
    ``changed_behind``, that changed behind the pipeline): the recovery the pipeline's own job
    prints for the same state (``docs/run-safety.md``, check 3)."""
    restore = {"damaged": "restore the damaged file under _delta_log from a copy if you have one; "
                          "else ",
               "missing_file": "put the data file back from a copy if you have one (maintenance "
                               "did not change this table); else ",
               "missing_table": "put the table back from a copy if you have one; else "}.get(
        status, "put removed _delta_log commit files back if you have them (maintenance did not "
                "touch this table); else ")
    aside = f"`{mv_aside(path)}`"
    kind = getattr(cfg, "kind", "cdc")
    if status == "owned_elsewhere":  # nothing of this pipeline's to restore
        return (f"give the table a path of its own in {cfg.file} (each pipeline maintains only "
                "its own tables); a table two pipelines have both written holds mixed rows: "
                "move it aside and rebuild each pipeline's table")
    if status == "missing_table" and kind == "cdc":  # nothing there to move aside (tester)
        from cdc_lake.cdc.state import refresh_command

        table = name.split("/", 1)[1] if name.startswith("_tombstones/") else name
        if name in ("_quarantine", "_ddl_log"):
            return f"{restore}run the pipeline again: it creates a new one"
        return f"{restore}{refresh_command(cfg, [table])}"
    if kind == "cdc":
        if name in ("_quarantine", "_ddl_log"):
            return (f"{restore}move the table aside ({aside}): the next run creates a new one, and "
                    "the rows recorded so far stay readable in the moved copy up to its last "
                    "readable version")
        from cdc_lake.cdc.state import refresh_command

        table = name.split("/", 1)[1] if name.startswith("_tombstones/") else name
        return f"{restore}move the table aside ({aside}) and {refresh_command(cfg, [table])}"
    if kind == "enrich":
        from cdc_lake.enrich.state import recovery_command

        return f"{restore}rebuild the pipeline's outputs: `{recovery_command(cfg)}`"
    if kind == "dimension":
        from cdc_lake.dimensions.refresh import STATE_FILE

        state = f"`{mv_aside(cfg.checkpoint_path / STATE_FILE)}`"
        what = (f"its state ({state})" if status == "missing_table"
                else f"the table and its state ({aside} and {state})")
        return (f"{restore}move {what} aside, then apply the snapshots again from the first date "
                "(SCD1: the newest date alone rebuilds it)")
    return f"{restore}move the table aside ({aside}) and rebuild it with the pipeline's job"
