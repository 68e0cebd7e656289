"""A table's definition in the YAML changed on a running pipeline: stop before the tables mix two.

What a target table holds depends on three settings of ``tables.<t>``: its ``keys`` (what a row
is), its ``scd`` (one row per key, or version rows) and its source (``source_table`` in
``database``). The checkpoint records them for every table its runs wrote
(``<checkpoint>/cdc_table_definitions.json``). Changed on a running pipeline, the next runs
would MERGE new changes into a table built under the old definition (tester, 2026-11-29: ``scd:
2`` removed, SCD2 version rows and SCD1 rows in one table, exit 0; ``keys`` changed, a delta-rs
traceback, exit 1). A table newly listed for a source the earlier runs already read (a table
renamed in the YAML, or added after its events were quarantined as an unknown table) would
hold only the changes from now on (tester: exit 0, the history missing).

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
from cdc_lake.checkpoint import read_state_file
from cdc_lake.config import ConfigError
from cdc_lake.paths import mv_aside

DEFINITIONS_FILE = "cdc_table_definitions.json"
FIELDS = ("keys", "scd", "source")


def definition(t: TableConfig) -> dict[str, Any]:
    """What a table's rows mean: ``{"keys": [...], "scd": 1|2, "source": "db.table"}``
    (``*.table`` when the YAML matches the table in any database)."""
    return {"keys": list(t.keys), "scd": t.scd, "source": f"{t.database or '*'}.{t.source_table}"}


def _read(cfg: PipelineConfig) -> dict[str, dict[str, Any]] | None:
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
    return {n: d for n, d in data["tables"].items() if isinstance(d, dict)}


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


def check_definitions(cfg: PipelineConfig) -> None:
    """Raise :class:`ConfigError` when a table this checkpoint's runs wrote has another definition
    in the YAML now, or a newly listed table's source was read before (see the module
    docstring). Nothing recorded (a new pipeline, or a checkpoint from before this record):
    nothing to compare; the run records the definitions. A full refresh is not checked: it
    builds the tables it rebuilds under the YAML's definitions and leaves the others alone."""
    from cdc_lake.cdc.state import refresh_command

    recorded = _read(cfg)
    if recorded is None:
        return
    problems: list[tuple[str, str]] = []  # (table, what changed)
    by_source = {d.get("source"): n for n, d in recorded.items()}
    for name, t in cfg.tables.items():
        now, was = definition(t), recorded.get(name)
        if was is None:
            other = by_source.get(now["source"])
            if other is not None and other not in cfg.tables and not is_table(t.path):
                problems.append((name, f"tables.{name} reads source {now['source']}, which this "
                                       f"checkpoint's runs wrote to table {other!r} (no longer in the YAML: "
                                       f"renamed?); {name} would hold only the changes from now on"))
            elif (n := _quarantined_unknown(cfg, t)) > 0:
                problems.append((name, f"tables.{name} is newly listed, but {n} earlier event(s) of "
                                       f"its source {now['source']} are in the quarantine as an "
                                       f"unknown table; {name} would hold only the changes from now on"))
            continue
        if not is_table(t.path):
            continue  # never written: nothing built under the old definition
        changed = [f"tables.{name}.{f}: {was.get(f)!r} -> {now[f]!r}" for f in FIELDS if was.get(f) != now[f]]
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
    """After a successful run: record the definition of each table the YAML lists that is
    unchanged, rebuilt by this run (a full refresh), or new (only when this run ran
    :func:`check_definitions` over it: ``checked``). A changed table keeps its old record, so
    the next run still stops on it."""
    recorded = _read(cfg) or {}
    out = dict(recorded)
    for name, t in cfg.tables.items():
        now = definition(t)
        if name in rebuilt or recorded.get(name) == now or (checked and name not in recorded):
            out[name] = now
    if out == recorded and (cfg.checkpoint_path / DEFINITIONS_FILE).exists():
        return
    cfg.checkpoint_path.mkdir(parents=True, exist_ok=True)
    f = cfg.checkpoint_path / DEFINITIONS_FILE
    tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps({"tables": out}, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, f)
