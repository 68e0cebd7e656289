"""What a CDC checkpoint records about the Delta tables its runs wrote, read back by the checks
before the next run (:mod:`cdc_lake.cdc.state`) and by maintenance (:mod:`cdc_lake.pipeline_tables`).

* ``<checkpoint>/cdc_tables.json`` (:func:`record_tables`): which target and tombstone tables
  exist, so a table deleted behind its checkpoint is noticed instead of re-created with only
  the changes that arrive from then on.
* ``<checkpoint>/cdc_table_versions.json`` (:func:`record_versions`): the Delta version each
  table was left at, with the fingerprint of that version's commit, and the quarantine's and
  DDL log's (version, first commit): a table that lost its newest commits, or holds a row change
  another writer made, is noticed by the next run.

Example::

    record_tables(cfg)               # under the lock, after the run
    record_versions(cfg)             # after every run, a full refresh too
    recorded_marks(cfg)              # {"/lake/shop/orders": (12, "9c1f...")}
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from cdc_lake.checkpoint import read_state_file, record_written_tables
from cdc_lake.checkpoint_log import PipelineStateError
from cdc_lake.cdc.config import PipelineConfig
from cdc_lake.paths import mv_aside
from cdc_lake.table_marks import changed_behind, commit_fingerprint

VERSIONS_FILE = "cdc_table_versions.json"


def is_table(path: Path) -> bool:
    """Whether a Delta table is at ``path``."""
    return DeltaTable.is_deltatable(str(path))


def load_table(path: Path, app: str | None = None) -> tuple[str | None, int | None, int | None]:
    """``(why the table cannot be loaded, None, None)`` or ``(None, its version, the last
    transaction version it holds for ``app``)`` (one log replay for both)."""
    try:
        dt = DeltaTable(str(path))
        version = dt.version()
        txn = dt.transaction_version(app) if app is not None else None
    except OSError:
        raise  # the storage, not the table (may be transient): an ordinary failure, retried
    except Exception as e:  # noqa: BLE001 - DeltaError (log JSON/parquet/protocol) and kin
        return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}", None, None
    return None, version, txn


def record_tables(cfg: PipelineConfig) -> None:
    """Record the configured tables that exist now as written by this checkpoint."""
    tables = {n: str(t.path) for n, t in cfg.tables.items() if is_table(t.path)}
    tombstones = {n: str(cfg.tombstone_path(n)) for n in cfg.tables if is_table(cfg.tombstone_path(n))}
    if tables or tombstones:
        record_written_tables(cfg.checkpoint_path, tables, tombstones)


def recorded_versions(checkpoint: Path, strict: bool = False, key: str = "versions") -> dict[str, Any]:
    """``table path -> Delta version`` a run of this checkpoint left it at (empty if unknown);
    ``key="fingerprints"``: ``table path -> fingerprint of that version's commit``.
    ``strict``: an unreadable file raises :class:`~cdc_lake.checkpoint.StateFileDamaged` (the
    check before a run); else it counts as empty (recording after a run rewrites it)."""
    f = checkpoint / VERSIONS_FILE
    try:
        data = read_state_file(
            f, "the Delta version each table was left at by this checkpoint's runs, by which a "
               "run notices a table that lost its newest commits",
            f"move it aside (`{mv_aside(f)}`) and run again: that run records every table's "
            "version then, and the check resumes from there. Before, make sure no table lost "
            "commits: the last run summary (latest.json under the pipeline's runs folder) gives "
            "each table's delta_version; a table now below it needs --full-refresh --tables <table>",
            lambda d: isinstance(d.get("versions", {}), dict))
    except PipelineStateError:
        if strict:
            raise
        data = None
    entries = data.get(key) if data is not None else None
    if not isinstance(entries, dict):
        return {}
    if key == "fingerprints":
        return {p: v for p, v in entries.items() if isinstance(v, str)}
    if key == "side_tables":
        return dict(entries)
    return {p: v for p, v in entries.items() if isinstance(v, int) and not isinstance(v, bool)}


def recorded_marks(cfg: PipelineConfig, strict: bool = False) -> dict[str, tuple[int, str | None]]:
    """``table path -> (version, commit fingerprint)`` the last run left each table at (for
    :mod:`cdc_lake.table_marks`; maintenance checks them before it touches a table).
    ``strict``: an unreadable record raises (see :func:`_recorded_versions`)."""
    fps = recorded_versions(cfg.checkpoint_path, strict=strict, key="fingerprints")
    return {p: (v, fps.get(p)) for p, v in recorded_versions(cfg.checkpoint_path, strict=strict).items()}


def record_versions(cfg: PipelineConfig, rebuilt: frozenset[str] | set[str] = frozenset()) -> None:
    """Record the Delta version (and its commit's fingerprint) of every configured table and
    tombstone table that exists now (atomically), for the checks 4 and 4b of
    :func:`cdc_lake.cdc.state.check_state`.
    Call after every run under the lock, a full refresh included (``rebuilt``: the tables it
    replaced, recorded as they are now).

    A table's mark advances only when the table is still intact since its previous mark
    (:func:`~cdc_lake.table_marks.changed_behind`): a row change by another writer made during
    the run, or one a full refresh of *other* tables would otherwise have re-recorded as the new
    normal, keeps the old mark, so the next run still stops on it (tester: a full refresh of
    `orders` cleared a hand DELETE on `products`, exit 0)."""
    names = [(n, t.path) for n, t in cfg.tables.items()] + \
        [(n, cfg.tombstone_path(n)) for n in cfg.tables]
    versions = dict(recorded_versions(cfg.checkpoint_path))
    fingerprints = dict(recorded_versions(cfg.checkpoint_path, key="fingerprints"))
    for name, path in names:
        if is_table(path):
            problem, version, _ = load_table(path)
            if problem is None and version is not None:
                last = versions.get(str(path))
                if name not in rebuilt and last is not None and (version < last or changed_behind(
                        path, last, fingerprints.get(str(path)), app_prefix=f"cdc-{cfg.name}-",
                        current=version)):
                    continue  # keep the mark: the next run's check names the change
                versions[str(path)] = version
                fingerprints.pop(str(path), None)
                if (fp := commit_fingerprint(path, version)) is not None:
                    fingerprints[str(path)] = fp
    # quarantine / DDL log (maybe shared with other pipelines: only a lower version counts,
    # on the same table: (version, fingerprint of its first commit))
    side = dict(recorded_versions(cfg.checkpoint_path, key="side_tables"))
    for path in (cfg.quarantine_path, cfg.ddl_log_path):
        if is_table(path):
            problem, version, _ = load_table(path)
            first = commit_fingerprint(path, 0)
            mark = side.get(str(path))
            if problem is None and version is not None and not (
                    isinstance(mark, list) and len(mark) == 2 and mark[1] == first
                    and version < mark[0]):
                side[str(path)] = [version, first]
    if not versions and not side:
        return
    cfg.checkpoint_path.mkdir(parents=True, exist_ok=True)
    f = cfg.checkpoint_path / VERSIONS_FILE
    tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps({"versions": versions, "fingerprints": fingerprints,
                               "side_tables": side}, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, f)
