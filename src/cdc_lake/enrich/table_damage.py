"""What a failed enrichment run says about a damaged table it reads or writes (exit 3).

A data file deleted behind a table (by hand, or a VACUUM outside this pipeline's maintenance)
or a Delta log delta-rs cannot load makes Spark / delta-rs fail with an error naming neither the
pipeline's YAML key nor the recovery; :func:`missing_data_file` and :func:`damaged_log` turn the
failure into a :class:`~cdc_lake.checkpoint_log.PipelineStateError` that names the table, its
role and the recovery that role needs (the quarantine moved aside, an own output rebuilt with
``--reprocess``, an upstream table rebuilt by its writer first). :func:`check_inputs_present`
runs before ``--reprocess`` deletes anything.

Example::

    err = missing_data_file(cfg, traceback_text) or damaged_log(cfg)
    if err is not None:
        print(f"[enrich] NEEDS RECOVERY: {err}")   # exit 3
"""

from __future__ import annotations

from pathlib import Path

from cdc_lake.checkpoint_log import PipelineStateError
from cdc_lake.enrich.config import EnrichConfig
from cdc_lake.enrich.state import EnrichNeedsReprocess, owned_outputs, recovery_command
from cdc_lake.paths import mv_aside
from cdc_lake.table_marks import absent_snapshot_files, checkpoint_bypass, missing_data_files
from cdc_lake.table_writers import rebuild_hint


# -- a data file deleted behind a table ---------------------------------------------------------
def _tables_read_and_written(cfg: EnrichConfig) -> tuple[list[tuple[str, Path, str]],
                                                         list[tuple[str, Path, str]]]:
    own = [(key, path, "output table") for key, path in owned_outputs(cfg)]
    own.append(("outputs.quarantine", cfg.outputs.quarantine, "quarantine table"))
    upstream = [("fact.change_feed", cfg.fact.change_feed, "fact table")] if cfg.fact.change_feed \
        else []
    upstream += [(f"dimensions.{d.name}.table", d.table, "dimension table") for d in cfg.dimensions]
    return own, upstream


def _missing_file_error(cfg: EnrichConfig, f: Path) -> PipelineStateError | None:
    own, upstream = _tables_read_and_written(cfg)
    for key, path, what in own + upstream:
        if path is None or Path(path) not in f.parents:
            continue
        detail = (f"pipeline {cfg.name!r}: the data file {f} of the {what} {key} at {path} is "
                  "gone (deleted by hand, or removed by a VACUUM outside this pipeline's "
                  "maintenance); its Delta log still references it, so no run can read it")
        return _table_error(cfg, key, Path(path), (key, path, what) in own, detail,
                            "put the file back from a copy if you have one", "except that file's")
    return None


def _table_error(cfg: EnrichConfig, key: str, path: Path, own: bool, detail: str, restore: str,
                 rows_kept: str) -> PipelineStateError:
    """The state error for a damaged table the pipeline reads or writes, with the recovery its
    role needs: the quarantine moved aside, an own output rebuilt by --reprocess, an upstream
    table rebuilt by its writer first."""
    if key == "outputs.quarantine":
        return PipelineStateError(
            f"{detail}. Recovery: {restore}; else move the table aside (`{mv_aside(path)}`, its "
            f"rows stay readable there {rows_kept}) and run again: the job starts a new "
            "quarantine table")
    if own:
        return EnrichNeedsReprocess(
            f"{detail}. Recovery: {restore}; else {recovery_command(cfg)} (rebuilds every output "
            "from the upstream tables)")
    return PipelineStateError(
        f"{detail}. Recovery: {restore}; else {rebuild_hint(path)}; then run this pipeline again "
        f"(it says when the rebuilt table needs {recovery_command(cfg)}). Do not --reprocess "
        "before: it needs every file of the upstream tables")


def damaged_log(cfg: EnrichConfig) -> PipelineStateError | None:
    """After a failed run: the state error for the first table the pipeline reads or writes
    whose Delta log delta-rs cannot load (a truncated commit, a checkpoint that is gone), else
    None: exit 3 naming the table and its recovery instead of exit 1 and a traceback, retried
    for nothing (tester: the fact, a dimension, the manifest). Only looked at on failure."""
    from deltalake import DeltaTable

    own, upstream = _tables_read_and_written(cfg)
    for key, path, what in own + upstream:
        if path is None or not (Path(path) / "_delta_log").is_dir():
            continue
        try:
            DeltaTable(str(path))
        except OSError:
            continue  # the storage, maybe transient: the run's own error stands (retried)
        except Exception as e:  # noqa: BLE001 - DeltaError and kin: the log is damaged
            first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            detail = (f"pipeline {cfg.name!r}: the Delta log of the {what} {key} at {path} cannot "
                      f"be read ({type(e).__name__}: {first})")
            restore = "restore the damaged _delta_log file from a copy if you have one"
            if bypass := checkpoint_bypass(Path(path)):
                restore = (f"every commit file is there: first move its Delta checkpoint files "
                           f"aside (`{bypass}`) and run again, readers then replay the commits "
                           f"and nothing is lost; if it still fails, {restore}")
            return _table_error(cfg, key, Path(path), (key, path, what) in own, detail, restore,
                                "up to its last readable version")
    return None


def missing_data_file(cfg: EnrichConfig, error_text: str) -> PipelineStateError | None:
    """The state error for a run that failed because a data file of a table it reads or writes
    is gone (deleted by hand, a VACUUM by another tool), else None: exit 3 naming the file, the
    table and its recovery, instead of exit 1 (retried for nothing) and a Spark/delta-rs error."""
    for f in missing_data_files(error_text):
        if (err := _missing_file_error(cfg, f)) is not None:
            return err
    return None


def check_inputs_present(cfg: EnrichConfig) -> None:
    """Before ``--reprocess`` deletes anything: every data file of the fact and dimension
    tables' current versions must be on disk. The rebuild reads them all; a deleted one failed
    it after the outputs were gone (tester: the outputs stayed deleted until the upstream table
    was repaired). Raises the missing-file state error (exit 3), nothing deleted."""
    from deltalake import DeltaTable

    _, upstream = _tables_read_and_written(cfg)
    for _key, path, _what in upstream:
        try:
            uris = DeltaTable(str(path)).file_uris()
        except Exception:  # noqa: BLE001 - absent or unreadable: the job's own checks say so
            continue
        for f in absent_snapshot_files(uris):
            err = _missing_file_error(cfg, f)
            if err is not None:
                raise PipelineStateError(f"{err} Nothing was reset.")


def check_dimensions_present(cfg: EnrichConfig) -> None:
    """A dimension table an earlier batch read (its plan pinned a version) that is not a Delta
    table any more (folder or ``_delta_log`` removed) stops the run (exit 3). Read as "no table
    yet" it parked every new fact, exit 0, and after ``late_members.wait`` released them with
    unknown members (tester); under ``--reprocess`` the same. Run before the stream and before
    ``--reprocess`` deletes anything."""
    import json

    from deltalake import DeltaTable

    from cdc_lake.enrich.plan import PLANS_DIR

    plans = sorted((p for p in (cfg.checkpoint_path / PLANS_DIR).glob("*.json") if p.stem.isdigit()),
                   key=lambda p: int(p.stem))
    read: dict[str, int] = {}
    for plan in plans:
        try:
            versions = json.loads(plan.read_text(encoding="utf-8")).get("versions") or {}
        except (OSError, ValueError, AttributeError):
            continue  # an unreadable plan: the writer's own replay check reports it
        for d in cfg.dimensions:
            v = versions.get(f"dim:{d.name}") if isinstance(versions, dict) else None
            if isinstance(v, int) and not isinstance(v, bool):
                read[d.name] = v
    for d in cfg.dimensions:
        if d.name in read and not DeltaTable.is_deltatable(str(d.table)):
            raise PipelineStateError(
                f"pipeline {cfg.name!r}: the dimension table dimensions.{d.name}.table at {d.table} "
                f"is gone (no Delta table there), but batches of this pipeline read it (last at "
                f"version {read[d.name]}): facts joined with it now would all wait for members that "
                f"no longer exist. Recovery: put the table back; else {rebuild_hint(Path(d.table))}; "
                f"then run this pipeline again (it says when it needs {recovery_command(cfg)})")
