"""Random upstream histories for enrichment tests, written as real Delta tables with ``deltalake``.

A shop-like star: fact ``order_items`` (keys ``order_id, line_no``) and dimensions ``orders``
(SCD1, gives ``customer_id`` and the event time ``order_time``), ``products`` (SCD1),
``categories`` (SCD1, keyed by ``product_id``) and ``customers`` (SCD2 version rows with
``_valid_from``/``_valid_to``/``_is_current``, ``_valid_to`` exclusive). Keys come from small
pools so facts arrive before their members, members arrive later (also SCD2 versions slotted in
*before* the first version), members are deleted, facts are updated across aggregate groups,
deleted and re-inserted.

Every history step is exactly one Delta commit of one table (``write_deltalake`` for the first
write with the change data feed on, ``DeltaTable.merge`` after that so the feed has pre/post
images and deletes) — the reference model (``tests/enrich_reference.py``) is fed the same
:class:`~enrich_reference.Commit` objects and knows which version holds what.

Example::

    hist = random_history(random.Random(seed), steps=14)
    for i, commit in enumerate(hist.commits):
        write_commit(lake, commit)
        if i in hist.runs: ...run the job...
    write_pipeline(tmp_path / "p.yaml", model_config(wait_zero=True), lake, out)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from enrich_reference import AggSpec, Commit, DimSpec, ModelConfig

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TS = pa.timestamp("us", tz="UTC")
SCHEMAS: dict[str, pa.Schema] = {
    "order_items": pa.schema([("order_id", pa.int64()), ("line_no", pa.int64()),
                              ("product_id", pa.int64()), ("qty", pa.int64()),
                              ("unit_price", pa.int64())]),
    "orders": pa.schema([("id", pa.int64()), ("status", pa.string()),
                         ("customer_id", pa.int64()), ("created_at", TS)]),
    "products": pa.schema([("id", pa.int64()), ("name", pa.string())]),
    "categories": pa.schema([("product_id", pa.int64()), ("category", pa.string())]),
    "customers": pa.schema([("id", pa.int64()), ("city", pa.string()), ("_valid_from", TS),
                            ("_valid_to", TS), ("_is_current", pa.bool_())]),
}
MERGE_ON = {"order_items": ("order_id", "line_no"), "orders": ("id",), "products": ("id",),
            "categories": ("product_id",), "customers": ("id", "_valid_from")}
FACT = "order_items"
AGG = "revenue_by_category_day"


def model_config(*, wait_zero: bool = True, max_versions_per_trigger: int = 1) -> ModelConfig:
    """The pipeline every enrichment property/kill test runs (see :func:`write_pipeline`)."""
    return ModelConfig(
        fact_table=FACT, fact_keys=("order_id", "line_no"),
        dims=(
            DimSpec("orders", "orders", ("id",), 1, (("order_id", "id"),),
                    (("order_status", "status"), ("customer_id", "customer_id"),
                     ("order_time", "created_at"))),
            DimSpec("products", "products", ("id",), 1, (("product_id", "id"),),
                    (("product_name", "name"),)),
            DimSpec("categories", "categories", ("product_id",), 1,
                    (("product_id", "product_id"),), (("category", "category"),)),
            DimSpec("customers", "customers", ("id",), 2, (("customer_id", "id"),),
                    (("customer_city", "city"),)),
        ),
        event_time="order_time",
        aggregates=(AggSpec(AGG, ("category",), "day", (
            ("revenue", ("qty * unit_price", lambda r: r["qty"] * r["unit_price"])),
            ("units", ("qty", lambda r: r["qty"])))),),
        wait_zero=wait_zero, max_versions_per_trigger=max_versions_per_trigger)


def write_pipeline(path: Path, cfg: ModelConfig, lake: Path, out: Path, *,
                   name: str = "enrich_prop") -> Path:
    """The ``kind: enrich`` YAML for ``cfg`` over the upstream tables in ``lake``."""
    doc: dict[str, Any] = {
        "kind": "enrich", "pipeline": name, "schedule": {"every": "30m"},
        "start_date": "2026-01-01", "trigger": "available_now",
        "fact": {"change_feed": str(lake / cfg.fact_table), "keys": list(cfg.fact_keys),
                 "max_versions_per_trigger": cfg.max_versions_per_trigger},
        "dimensions": {d.name: {"table": str(lake / d.table), "keys": list(d.keys), "scd": d.scd,
                                "on": dict(d.on), "columns": dict(d.columns)} for d in cfg.dims},
        "event_time": cfg.event_time,
        "late_members": {"wait": "0s" if cfg.wait_zero else "1000h"},
        "outputs": {
            "enriched": str(out / "enriched"), "pending": str(out / "pending"),
            "quarantine": str(out / "quarantine"),
            "aggregates": {a.name: {"path": str(out / a.name), "group_by": list(a.group_by),
                                    "time_bucket": a.time_bucket,
                                    "sums": {n: sql for n, (sql, _) in a.sums}}
                           for a in cfg.aggregates}},
        "storage": {"root": str(out), "checkpoint": str(out / "_checkpoint"),
                    "runs": str(out / "_runs")},
        "engine": {"name": "deltalake"},
        "spark": {"conf": {"spark.sql.shuffle.partitions": "2"}},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# ------------------------------------------------------------------------- writing commits
def _arrow(table: str, rows: tuple[dict[str, Any], ...]) -> pa.Table:
    schema = SCHEMAS[table]
    return pa.Table.from_pylist([{c: r.get(c) for c in schema.names} for r in rows], schema=schema)


def write_commit(lake: Path, commit: Commit) -> None:
    """Exactly one Delta commit for ``commit`` at ``lake/<table>``."""
    from deltalake import DeltaTable, write_deltalake

    path = str(lake / commit.table)
    if commit.create:
        write_deltalake(path, _arrow(commit.table, commit.upserts), mode="error",
                        configuration={"delta.enableChangeDataFeed": "true"})
        return
    if commit.rekeys:  # an UPDATE in place that changes the row's key: one commit, one row
        ((old, new),) = commit.rekeys
        DeltaTable(path).update(
            updates={f"`{c}`": str(new[c]) for c in commit.merge_on if new[c] != old[c]},
            predicate=" AND ".join(f"`{c}` = {old[c]}" for c in commit.merge_on))
        return
    cols = SCHEMAS[commit.table].names
    src = _arrow(commit.table, commit.upserts + commit.deletes).append_column(
        "__op", pa.array(["u"] * len(commit.upserts) + ["d"] * len(commit.deletes)))
    pred = " AND ".join(f"t.`{c}` = s.`{c}`" for c in commit.merge_on)
    setting = {f"`{c}`": f"s.`{c}`" for c in cols}
    (DeltaTable(path).merge(src, pred, source_alias="s", target_alias="t")
     .when_matched_delete("s.__op = 'd'")
     .when_matched_update(setting, "s.__op = 'u'")
     .when_not_matched_insert(setting, "s.__op = 'u'")
     .execute())


# ------------------------------------------------------------------------- random histories
@dataclass
class History:
    seed: int
    commits: list[Commit] = field(default_factory=list)
    runs: set[int] = field(default_factory=set)     # run the job after commit index i

    def describe(self) -> str:
        lines = [f"history seed={self.seed}: {len(self.commits)} commits, runs after {sorted(self.runs)}"]
        for i, c in enumerate(self.commits):
            lines.append(f"  #{i} {c.table}{' create' if c.create else ''} upserts={list(c.upserts)} "
                         f"deletes={[{k: r[k] for k in c.merge_on} for r in c.deletes]}"
                         + (f" rekeys={[({k: o[k] for k in c.merge_on}, {k: n[k] for k in c.merge_on}) for o, n in c.rekeys]}"
                            if c.rekeys else "")
                         + ("  <-- run" if i in self.runs else ""))
        return "\n".join(lines)


class _Gen:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.state: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {t: {} for t in SCHEMAS}

    def hours(self, lo: float = 0, hi: float = 72) -> datetime:
        return T0 + timedelta(minutes=self.rng.randrange(int(lo * 60), int(hi * 60)))

    def commit(self, table: str, upserts=(), deletes=(), create=False) -> Commit:  # type: ignore[no-untyped-def]
        st = self.state[table]
        for r in upserts:
            st[tuple(r[c] for c in MERGE_ON[table])] = dict(r)
        for r in deletes:
            st.pop(tuple(r[c] for c in MERGE_ON[table]), None)
        return Commit(table, MERGE_ON[table], tuple(upserts), tuple(deletes), create)

    # one generator per step kind; each returns a Commit or None when not applicable
    def fact_insert(self) -> Commit | None:
        free = [(o, n) for o in range(1, 7) for n in range(1, 4) if (o, n) not in self.state[FACT]]
        if not free:
            return None
        keys = self.rng.sample(free, min(len(free), self.rng.randint(1, 3)))
        return self.commit(FACT, [{"order_id": o, "line_no": n, "product_id": self.rng.randint(1, 5),
                                   "qty": self.rng.randint(1, 5), "unit_price": self.rng.randint(1, 20)}
                                  for o, n in keys])

    def fact_update(self) -> Commit | None:
        rows = list(self.state[FACT].values())
        if not rows:
            return None
        out = []
        for r in self.rng.sample(rows, min(len(rows), self.rng.randint(1, 2))):
            new = dict(r)
            if self.rng.random() < 0.6:
                new["product_id"] = self.rng.choice([p for p in range(1, 6) if p != r["product_id"]])
            new["qty"] = r["qty"] % 5 + 1
            out.append(new)
        return self.commit(FACT, out)

    def fact_rekey(self) -> Commit | None:
        """An UPDATE that moves one fact row to a free key (Delta: a pre-image under the old
        key, a post-image under the new one)."""
        rows = list(self.state[FACT].values())
        free = [(o, n) for o in range(1, 7) for n in range(1, 4) if (o, n) not in self.state[FACT]]
        if not rows or not free:
            return None
        old = self.rng.choice(rows)
        o, n = self.rng.choice(free)
        new = {**old, "order_id": o, "line_no": n}
        st = self.state[FACT]
        st.pop((old["order_id"], old["line_no"]))
        st[(o, n)] = new
        return Commit(FACT, MERGE_ON[FACT], rekeys=((dict(old), new),))

    def fact_delete(self) -> Commit | None:
        rows = list(self.state[FACT].values())
        return self.commit(FACT, deletes=[self.rng.choice(rows)]) if rows else None

    def wanted(self, table: str, pool: range) -> int:
        """Mostly a member some fact references but that does not exist (yet): late members."""
        facts = list(self.state[FACT].values())
        if table == "orders":
            refs = {f["order_id"] for f in facts}
        elif table == "customers":
            refs = {o["customer_id"] for o in self.state["orders"].values()}
            have = {r["id"] for r in self.state["customers"].values()}
            missing = sorted(refs - have)
            return self.rng.choice(missing) if missing and self.rng.random() < 0.7 else self.rng.choice(pool)
        else:
            refs = {f["product_id"] for f in facts}
        missing = sorted(r for r in refs if (r,) not in self.state[table])
        return self.rng.choice(missing) if missing and self.rng.random() < 0.7 else self.rng.choice(pool)

    def order_upsert(self) -> Commit:
        oid = self.wanted("orders", range(1, 7))
        old = self.state["orders"].get((oid,))
        if old is None:
            row = {"id": oid, "status": "new", "customer_id": self.rng.randint(1, 4),
                   "created_at": self.hours()}
        else:
            row = {**old, "status": self.rng.choice([s for s in ("new", "paid", "shipped")
                                                     if s != old["status"]])}
        return self.commit("orders", [row])

    def simple_dim(self, table: str, col: str, values: tuple[str, ...]) -> Commit:
        key = MERGE_ON[table][0]
        pid = self.wanted(table, range(1, 6))
        old = self.state[table].get((pid,))
        return self.commit(table, [{key: pid, col: self.rng.choice(
            [v for v in values if old is None or v != old[col]])}])

    def delete_dim(self, table: str) -> Commit | None:
        rows = list(self.state[table].values())
        return self.commit(table, deletes=[self.rng.choice(rows)]) if rows else None

    def customer_step(self) -> Commit:
        cid = self.wanted("customers", range(1, 5))
        versions = sorted((r for r in self.state["customers"].values() if r["id"] == cid),
                          key=lambda r: r["_valid_from"])
        city = self.rng.choice(["Oslo", "Lyon", "Kyiv", "Porto", "Zürich"])
        if not versions:  # a new member, first valid somewhere in the order time range
            return self.commit("customers", [{"id": cid, "city": city, "_valid_from": self.hours(),
                                              "_valid_to": None, "_is_current": True}])
        first, cur = versions[0], versions[-1]
        if self.rng.random() < 0.4 and first["_valid_from"] > T0 + timedelta(hours=1):
            start = self.hours(-24, (first["_valid_from"] - T0).total_seconds() / 3600)
            return self.commit("customers", [{"id": cid, "city": city, "_valid_from": start,
                                              "_valid_to": first["_valid_from"], "_is_current": False}])
        lo = (cur["_valid_from"] - T0).total_seconds() / 3600 + 1
        start = self.hours(lo, max(lo + 1, 96))
        return self.commit("customers", [{**cur, "_valid_to": start, "_is_current": False},
                                         {"id": cid, "city": city, "_valid_from": start,
                                          "_valid_to": None, "_is_current": True}])

    def initial(self) -> list[Commit]:
        out = []
        orders = [{"id": o, "status": "new", "customer_id": self.rng.randint(1, 4), "created_at": self.hours()}
                  for o in range(1, 7) if self.rng.random() < 0.7]
        out.append(self.commit("orders", orders, create=True))
        out.append(self.commit("products", [{"id": p, "name": f"p{p}"} for p in range(1, 6)
                                            if self.rng.random() < 0.85], create=True))
        out.append(self.commit("categories", [{"product_id": p, "category": self.rng.choice("ABC")}
                                              for p in range(1, 6) if self.rng.random() < 0.85], create=True))
        out.append(self.commit("customers", [{"id": c, "city": "Oslo", "_valid_from": self.hours(
            -48, self.rng.choice([0, 0, 30])), "_valid_to": None, "_is_current": True}
            for c in range(1, 5) if self.rng.random() < 0.8], create=True))
        first = self.fact_insert()
        assert first is not None
        out.append(Commit(FACT, MERGE_ON[FACT], first.upserts, (), True))
        return out

    def step(self) -> Commit:
        kinds = [("fact_insert", 4), ("fact_update", 3), ("fact_delete", 1.2), ("fact_rekey", 0.8), ("orders", 2.5),
                 ("orders_delete", 0.4), ("products", 1.5), ("products_delete", 0.4),
                 ("categories", 1.5), ("categories_delete", 0.3), ("customers", 2)]
        while True:
            kind = self.rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
            c = {"fact_insert": self.fact_insert, "fact_update": self.fact_update,
                 "fact_delete": self.fact_delete, "fact_rekey": self.fact_rekey,
                 "orders": self.order_upsert,
                 "orders_delete": lambda: self.delete_dim("orders"),
                 "products": lambda: self.simple_dim("products", "name", ("widget", "gadget", "gizmo")),
                 "products_delete": lambda: self.delete_dim("products"),
                 "categories": lambda: self.simple_dim("categories", "category", ("A", "B", "C")),
                 "categories_delete": lambda: self.delete_dim("categories"),
                 "customers": self.customer_step}[kind]()
            if c is not None:
                return c


def random_history(rng: random.Random, *, steps: int = 14, run_prob: float = 0.35,
                   seed: int = 0) -> History:
    """Initial tables (5 creates, the fact's first) + ``steps`` random commits; runs at random
    points after the creates and always after the last commit."""
    g = _Gen(rng)
    h = History(seed=seed, commits=g.initial())
    if rng.random() < run_prob:
        h.runs.add(len(h.commits) - 1)
    for _ in range(steps):
        h.commits.append(g.step())
        if rng.random() < run_prob:
            h.runs.add(len(h.commits) - 1)
    h.runs.add(len(h.commits) - 1)
    return h


def rekey_history(rng: random.Random, *, seed: int = 0, rounds: int = 3) -> History:
    """Random initial tables, then ``rounds`` times: a fact row moved to another key in place,
    an update, another move (each move a Delta UPDATE: pre-image under the old key, post-image
    under the new one); a run after each round."""
    g = _Gen(rng)
    h = History(seed=seed, commits=g.initial())
    for _ in range(rounds):
        for c in (g.fact_rekey(), g.fact_update(), g.fact_rekey()):
            if c is not None:
                h.commits.append(c)
        h.runs.add(len(h.commits) - 1)
    return h
