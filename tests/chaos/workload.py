"""Random CDC workloads for the chaos harness: landing files in arrival steps, plus the YAML.

Example::

    wl = make_workload(seed=3, fmt="canal")
    wl.write_yaml(tmp / "p.yaml", landing=tmp / "landing", lake=tmp / "lake")
    for step in wl.steps:            # each step: files to land, then run (and kill) the job
        for name, lines in step:
            ...

The history is serialized by the demo writers (``cdc_lake.demo.writers``); the expectation is
never computed here: the reference model parses the landed files itself.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from cdc_lake.demo.binlog import Binlog, BinlogEntry, DdlEvent, RowChange, Statement
from cdc_lake.demo.schema import Column, TableSchema
from cdc_lake.demo.writers import make_writer

KV = TableSchema("shop", "kv", (
    Column("k", "int(11)", nullable=False), Column("v", "varchar(64)"), Column("n", "int(11)"),
    Column("amt", "decimal(10,2)"), Column("d", "date")), ("k",))
PAIR = TableSchema("shop", "pair", (
    Column("a", "int(11)", nullable=False), Column("b", "int(11)", nullable=False),
    Column("s", "varchar(64)")), ("a", "b"))
SCHEMAS = {"kv": KV, "pair": PAIR}
STRINGS = ["a", "Zoë", "東京", "🎉", 'q " \\', ""]
VARIANTS = [("maxwell", {}), ("canal", {}), ("debezium", {"with_schema": True}),
            ("debezium", {"with_schema": False})]


def _value(rng: random.Random, col: Column) -> Any:
    if col.nullable and rng.random() < 0.15:
        return None
    if col.kind == "int":
        return rng.randint(-1000, 1000)
    if col.kind == "decimal":
        return Decimal(rng.randint(-9999999, 9999999)).scaleb(-2)
    if col.kind == "date":
        return date(2000, 1, 1) + timedelta(days=rng.randint(0, 9000))
    return rng.choice(STRINGS)


def random_entries(rng: random.Random, n_txns: int) -> list[BinlogEntry]:
    """Transactions over a tiny key space (keys collide): multi-row inserts, updates (some move
    the primary key), deletes, re-inserts; one ``ALTER TABLE kv ADD COLUMN`` somewhere."""
    schemas = dict(SCHEMAS)
    state: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {"kv": {}, "pair": {}}
    space = {"kv": [(k,) for k in range(5)], "pair": [(a, b) for a in range(2) for b in range(2)]}
    log = Binlog(max_file_size=10**9)
    ms = int(datetime(2026, 3, 1, 9, tzinfo=UTC).timestamp() * 1000)
    alter_at = rng.randrange(1, max(2, n_txns))
    out: list[BinlogEntry] = []

    def stmt(t: str) -> Statement | None:
        s, rows = schemas[t], state[t]
        free = [k for k in space[t] if k not in rows]
        op = rng.choice(["insert", "insert", "update", "update", "delete"])
        if op == "insert" and free:
            changes = []
            for k in rng.sample(free, min(len(free), rng.choice([1, 1, 2]))):
                r = {c.name: _value(rng, c) for c in s.columns}
                r.update(zip(s.pk, k, strict=True))
                rows[k] = r
                changes.append(RowChange(None, dict(r)))
            return Statement(s, "insert", tuple(changes))
        if op == "update" and rows:
            k = rng.choice(list(rows))
            before = rows.pop(k)
            after = dict(before)
            for c in rng.sample([c for c in s.columns if c.name not in s.pk], 1):
                after[c.name] = _value(rng, c)
            free_now = [f for f in space[t] if f not in rows and f != k]
            if free_now and rng.random() < 0.3:                       # primary-key change
                after.update(zip(s.pk, rng.choice(free_now), strict=True))
            rows[tuple(after[p] for p in s.pk)] = after
            return Statement(s, "update", (RowChange(dict(before), dict(after)),)) \
                if after != before else None
        if op == "delete" and rows:
            k = rng.choice(list(rows))
            return Statement(s, "delete", (RowChange(rows.pop(k), None),))
        return None

    for i in range(n_txns):
        ms += rng.choice([3, 700, 1000, 61_000])
        if rng.random() < 0.15:
            log.rotate()
        if i == alter_at:
            before = schemas["kv"]
            schemas["kv"] = before.with_column(Column("extra", "varchar(20)"))
            for r in state["kv"].values():
                r["extra"] = None
            out.append(log.ddl(ms, "table-alter", "ALTER TABLE `kv` ADD COLUMN `extra` varchar(20)",
                               before, schemas["kv"]))
            ms += 1
        sts = [s for s in (stmt(rng.choice(["kv", "kv", "pair"])) for _ in range(rng.choice([1, 2])))
               if s]
        if sts:
            out.append(log.transaction(ms, sts))
    return out


def debezium_ddl(ev: DdlEvent, with_schema: bool) -> str:
    """A Debezium schema-change record (the demo writer emits none: they live on another topic)."""
    payload = {"source": {"version": "2.7.3.Final", "connector": "mysql", "name": "shop",
                          "ts_ms": ev.commit_ms, "db": ev.database, "table": ev.table,
                          "file": ev.file, "pos": ev.pos},
               "databaseName": ev.database, "ddl": ev.sql, "tableChanges": []}
    if with_schema:
        return json.dumps({"schema": {"type": "struct", "optional": False, "fields": [],
                                      "name": "io.debezium.connector.mysql.SchemaChangeValue"},
                           "payload": payload})
    return json.dumps(payload)


def bad_variants(fmt: str, good: str, rng: random.Random) -> list[str]:
    """Lines the job must quarantine, derived from a good insert line of table ``kv``."""
    def mutate(fn: Any) -> str:
        o = json.loads(good)
        body = o["payload"] if fmt == "debezium" and "payload" in o else o
        row = {"debezium": lambda: body["after"], "maxwell": lambda: body["data"],
               "canal": lambda: body["data"][0]}[fmt]()
        fn(row)
        return json.dumps(o, ensure_ascii=False)

    kinds = {
        "malformed": lambda: good[: max(1, len(good) // 2)],
        "missing_key": lambda: mutate(lambda r: r.pop("k")),
        "cast": lambda: mutate(lambda r: r.update(d="31/12/1999")),
    }
    return [kinds[k]() for k in rng.sample(list(kinds), rng.randint(1, 3))]


@dataclass
class Workload:
    seed: int
    fmt: str
    opts: dict[str, Any]
    scd: dict[str, int]
    max_files_per_trigger: int
    steps: list[list[tuple[str, list[str]]]] = field(default_factory=list)

    @property
    def label(self) -> str:
        plain = "-plain" if self.fmt == "debezium" and not self.opts.get("with_schema") else ""
        return f"{self.fmt}{plain} seed={self.seed} scd={self.scd} mfpt={self.max_files_per_trigger}"

    def config(self, landing: Path, lake: Path, name: str = "chaos") -> dict[str, Any]:
        typed = self.fmt == "maxwell" or (self.fmt == "debezium" and not self.opts.get("with_schema"))
        tables = {}
        for t, s in SCHEMAS.items():
            spec: dict[str, Any] = {"keys": list(s.pk), "scd": self.scd[t]}
            if typed:
                spec["types"] = {c.name: c.spark_type for c in s.columns if c.kind != "string"}
            tables[t] = spec
        return {"pipeline": name, "source": {"format": self.fmt, "path": str(landing),
                                             "database": "shop",
                                             "max_files_per_trigger": self.max_files_per_trigger},
                "storage": {"root": str(lake)}, "engine": {"name": "deltalake"},
                "spark": {"conf": {"spark.sql.shuffle.partitions": "2"}}, "tables": tables}

    def write_yaml(self, path: Path, landing: Path, lake: Path, name: str = "chaos") -> Path:
        path.write_text(json.dumps(self.config(landing, lake, name), ensure_ascii=False),
                        encoding="utf-8")
        landing.mkdir(parents=True, exist_ok=True)
        return path


def make_workload(seed: int, fmt: str | None = None, opts: dict[str, Any] | None = None,
                  n_txns: int | None = None) -> Workload:
    """A random workload; ``seed`` alone reproduces it (format chosen by the seed if not given)."""
    rng = random.Random(seed)
    if fmt is None:
        fmt, opts = rng.choice(VARIANTS)
    opts = dict(opts or {})
    wl = Workload(seed, fmt, opts, {t: rng.choice([1, 2]) for t in SCHEMAS},
                  rng.choice([1, 2, 3, 1000]))
    entries = random_entries(rng, n_txns or rng.randint(8, 16))
    writer = make_writer(fmt, **opts)
    per_entry: list[list[str]] = []
    for e in entries:
        if fmt == "debezium" and isinstance(e, DdlEvent):
            per_entry.append([debezium_ddl(e, bool(opts.get("with_schema")))])
        else:
            per_entry.append(writer.lines(e))
    lines = [ln for chunk in per_entry for ln in chunk]
    # bad lines, right after a good kv insert line (extra lines: the truth is unchanged)
    inserts = [i for i, ln in enumerate(lines) if '"kv"' in ln and _is_insert(fmt, ln)]
    for i in sorted(rng.sample(inserts, min(len(inserts), rng.randint(1, 2))), reverse=True):
        lines[i + 1:i + 1] = bad_variants(fmt, lines[i], rng)
    n_files = max(2, min(len(lines), rng.randint(3, 6)))
    cuts = sorted(rng.sample(range(1, len(lines)), n_files - 1))
    bounds = [0, *cuts, len(lines)]
    files = [(f"{fmt}-{i + 1:06d}.json", lines[a:b]) for i, (a, b) in
             enumerate(zip(bounds, bounds[1:], strict=False))]
    order = list(files)
    if len(order) > 2 and rng.random() < 0.7:                 # an older file lands late
        i = rng.randrange(len(order) - 1)
        order.insert(rng.randrange(i + 1, len(order)), order.pop(i))
    if rng.random() < 0.6:                                     # a file re-delivered
        name, body = rng.choice(files)
        order.insert(rng.randrange(1, len(order) + 1), (name.replace(".json", ".redo.json"), body))
    n_steps = rng.randint(1, min(3, len(order)))
    cuts = sorted(rng.sample(range(1, len(order)), n_steps - 1)) if n_steps > 1 else []
    bounds = [0, *cuts, len(order)]
    wl.steps = [order[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return wl


def _is_insert(fmt: str, line: str) -> bool:
    o = json.loads(line) if line != "null" else None
    if o is None:
        return False
    if fmt == "debezium":
        body = o.get("payload", o) if isinstance(o, dict) else {}
        return body.get("op") == "c"
    if fmt == "maxwell":
        return o.get("type") == "insert"
    return o.get("type") == "INSERT" and len(o.get("data") or []) == 1
