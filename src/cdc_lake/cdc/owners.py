"""Is every existing table a CDC run is about to write this pipeline's own? (the owner check)

Every write of the CDC job carries the owner mark ``cdc-<pipeline>-...`` (a Delta transaction,
:mod:`cdc_lake.table_writers`): the incremental MERGEs and appends, and a full refresh's
replacing commit. Before a run writes, each configured table and tombstone table that exists is
read for its marks:

* a mark of another writer (another CDC pipeline, a dimension or enrichment pipeline): the
  table is someone else's. Two pipeline YAMLs that name one table path (two YAMLs sharing one
  ``storage.root`` with a table name in common, run by hand: Airflow refuses them when it loads
  the DAGs) used to merge their rows into one table with exit 0; the owner's next run stopped
  only afterwards, with the rows already mixed (tester). A table marked by both pipelines holds
  mixed rows and is refused too.
* no mark at all, and this checkpoint's records do not list it: with rows, or without the
  columns every table of the job has (the keys and ``_cdc_seq``), it was made by hand, by
  another tool, or copied without its log. Not this pipeline's either (an empty hand-made table
  of other columns used to fail the MERGE deep in delta-rs, exit 1).

A mark of this pipeline under another checkpoint instance (the checkpoint was moved aside and
the landing history is read again) is its own: that is the documented reset. An empty unmarked
table with those columns (left by a run stopped between creating the table and its first write,
a commit without a mark) is taken.

The refusal is a :class:`~cdc_lake.checkpoint_log.PipelineStateError` (exit 3, nothing
written, and the table is not recorded as this pipeline's).

Example::

    check_owners(cfg)                      # before an incremental run writes
    check_owners(cfg, tables={"orders"})   # before a full refresh replaces orders
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cdc_lake.cdc.config import PipelineConfig
from cdc_lake.cdc.state import TableStateError
from cdc_lake.cdc.table_records import VERSIONS_FILE, is_table, recorded_versions
from cdc_lake.checkpoint import TABLES_FILE, written_tables
from cdc_lake.checkpoint_log import PipelineStateError
from cdc_lake.paths import mv_aside
from cdc_lake.table_writers import describe_writers, foreign_writers, holds_rows


class TableOwnedElsewhere(TableStateError):
    """A table this pipeline would write belongs to another writer (or holds mixed rows)."""

    consequence = ("writing into it would mix two writers' rows (and a full refresh would "
                   "replace the other's), so this run stops and writes nothing")


_MIXED = "two pipelines have merged their rows into it"


def _recorded(cfg: PipelineConfig) -> set[str]:
    """Table paths this checkpoint's records list (unreadable records: none)."""
    try:
        written = written_tables(cfg.checkpoint_path)
    except PipelineStateError:
        written = {"tables": {}, "tombstones": {}}
    return ({*written["tables"].values(), *written["tombstones"].values()}
            | set(recorded_versions(cfg.checkpoint_path)))


def owner_problems(cfg: PipelineConfig, tables: Iterable[str] | None = None) -> list[tuple[str, Path, str]]:
    """``(table, path, why)`` for each existing table (or tombstone table) of ``tables`` (default:
    all configured) that is not this pipeline's; [] when all are absent or its own."""
    recorded = _recorded(cfg)
    problems: list[tuple[str, Path, str]] = []
    for name in sorted(cfg.tables if tables is None else tables):
        for label, path in (("table", cfg.tables[name].path),
                            ("tombstone table", cfg.tombstone_path(name))):
            if not is_table(path):
                continue
            foreign, mixed = foreign_writers(path, "cdc", cfg.name)
            if foreign:
                problems.append((name, path, (
                    f"the {label} of {name!r} at {path} belongs to {describe_writers(foreign)}"
                    + (f" and was also written by this pipeline {cfg.name!r}: {_MIXED}"
                       if mixed else "")
                    + ("; if that pipeline is this one under a former name, move the table "
                       "aside and rebuild it under this name with --full-refresh"
                       if not mixed and any(a.startswith("cdc-") for a in foreign) else ""))))
            elif not mixed and str(path) not in recorded:
                unmarked = (f"the {label} of {name!r} at {path} carries no owner mark (no Delta "
                            f"transaction of a cdc-lake job) and this checkpoint's records "
                            f"({cfg.checkpoint_path / TABLES_FILE}, {VERSIONS_FILE}) do not list it")
                if holds_rows(path):
                    problems.append((name, path, (
                        f"{unmarked}, yet it holds rows: made by hand, by another tool, or "
                        "copied without its log")))
                elif (lacking := _lacking_columns(path, [*cfg.tables[name].keys, "_cdc_seq"])):
                    problems.append((name, path, (
                        f"{unmarked}, and it lacks the column(s) {lacking} every table of this "
                        "job has (the keys and _cdc_seq): an empty table made by hand or by "
                        "another tool, not one a stopped run of this job created")))
    return problems


def _lacking_columns(path: Path, columns: list[str]) -> list[str]:
    """Which of ``columns`` the table's schema lacks (names compared without case)."""
    from deltalake import DeltaTable

    try:
        have = {f.name.lower() for f in DeltaTable(str(path)).schema().fields}
    except Exception:  # noqa: BLE001 - an unreadable log: the run's own reads report it
        return []
    return [c for c in columns if c.lower() not in have]


def check_owners(cfg: PipelineConfig, tables: Iterable[str] | None = None) -> None:
    """Raise :class:`TableOwnedElsewhere` naming each table of ``tables`` (default: all
    configured) that exists and is not this pipeline's (see the module doc)."""
    problems = owner_problems(cfg, tables)
    if not problems:
        return
    names = sorted({n for n, _, _ in problems})
    mixed = [p for _, p, why in problems if _MIXED in why]
    keys = ", ".join(f"tables.{n}.path" for n in names)
    raise TableOwnedElsewhere(names, f"pipeline {cfg.name!r} ({cfg.file}): " + "; ".join(
        why for _, _, why in problems), (
        f"give the table a path of its own ({keys} in {cfg.file}, or a storage.root of its own)"
        + (f"; a table two pipelines have both written holds mixed rows: after giving each its "
           f"own path, move it aside (`{' && '.join(mv_aside(p, '.mixed') for p in mixed)}`) and "
           "rebuild each pipeline's table with --full-refresh" if mixed else "")))
