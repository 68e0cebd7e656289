"""A table's definition in the YAML changed on a running pipeline: stop before the tables mix two.

What a target table holds depends on three settings of ``tables.<t>``: its ``keys`` (what a row
is), its ``scd`` (one row per key, or version rows) and its source (``source_table`` in
``database``). The checkpoint records them for every table its runs wrote
(``<checkpoint>/cdc_table_definitions.json``). Changed on a running pipeline, the next runs
would MERGE new changes into a table built under the old definition (tester, 2026-11-29: ``scd:
2`` removed, SCD2 version rows and SCD1 rows in one table, exit 0; ``keys`` changed, a delta-rs
traceback, exit 1). A table newly listed for a source the earlier runs already read (a table
renamed in the YAML, or added after its events were quarantined as an unknown table, or after
its source was in ``ignore_tables``) would hold only the changes from now on (tester: exit 0,
the history missing).

Beyond these three, the record holds what else decides a stored value (tester, 2026-11-29,
each exit 0 before): the **column selection** (``columns`` / ``exclude_columns``: a column kept
from now on that earlier runs dropped is NULL in every row stored so far; a column of the table
dropped from now on is NULL in rows changed from now on and stale in the others), the
**source format** (binlog positions of two formats do not compare: a Debezium update after a
Maxwell insert counted as older and was dropped) and ``ignore_tables``. A ``types`` pin is
compared with the stored column itself: one that is neither its type nor a lossless widening of
it (which the run applies: ``decimal(10,2)`` -> ``decimal(12,4)``) would have values checked
against the pin and stored cast to the table's type (``5.1234`` stored as ``5.12``, ``2.5`` as
``2``; text into a bigint column failed every run).

:func:`check_definitions` stops such a run with a :class:`~cdc_lake.config.ConfigError`
(exit 2, no retry) naming the table, the setting and both values, and the fix: rebuild the
table from the landing history with a full refresh of it (which records the new definition),
or put the YAML back. :func:`record_definitions` runs after every successful run.

Example::

    check_definitions(cfg)      # before an incremental run (a full refresh is not checked)
    record_definitions(cfg)     # after it; after a full refresh of orders:
    record_definitions(cfg, rebuilt={"orders"}, checked=False)
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from cdc_lake.cdc.config import PipelineConfig, TableConfig
from cdc_lake.cdc.table_records import is_table
from cdc_lake.cdc.widening import pin_fits
from cdc_lake.checkpoint import read_state_file
from cdc_lake.config import ConfigError
from cdc_lake.paths import mv_aside

DEFINITIONS_FILE = "cdc_table_definitions.json"
FIELDS = ("keys", "scd", "source")
SELECTION = ("columns", "exclude_columns")


def definition(t: TableConfig) -> dict[str, Any]:
    """What a table's rows mean: ``{"keys": [...], "scd": 1|2, "source": "db.table",
    "columns": [...] | None, "exclude_columns": [...]}`` (``*.table`` when the YAML matches the
    table in any database; column names lower-case, as the selection matches any spelling)."""
    return {"keys": list(t.keys), "scd": t.scd, "source": f"{t.database or '*'}.{t.source_table}",
            "columns": None if t.columns is None else sorted({c.lower() for c in t.columns}),
            "exclude_columns": sorted({c.lower() for c in t.exclude_columns})}


def pipeline_definition(cfg: PipelineConfig) -> dict[str, Any]:
    """What decides every table of the pipeline: the source format and ``ignore_tables``."""
    return {"format": cfg.source_format, "ignore_tables": sorted(cfg.ignore_tables)}


def _read(cfg: PipelineConfig) -> dict[str, dict[str, Any]] | None:
    data = _read_all(cfg)
    return None if data is None else data["tables"]


def _read_all(cfg: PipelineConfig) -> dict[str, Any] | None:
    """The record: ``{"tables": {name: definition}, "pipeline": {...}}`` (``pipeline`` absent
    in a record from before it)."""
    f = cfg.checkpoint_path / DEFINITIONS_FILE
    data = read_state_file(
        f, "each table's keys, scd and source as this checkpoint's runs wrote it, by which a run "
           "notices a YAML change that would mix two definitions in one table",
        f"move it aside (`{mv_aside(f)}`) and run again: that run records the YAML's definitions "
        "as they are then. Before, make sure the YAML's tables.<t>.keys / scd / source_table are "
        "what the tables were built with",
        lambda d: isinstance(d.get("tables"), dict))
    if data is None:
        return None
    pipe = data.get("pipeline")
    return {"tables": {n: d for n, d in data["tables"].items() if isinstance(d, dict)},
            "pipeline": pipe if isinstance(pipe, dict) else {}}


def _quarantined_unknown(cfg: PipelineConfig, t: TableConfig) -> int:
    """How many lines of this pipeline the quarantine holds as events of an unknown table that
    this table's source now matches."""
    if not is_table(cfg.quarantine_path):
        return 0
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    ds = DeltaTable(str(cfg.quarantine_path)).to_pyarrow_dataset()
    names = set(ds.schema.names)
    if not {"reason", "source_table"} <= names:
        return 0
    prefix = f"unknown table {t.database}.{t.source_table} (" if t.database else "unknown table "
    cond = (pc.field("source_table") == t.source_table) & pc.starts_with(pc.field("reason"), prefix)
    if "pipeline" in names:
        cond = cond & (pc.field("pipeline") == cfg.name)
    return ds.count_rows(filter=cond)


def _wanted(column: str, d: dict[str, Any]) -> bool:
    """Whether definition ``d``'s selection keeps ``column`` (lower-case)."""
    cols = d.get("columns")
    return column not in d.get("exclude_columns", []) and (cols is None or column in cols)


def _selection_change(name: str, was: dict[str, Any], now: dict[str, Any],
                      stored: dict[str, str]) -> str | None:
    """What a ``columns`` / ``exclude_columns`` change would leave inconsistent in a table whose
    columns are ``stored`` (lower-case name -> type), or None when nothing (a column dropped
    that the table never held; a record from before the selection was recorded)."""
    if any(f not in was for f in SELECTION):
        return None
    if was["columns"] is not None and now["columns"] is None:
        return (f"tables.{name}.columns: {was['columns']!r} -> every column: the columns left out "
                "so far would be NULL in every row stored so far")
    kept = sorted(c for c in {*was["exclude_columns"], *(now["columns"] or [])}
                  if _wanted(c, now) and not _wanted(c, was))
    dropped = sorted(c for c in stored if _wanted(c, was) and not _wanted(c, now))
    parts = []
    if kept:
        parts.append(f"column(s) {kept} are kept from now on, but the runs so far dropped them: "
                     "every row stored so far would lack their values (NULL)")
    if dropped:
        parts.append(f"column(s) {dropped} of the table are dropped from now on: rows changed from "
                     "now on would have them NULL, the other rows keep older values")
    if not parts:
        return None
    return (f"tables.{name}.columns / exclude_columns changed (columns {was['columns']!r} -> "
            f"{now['columns']!r}, exclude_columns {was['exclude_columns']!r} -> "
            f"{now['exclude_columns']!r}): " + "; ".join(parts))


def _stored_types(t: TableConfig) -> dict[str, str]:
    """The table's columns as lower-case name -> Delta type (empty when there is no table)."""
    if not is_table(t.path):
        return {}
    from deltalake import DeltaTable

    return {f.name.lower(): str(getattr(f.type, "type", f.type)).lower()
            for f in DeltaTable(str(t.path)).schema().fields}


def _pin_changes(name: str, t: TableConfig, stored: dict[str, str]) -> list[str]:
    """``types`` pins the stored column cannot take: neither its type nor a lossless widening of
    it (which the run applies before writing)."""
    out = []
    for col, pin in sorted(t.types.items()):
        have = stored.get(col.lower())
        if have is not None and not pin_fits(have, pin):
            out.append(f"tables.{name}.types.{col}: {pin!r}, but the table stores the column as "
                       f"{have!r}, and {pin} is no lossless widening of it: values would be "
                       f"checked against {pin} and stored cast to {have} (rounded, truncated, or "
                       f"failing the run); a full refresh builds the column as {pin} and "
                       "quarantines the stored values it cannot hold")
    return out


def _ignored_by(t: TableConfig, patterns: list[str]) -> str | None:
    """The ``ignore_tables`` entry among ``patterns`` that matched this table's source."""
    for ig in patterns:
        db, _, tbl = ig.rpartition(".")
        if tbl == t.source_table and (not db or t.database is None or db == t.database):
            return ig
    return None


def check_definitions(cfg: PipelineConfig) -> None:
    """Raise :class:`ConfigError` when a table this checkpoint's runs wrote has another definition
    in the YAML now (keys, scd, source, column selection, a ``types`` pin its stored column
    cannot take), a newly listed table's source was read before, or the source format changed
    (see the module docstring). Nothing recorded (a new pipeline, or a checkpoint from before
    this record): nothing to compare; the run records the definitions. A full refresh is not
    checked: it builds the tables it rebuilds under the YAML's definitions and leaves the others
    alone."""
    from cdc_lake.cdc.state import refresh_command

    record = _read_all(cfg)
    if record is None:
        return
    recorded, pipe = record["tables"], record["pipeline"]
    if pipe.get("format") not in (None, cfg.source_format):
        raise ConfigError(cfg.file, "source.format", (
            f"{pipe['format']!r} -> {cfg.source_format!r} since this checkpoint's runs read the "
            f"landing folder {cfg.landing_path}: the binlog positions of two formats do not "
            "compare, so changes in the new format would be taken as older than the stored ones "
            "and dropped. Nothing was written. Fix: put source.format back, or land the new "
            "format's files for a new pipeline (its own `pipeline:` name, landing folder, "
            "checkpoint and tables) and build it from a snapshot or a full history"))
    ignored_before = [ig for ig in pipe.get("ignore_tables", []) if ig not in cfg.ignore_tables]
    problems: list[tuple[str, str]] = []  # (table, what changed)
    by_source = {d.get("source"): n for n, d in recorded.items()}
    for name, t in cfg.tables.items():
        now, was = definition(t), recorded.get(name)
        # a table taken out of the YAML and listed again: its events in between were quarantined
        # as an unknown table (tester: it resumed without them, exit 0)
        relisted = was is not None and was.get("listed") is False
        if was is None or relisted:
            other = by_source.get(now["source"]) if was is None else None
            if other is not None and other not in cfg.tables and not is_table(t.path):
                problems.append((name, f"tables.{name} reads source {now['source']}, which this "
                                       f"checkpoint's runs wrote to table {other!r} (no longer in the YAML: "
                                       f"renamed?); {name} would hold only the changes from now on"))
            elif (ig := _ignored_by(t, ignored_before)) is not None and not is_table(t.path):
                problems.append((name, f"tables.{name} is newly listed, but the runs so far dropped "
                                       f"the events of its source {now['source']} (ignore_tables: "
                                       f"{ig!r}); {name} would hold only the changes from now on"))
            elif (n := _quarantined_unknown(cfg, t)) > 0:
                again = "listed again after it left the YAML" if relisted else "newly listed"
                problems.append((name, f"tables.{name} is {again}, but {n} earlier event(s) of "
                                       f"its source {now['source']} are in the quarantine as an "
                                       f"unknown table; {name} would lack them"))
            if was is None:
                continue
        if not is_table(t.path):
            continue  # never written: nothing built under the old definition
        changed = [f"tables.{name}.{f}: {was.get(f)!r} -> {now[f]!r}" for f in FIELDS if was.get(f) != now[f]]
        stored = _stored_types(t) if t.types or any(was.get(f) != now[f] for f in SELECTION) \
            else {}
        selection = _selection_change(name, was, now, stored)
        changed += ([selection] if selection else []) + _pin_changes(name, t, stored)
        if changed:
            problems.append((name, f"{'; '.join(changed)} since this checkpoint's runs wrote the "
                                   f"table at {t.path} (it holds rows built under the old value)"))
    if problems:
        names = sorted({n for n, _ in problems})
        raise ConfigError(cfg.file, f"tables.{names[0]}", (
            f"{' | '.join(p for _, p in problems)}. Nothing was written. Fix: "
            f"{refresh_command(cfg, names)} (records the new definition), or put the YAML back"))


def record_definitions(cfg: PipelineConfig, rebuilt: frozenset[str] | set[str] = frozenset(),
                       checked: bool = True) -> None:
    """After a successful run: record the definition of each table the YAML lists, when this
    run ran :func:`check_definitions` over it (``checked``: every listed table passed it) or
    rebuilt it (a full refresh); the pipeline's format and ``ignore_tables`` likewise when it was
    checked or every listed table was rebuilt. A table a partial full refresh left alone keeps
    its old record, so the next run still stops on a change to it."""
    record = _read_all(cfg) or {"tables": {}, "pipeline": {}}
    recorded = record["tables"]
    out = dict(recorded)
    for name, t in cfg.tables.items():
        if checked or name in rebuilt:
            out[name] = {**definition(t), "listed": True}
    for name, d in recorded.items():  # left the YAML: if listed again, checked like a new table
        if checked and name not in cfg.tables:
            out[name] = {**d, "listed": False}
    pipe = record["pipeline"]
    if checked or set(cfg.tables) <= set(rebuilt):
        pipe = pipeline_definition(cfg)
    f = cfg.checkpoint_path / DEFINITIONS_FILE
    if out == recorded and pipe == record["pipeline"] and f.exists():
        return
    cfg.checkpoint_path.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps({"tables": out, "pipeline": pipe}, indent=1, sort_keys=True),
                   encoding="utf-8")
    os.replace(tmp, f)
