"""The enrichment job's own stored state, checked before a run processes anything.

* **Own tables behind the checkpoint** (:func:`check_tables`). After every micro-batch's writes
  the Delta version of each state table (``enriched``, ``pending``, ``aggregate:<name>``) is
  recorded in ``<checkpoint>/enrich_table_versions.json`` (atomically). Before a run, each
  recorded table must still exist at its path, be readable and be at a version >= the recorded
  one, the recorded version's commit must be the one recorded, and later commits that change
  rows must be the pipeline's own (:mod:`cdc_lake.table_marks`). Otherwise (the table deleted,
  its newest ``_delta_log`` commits removed, replaced by an older copy, a RESTORE/DELETE by
  hand) the checkpoint counts changes as written that the table no longer holds; going on
  would give wrong aggregates forever (signed deltas withdraw what the enriched table says was
  counted). The run stops with :class:`EnrichNeedsReprocess` (exit 3) naming the table and the
  recovery ``--reprocess``. A checkpoint with committed batches but no record (written before
  this check existed, or the record deleted) is checked for the tables' existence only: the
  enriched and pending tables, and each aggregate while the enriched table holds rows.
* **Aggregate definitions** (:func:`check_definitions`). Each aggregate's definition (path,
  group_by, time_bucket, sums, the event time a bucket reads) is recorded in
  ``<checkpoint>/enrich_definitions.json``. An aggregate that is new or whose definition changed
  on a pipeline that already committed batches would only count the facts processed from now on
  (an incremental aggregate is never recomputed): :class:`~cdc_lake.config.ConfigError` (exit 2)
  naming the aggregate and the fix (``--reprocess``). A removed aggregate is simply no longer
  maintained (its table is left as it is).
* **Reset** (:func:`check_reset`): ``--reprocess`` removes only what the job owns; a path to
  delete that holds a Delta table other than the output itself, or is a non-empty folder that is
  not a Delta table, stops the reset before anything is deleted (ConfigError, exit 2).
* **Owner of each output table** (:func:`check_owners`, run by :func:`check_definitions` before
  a run and by :func:`check_reset` before ``--reprocess`` deletes). The owner mark is the Delta
  transaction app id every write of a cdc-lake job carries (``enrich-<pipeline>-...``,
  ``cdc-<pipeline>-...``, ``dimension-<pipeline>``; read from the table's ``_delta_log``, so it
  is the same for delta-rs and delta-spark tables). An existing enriched, pending, manifest or
  aggregate table written by any other writer is not this pipeline's: ConfigError (exit 2)
  naming the table, its owner and this pipeline, before anything is written or deleted. A table
  with no mark at all is this pipeline's only when its own records
  (``enrich_table_versions.json``) list it at that path, or when it holds no rows (created by a
  run that stopped before its first write: nothing in it to mix or lose).

Example::

    check_tables(cfg)                   # before the stream starts (not under --reprocess)
    check_definitions(cfg)              # ConfigError when an aggregate is new or changed, or
                                        # an output table belongs to another pipeline
    record_versions(cfg, {"enriched": 7, "pending": 3, "aggregate:rev": 5})   # per batch
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

from cdc_lake.checkpoint_log import PipelineStateError, last_committed_batch
from cdc_lake.config import ConfigError
from cdc_lake.enrich.config import EnrichConfig
from cdc_lake.paths import mv_aside, q
from cdc_lake.table_marks import changed_behind, checkpoint_bypass, commit_fingerprint
from cdc_lake.table_writers import describe_writers, foreign_writers, holds_rows

VERSIONS_FILE = "enrich_table_versions.json"
DEFINITIONS_FILE = "enrich_definitions.json"


class EnrichNeedsReprocess(PipelineStateError):
    """The change feed cannot be followed (upstream rewritten, history removed) or the job's own
    stored state no longer matches its checkpoint: exit 3, recovery ``--reprocess``."""


def recovery_command(cfg: EnrichConfig) -> str:
    return f"spark-submit spark_jobs/enrich.py --pipeline {q(cfg.file)} --reprocess"


def state_tables(cfg: EnrichConfig) -> dict[str, Path]:
    """The tables whose content the next batches build on (name as in txn ids -> path)."""
    out = {"enriched": cfg.outputs.enriched, "pending": cfg.outputs.pending}
    out.update({f"aggregate:{a.name}": a.path for a in cfg.outputs.aggregates})
    return out


def _write_json(f: Path, data: dict[str, Any]) -> None:
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, f)


def _read_json(f: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, OSError):
        return None  # our own record unreadable: no check rather than a false stop
    return data if isinstance(data, dict) else None


# -- own tables' versions -------------------------------------------------------------------
def _read_record(f: Path, holds: str, recovery: str) -> dict[str, Any] | None:
    """A record of ours that a check depends on: None when there is none; a record that exists
    but cannot be read stops the run (exit 3), since the check would silently not run (tester:
    a truncated versions file let a lost aggregate commit through, a truncated definitions file
    a changed aggregate: wrong totals, exit 0)."""
    from cdc_lake.checkpoint import read_state_file

    return read_state_file(f, holds, recovery, lambda d: True)


def recorded_versions(checkpoint: Path, strict: bool = False) -> dict[str, dict[str, Any]]:
    """``name -> {"path": str, "version": int}`` as the last batch left the tables.
    ``strict`` (the check before a run): a file that cannot be read raises."""
    f = checkpoint / VERSIONS_FILE
    if strict:
        data = _read_record(f, "the version each output table was left at by the last batch, by "
                               "which a run notices a table that lost commits",
                            f"restore it from a copy; or make sure no output table lost commits "
                            f"(else rebuild with --reprocess), then move it aside (`{mv_aside(f)}`) "
                            "and run again: the next batch records the tables as they are") or {}
    else:
        data = _read_json(f) or {}
    tables = data.get("tables")
    if not isinstance(tables, dict):
        return {}
    return {n: e for n, e in tables.items() if isinstance(e, dict) and isinstance(e.get("path"), str)
            and isinstance(e.get("version"), int) and not isinstance(e.get("version"), bool)}


def recorded_marks(cfg: EnrichConfig, strict: bool = False) -> dict[str, tuple[int, str | None]]:
    """``table path -> (version, commit fingerprint)`` the last batch left each state table at.
    ``strict`` (maintenance): a record that exists but cannot be read raises, with the recovery
    the job prints for it (:func:`recorded_versions`)."""
    return {e["path"]: (e["version"], e["fingerprint"] if isinstance(e.get("fingerprint"), str)
                        else None) for e in recorded_versions(cfg.checkpoint_path, strict=strict).values()}


def record_versions(cfg: EnrichConfig, versions: dict[str, int | None]) -> None:
    """Record the Delta version each state table is at after a batch's writes (atomically)."""
    paths = state_tables(cfg)
    tables = recorded_versions(cfg.checkpoint_path)
    for name, v in versions.items():
        if name in paths and v is not None:
            prev = tables.get(name)
            if prev is not None and prev["path"] == str(paths[name]) and (prev["version"] > v or changed_behind(paths[name], prev["version"],
                                       prev.get("fingerprint") if isinstance(prev.get("fingerprint"), str)
                                       else None, app_prefix=f"enrich-{cfg.name}-", current=int(v))):
                continue  # another writer changed it meanwhile: keep the mark (cdc.state too)
            tables[name] = {"path": str(paths[name]), "version": int(v)}
            if (fp := commit_fingerprint(paths[name], int(v))) is not None:
                tables[name]["fingerprint"] = fp
    if tables:
        _write_json(cfg.checkpoint_path / VERSIONS_FILE, {"tables": tables})


def _load(path: Path) -> tuple[str | None, int | None]:
    from deltalake import DeltaTable

    try:
        return None, DeltaTable(str(path)).version()
    except OSError:
        raise  # the storage, not the table (may be transient): an ordinary failure
    except Exception as e:  # noqa: BLE001 - DeltaError (log JSON/parquet/protocol) and kin
        return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}", None


def _is_table(path: Path) -> bool:
    from deltalake import DeltaTable

    return DeltaTable.is_deltatable(str(path))


def has_committed(cfg: EnrichConfig) -> bool:
    """Whether this checkpoint has written anything: a batch Spark committed, or a recorded
    table version (a ``--reprocess`` snapshot is written before any Spark batch)."""
    return (last_committed_batch(cfg.checkpoint_path) is not None
            or bool(recorded_versions(cfg.checkpoint_path)))


def check_tables(cfg: EnrichConfig) -> None:
    """Raise :class:`EnrichNeedsReprocess` when an own state table is gone, unreadable or at a
    lower version than the last batch left it at (see the module doc)."""
    recorded = recorded_versions(cfg.checkpoint_path, strict=True)
    committed = last_committed_batch(cfg.checkpoint_path) is not None
    problems: list[str] = []
    for name, path in state_tables(cfg).items():
        entry = recorded.get(name)
        if entry is None:
            if committed and not recorded and name in ("enriched", "pending") \
                    and not _is_table(path):
                problems.append(f"the {name} table: no Delta table at {path}, but checkpoint "
                                f"{cfg.checkpoint_path} has committed batches")
            elif committed and not recorded and name.startswith("aggregate:") \
                    and not _is_table(path) and _enriched_rows(cfg):
                # the batch that first enriched a fact created every aggregate (its count moves
                # by one): gone now, it would be rebuilt from the new facts alone (noticed: the
                # record and the aggregate deleted together, wrong totals, exit 0)
                problems.append(f"the {name} table: no Delta table at {path}, but the enriched "
                                f"table {cfg.outputs.enriched} holds rows, which every aggregate "
                                "counted when they were written")
            continue
        last = entry["version"]
        if entry["path"] != str(path):
            if not (_is_table(path) and not _is_table(Path(entry["path"]))):
                problems.append(f"the {name} table is configured at {path}, but the checkpoint's "
                                f"batches wrote it at {entry['path']} (version {last})")
                continue
            # moved by hand with its log: the checks below run at the new path
        if not _is_table(path):
            problems.append(f"the {name} table: no Delta table at {path} any more (a batch of "
                            f"this checkpoint left it at version {last}; deleted or moved?)")
            continue
        why, version = _load(path)
        if why is not None:
            bypass = checkpoint_bypass(path)
            problems.append(f"the {name} table at {path}: its Delta log cannot be read ({why})"
                            + (f" (every commit file is there: first try moving its Delta "
                               f"checkpoint files aside, `{bypass}`, and run again; readers then "
                               "replay the commits, nothing is lost)" if bypass else ""))
        elif version is not None and version < last:
            problems.append(f"the {name} table at {path} is at Delta version {version}, but a "
                            f"batch of this checkpoint left it at version {last} (the newest "
                            f"_delta_log commit files were removed, or the table was replaced by "
                            f"an older copy)")
        elif version is not None and (why := changed_behind(
                path, last, entry.get("fingerprint") if isinstance(entry.get("fingerprint"), str)
                else None, app_prefix=f"enrich-{cfg.name}-", current=version)):
            problems.append(f"the {name} table at {path}: {why}")
    if problems:
        raise EnrichNeedsReprocess(
            f"pipeline {cfg.name}: " + "; ".join(problems) + ". The checkpoint counts those "
            "changes as written while the table no longer holds them, so this run stops instead "
            "of building on them (aggregates would stay wrong). Nothing was written. Recovery: "
            f"put the missing files back if you have them, else rebuild: {recovery_command(cfg)}")


# -- aggregate definitions ------------------------------------------------------------------
def definitions(cfg: EnrichConfig) -> dict[str, dict[str, Any]]:
    """What defines each aggregate's content: a change to any of it changes every group. That
    includes ``inputs``: where each column it groups by, sums or buckets by comes from, when a
    dimension gives it (the dimension's table, join and source column): a dimension's
    ``columns: {region: name}`` instead of ``{region: region}`` put store names next to regions
    in one aggregate, exit 0 (tester)."""
    out = {}
    for a in cfg.outputs.aggregates:
        bucketed = a.time_bucket != "none"
        used = set(a.group_by) | ({cfg.event_time} if bucketed and cfg.event_time else set())
        exprs = " ".join(e for _, e in a.sums)
        out[a.name] = {"path": str(a.path), "group_by": list(a.group_by),
                       "time_bucket": a.time_bucket, "sums": [list(s) for s in a.sums],
                       "event_time": cfg.event_time if bucketed else None,
                       "inputs": _lineage(cfg, used, exprs)}
    return out


def _lineage(cfg: EnrichConfig, used: set[str], exprs: str) -> dict[str, dict[str, Any]]:
    """Per output column a dimension gives that is in ``used`` or named in the sums'
    expressions ``exprs`` (case-insensitive, as Spark resolves names): the dimension, its table,
    SCD kind, join and source column; and so on for the columns its join takes from an earlier
    dimension, and for the event time an SCD2 dimension joins as of (a changed mapping of
    either regrouped the aggregate, exit 0: tester)."""
    producer = {name.lower(): (name, d, source) for d in cfg.dimensions for name, source in d.columns}
    wanted = {u.lower() for u in used}
    todo = [n for n in producer if n in wanted or re.search(
        r"(?<![\w`])`?" + re.escape(n) + r"`?(?![\w`])", exprs, re.IGNORECASE)]
    out: dict[str, dict[str, Any]] = {}
    while todo:
        name, d, source = producer[todo.pop()]
        if name in out:
            continue
        out[name] = {"dimension": d.name, "table": str(d.table), "scd": d.scd,
                     "on": [list(p) for p in d.on], "column": source}
        upstream = [c for c, _ in d.on] + ([cfg.event_time] if d.scd == 2 and cfg.event_time else [])
        if d.scd == 2:
            out[name]["as_of"] = cfg.event_time
        todo += [c.lower() for c in upstream if c.lower() in producer]
    return out


def record_definitions(cfg: EnrichConfig) -> None:
    _write_json(cfg.checkpoint_path / DEFINITIONS_FILE, {"aggregates": definitions(cfg)})


def check_definitions(cfg: EnrichConfig) -> None:
    """ConfigError (exit 2) when an output table belongs to another pipeline
    (:func:`check_owners`, checked first: before this writes anything), or an aggregate is new or
    changed on a pipeline that already committed batches; records the definitions otherwise (a
    removed aggregate is dropped)."""
    problems = check_owners(cfg, owned_outputs(cfg))
    if problems:
        raise owner_error(cfg, problems, "this run stopped before writing anything")
    now = definitions(cfg)
    if not has_committed(cfg):
        record_definitions(cfg)
        return
    f = cfg.checkpoint_path / DEFINITIONS_FILE
    data = _read_record(f, "the aggregate definitions the stored groups were counted with, by which "
                           "a run refuses a changed aggregate",
                        f"restore it from a copy; or, only if the YAML's aggregates did not change "
                        f"since the last run, move it aside (`{mv_aside(f)}`) and run again (that "
                        f"run records them as they are); else rebuild: {recovery_command(cfg)}")
    before = data.get("aggregates") if isinstance(data, dict) else None
    if not isinstance(before, dict):
        # a checkpoint from before definitions were recorded: an aggregate table that does not
        # exist was never maintained by it
        before = {n: d for n, d in now.items() if _is_table(Path(d["path"]))}
    for name, d in now.items():
        old = before.get(name)
        if old is not None and all(old.get(k) == v for k, v in d.items() if k in old):
            continue  # (a record of an older version lacks "inputs": it is recorded below)
        if old is None:
            what = (f"is new on a pipeline that has already processed fact changes "
                    f"(checkpoint {cfg.checkpoint_path}): maintained incrementally from now on, "
                    f"it would count only the facts processed from now on")
        else:
            diff = ", ".join(f"{k}: {old.get(k)!r} -> {d.get(k)!r}" for k in d
                             if k in old and old.get(k) != d.get(k))
            what = (f"changed since the pipeline's committed batches were counted ({diff}): its "
                    f"stored groups were computed with the old definition, and signed deltas "
                    f"from now on would mix both")
        raise ConfigError(cfg.file, f"outputs.aggregates.{name}", (
            f"aggregate {name!r} {what}. Rebuild every output with the new definition: "
            f"{recovery_command(cfg)} (or undo the change in the YAML)"))
    if before != now:
        record_definitions(cfg)  # aggregates removed from the YAML: no longer maintained


# -- reset ----------------------------------------------------------------------------------
def _nested_tables(folder: Path, own_table: bool) -> list[Path]:
    """Delta tables (folders with ``_delta_log``) under ``folder``; ``folder`` itself only
    when ``own_table`` is False."""
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(folder):
        here = Path(dirpath)
        if "_delta_log" in dirnames:
            if not (own_table and here == folder):
                found.append(here)
            dirnames.remove("_delta_log")
        if "_change_data" in dirnames:
            dirnames.remove("_change_data")
    return found


def check_reset(cfg: EnrichConfig, outputs: list[tuple[str, Path]]) -> None:
    """Before ``--reprocess`` deletes anything: the checkpoint holds no Delta table, and each
    output to delete is a Delta table (or absent/empty) holding no other table. ConfigError
    naming the key and the path otherwise; nothing deleted. An output table another pipeline
    owns (:func:`check_owners`) is refused the same way."""
    owners = check_owners(cfg, outputs)
    if owners:
        raise owner_error(cfg, owners, "--reprocess deleted nothing")
    cp = cfg.checkpoint_path
    problems: list[tuple[str, str]] = []
    if cp.is_dir():
        tables = _nested_tables(cp, own_table=False)
        if tables:
            problems.append(("storage.checkpoint", f"{cp} holds Delta table(s) "
                             f"{', '.join(map(str, tables[:5]))} that this job does not own"))
    for key, path in outputs:
        if path.is_symlink():
            problems.append((key, f"{path} is a symbolic link (to {os.path.realpath(path)})"))
        elif path.is_dir():
            nested = _nested_tables(path, own_table=True)
            if nested:
                problems.append((key, f"{path} holds other Delta table(s) "
                                 f"{', '.join(map(str, nested[:5]))}"))
            elif not (path / "_delta_log").is_dir() and any(path.iterdir()):
                problems.append((key, f"{path} is a non-empty folder that is not a Delta table"))
        elif path.exists():
            problems.append((key, f"{path} is a file, not a Delta table"))
    if problems:
        key, _ = problems[0]
        raise ConfigError(cfg.file, key, (
            "--reprocess deletes the checkpoint and the output tables, and refuses to delete "
            "what this job does not own: " + "; ".join(f"{k}: {m}" for k, m in problems)
            + ". Nothing was deleted. Point the key at a folder of its own (or move the "
            "foreign data away), then run again"))


# -- owner of each output table ---------------------------------------------------------------
# The owner mark: the Delta transaction app id (``txn`` action) every write of a cdc-lake job
# carries — ``enrich-<pipeline>-<instance>-<table>`` (enrich.writer), ``cdc-<pipeline>-...``
# (cdc.job), ``dimension-<pipeline>`` (dimensions). Pipeline names match NAME_RE (no '-'), so
# the second field is the pipeline.
def owned_outputs(cfg: EnrichConfig) -> list[tuple[str, Path]]:
    """The output tables only this pipeline writes (and ``--reprocess`` deletes), by YAML key;
    the quarantine is left out: an append-only log several pipelines may share (rows carry
    ``pipeline``)."""
    o = cfg.outputs
    return [("outputs.enriched", o.enriched), ("outputs.pending", o.pending),
            ("outputs.manifest", o.manifest),
            *[(f"outputs.aggregates.{a.name}.path", a.path) for a in o.aggregates]]


def _enriched_rows(cfg: EnrichConfig) -> bool:
    return _is_table(cfg.outputs.enriched) and holds_rows(cfg.outputs.enriched)


def check_owners(cfg: EnrichConfig, outputs: list[tuple[str, Path]]) -> list[tuple[str, str]]:
    """``(key, problem)`` for each output that is an existing Delta table not owned by this
    pipeline (see the module doc); [] when every output is absent or this pipeline's."""
    recorded = {e["path"] for e in recorded_versions(cfg.checkpoint_path).values()}
    problems: list[tuple[str, str]] = []
    for key, path in outputs:
        if not (path / "_delta_log").is_dir():
            continue
        foreign, mine = foreign_writers(path, "enrich", cfg.name)
        if foreign:
            problems.append((key, (
                f"the Delta table {path} belongs to {describe_writers(foreign)}"
                + (f" and was also written by this pipeline {cfg.name!r}: two pipelines have "
                   "merged their rows into it" if mine else "")
                + f", not to this pipeline {cfg.name!r}")))
        elif not mine and str(path) not in recorded and holds_rows(path):
            problems.append((key, (
                f"the Delta table {path} holds rows but carries no owner mark (no "
                f"Delta transaction of a cdc-lake job) and this pipeline's records "
                f"({cfg.checkpoint_path / VERSIONS_FILE}) do not list it: made by hand, by "
                f"another tool, or copied without its log; not this pipeline's ({cfg.name!r})")))
    return problems


def owner_error(cfg: EnrichConfig, problems: list[tuple[str, str]], what: str) -> ConfigError:
    key = problems[0][0]
    return ConfigError(cfg.file, key, (
        "an output table of this pipeline is not its own: "
        + "; ".join(m if i == 0 else f"{k}: {m}" for i, (k, m) in enumerate(problems))
        + f". Writing into it would mix two pipelines' rows, and `--reprocess` would delete the "
        f"other's data, so {what}. Give {key} a path of its own in {cfg.file} (pipelines in one "
        "folder are also checked against each other when Airflow loads the DAGs). A table two "
        "pipelines have both written holds mixed rows: after giving each its own path, move it "
        "aside and run each pipeline with --reprocess"))
