"""A seeded simulation of a small MySQL shop database, day by day.

:class:`ShopSimulation` owns the true database state (``table -> primary key tuple -> row``) and
turns business activity into binlog entries (:mod:`cdc_lake.demo.binlog`): sign-ups, profile
edits, orders with several items, status changes, price changes, cancellations, GDPR deletes,
customers coming back under their old id (re-insert of a deleted key), products renumbered and
swapped (primary-key-changing updates), order lines rewritten (delete + insert of the same keys in
one transaction), NULLs set and cleared, unicode and emoji text, decimal(10,2) money, dates and
UTC datetimes. Day 0 starts with ``CREATE TABLE`` for every table; on ``alter_day`` the customers
table gains ``loyalty_tier`` (rows written before that lack the column).

Every day draws from its own RNG (``seed`` and day number), so simulating days 0-2 at once or
day 0-1 and later day 2 from saved :meth:`ShopSimulation.to_state` gives the same history.

Example::

    sim = ShopSimulation(seed=7, txns_per_day=40)
    entries = sim.simulate_day()          # day 0
    entries += sim.simulate_day()         # day 1
    sim.rows["orders"]                    # {(5000000001,): {"id": 5000000001, ...}, ...}
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from cdc_lake.demo.binlog import Binlog, BinlogEntry, RowChange, Statement
from cdc_lake.demo.shop_actions import FIRST_ORDER_ID, Key, Row, ShopActions
from cdc_lake.demo.schema import LOYALTY_TIER, Column, TableSchema, shop_tables

BASE_DAY = date(2026, 1, 5)


# Each day includes these at least once (after the warm-up on day 0), in this order.
MANDATORY = ("gdpr_delete", "customer_return", "renumber_product", "renumber_lines",
             "merge_customer", "rewrite_items", "swap_products", "price_change", "cancel_order",
             "discontinue_product", "restore_product", "null_juggle")
WEIGHTS = {"signup": 3, "profile_update": 4, "place_order": 6, "order_progress": 5,
           "cancel_order": 1, "price_change": 1, "new_product": 1, "discontinue_product": 0.5,
           "restore_product": 0.5, "gdpr_delete": 0.5, "customer_return": 0.5, "null_juggle": 0.5,
           "rewrite_items": 0.5}


def day_start_ms(day: int) -> int:
    d = datetime.combine(BASE_DAY + timedelta(days=day), datetime.min.time(), tzinfo=UTC)
    return int(d.timestamp() * 1000)


def wall_clock(ms: int) -> datetime:
    """MySQL DATETIME value (naive, UTC wall clock, whole seconds) for a commit time."""
    return datetime.fromtimestamp(ms // 1000, tz=UTC).replace(tzinfo=None)


class ShopSimulation(ShopActions):
    """The shop database and its binlog, advanced one simulated day at a time.

    Args:
        seed: makes the whole history reproducible.
        txns_per_day: transactions per day (raised to fit the mandatory scenarios).
        alter_day: day on which customers gains ``loyalty_tier`` (mid-day).
        max_binlog_size: binlog file size that triggers a rotation.
    """

    def __init__(self, seed: int, *, txns_per_day: int = 80, alter_day: int = 1,
                 max_binlog_size: int = 64 * 1024) -> None:
        self.seed = seed
        self.txns_per_day = txns_per_day
        self.alter_day = alter_day
        self.schemas: dict[str, TableSchema] = shop_tables()
        self.rows: dict[str, dict[Key, Row]] = {t: {} for t in self.schemas}
        self.deleted: dict[str, dict[Key, Row]] = {t: {} for t in self.schemas}
        self.next_id = {"customers": 1, "products": 100, "orders": FIRST_ORDER_ID}
        self.day = 0
        self.last_ms = 0
        self.binlog = Binlog(max_file_size=max_binlog_size)
        self._rng = random.Random()
        self._ms = 0

    # ------------------------------------------------------------------ public API

    def simulate_day(self) -> list[BinlogEntry]:
        """Simulate the next day; returns its binlog entries in log order."""
        day = self.day
        self._rng = random.Random(f"cdc-lake-shop:{self.seed}:{day}")
        if day > 0:
            self.binlog.rotate()  # nightly FLUSH LOGS
        entries: list[BinlogEntry] = []
        if day == 0:
            for i, schema in enumerate(self.schemas.values()):
                self._ms = max(self.last_ms + 1, day_start_ms(day) + 1000 * (i + 1) + 123)
                entries.append(self.binlog.ddl(self._ms, "table-create", schema.create_sql(),
                                               None, schema))
                self.last_ms = self._ms
        kinds = self._plan(day)
        for ms, kind in zip(self._times(day, len(kinds)), kinds, strict=True):
            self._ms = ms
            self.last_ms = ms
            if kind == "alter_customers":
                entries.append(self._alter_customers())
            elif kind == "index_orders":
                schema = self.schemas["orders"]
                entries.append(self.binlog.ddl(ms, "table-alter",
                                               "ALTER TABLE `orders` ADD INDEX `idx_orders_status` "
                                               "(`status`)", schema, schema))
            else:
                statements = self._act(kind)
                if statements:
                    entries.append(self.binlog.transaction(ms, statements))
        self.day += 1
        return entries

    def snapshot(self) -> dict[str, dict[Key, Row]]:
        """A deep-enough copy of the true current state."""
        return {t: {k: dict(r) for k, r in rows.items()} for t, rows in self.rows.items()}

    # ------------------------------------------------------------------ planning

    def _plan(self, day: int) -> list[str]:
        rng = self._rng
        n = max(self.txns_per_day, len(MANDATORY) + 8)
        names = list(WEIGHTS)
        weights = [WEIGHTS[k] for k in names]
        kinds = rng.choices(names, weights, k=n)
        warmup = 0
        if day == 0:
            warmup = max(6, n // 5)
            kinds[:warmup] = ["seed_products", "signup", "signup", "signup", "place_order",
                              "place_order"] + rng.choices(["signup", "place_order", "new_product"],
                                                           k=warmup - 6)
        span = n - warmup
        for i, kind in enumerate(MANDATORY):
            kinds[warmup + (i * span) // len(MANDATORY) + (span // len(MANDATORY)) // 2] = kind
        if day == 0:
            kinds.insert(warmup + (2 * span) // 3, "index_orders")
        if day == self.alter_day:
            kinds.insert(n // 2, "alter_customers")
        return kinds

    def _times(self, day: int, n: int) -> list[int]:
        """Strictly increasing commit times (ms) between 06:00 and 23:00, with bursts."""
        rng = self._rng
        lo = max(day_start_ms(day) + 6 * 3600_000, self.last_ms + 1)
        hi = day_start_ms(day) + 23 * 3600_000
        ts = sorted(rng.randrange(lo, hi) for _ in range(n))
        for i in range(1, n):
            if rng.random() < 0.25:
                ts[i] = min(ts[i], ts[i - 1] + rng.randint(1, 900))
            ts[i] = max(ts[i], ts[i - 1] + 1)
        return ts

    def _act(self, kind: str) -> list[Statement]:
        action: Callable[[], list[Statement] | None] = getattr(self, f"_act_{kind}")
        statements = action()
        if statements is None:  # precondition not met: something ordinary instead
            statements = self._act_place_order() or self._act_signup()
        return [s for s in statements if s.rows]

    # ------------------------------------------------------------------ row primitives

    def _now(self) -> datetime:
        return wall_clock(self._ms)

    def _key(self, table: str, row: Row) -> Key:
        return tuple(row[k] for k in self.schemas[table].pk)

    def _insert(self, table: str, rows: list[Row]) -> Statement:
        changes = []
        for row in rows:
            row = self._complete(table, row)
            key = self._key(table, row)
            if key in self.rows[table]:
                raise RuntimeError(f"duplicate key {key} in {table}")
            self.rows[table][key] = row
            self.deleted[table].pop(key, None)
            changes.append(RowChange(None, dict(row)))
        return Statement(self.schemas[table], "insert", tuple(changes))

    def _update(self, table: str, updates: list[tuple[Key, Row]]) -> Statement:
        changes = []
        for key, values in updates:
            before = self.rows[table][key]
            after = {**before, **values}
            if after == before:
                continue  # MySQL logs no row for an update that changes nothing
            new_key = self._key(table, after)
            if new_key != key:
                if new_key in self.rows[table]:
                    raise RuntimeError(f"primary key change {key}->{new_key} collides in {table}")
                del self.rows[table][key]
                self.deleted[table].pop(new_key, None)
            self.rows[table][new_key] = after
            changes.append(RowChange(dict(before), dict(after)))
        return Statement(self.schemas[table], "update", tuple(changes))

    def _delete(self, table: str, keys: list[Key]) -> Statement:
        changes = []
        for key in keys:
            before = self.rows[table].pop(key)
            self.deleted[table][key] = before
            changes.append(RowChange(dict(before), None))
        return Statement(self.schemas[table], "delete", tuple(changes))

    def _complete(self, table: str, row: Row) -> Row:
        """Every column of the current schema, in table order (missing ones NULL)."""
        return {c.name: row.get(c.name) for c in self.schemas[table].columns}

    def _pick(self, table: str, where: Callable[[Row], bool] = lambda r: True) -> Key | None:
        keys = [k for k, r in self.rows[table].items() if where(r)]
        return self._rng.choice(keys) if keys else None

    def _sample(self, table: str, n: int, where: Callable[[Row], bool] = lambda r: True
                ) -> list[Key]:
        keys = [k for k, r in self.rows[table].items() if where(r)]
        return self._rng.sample(keys, min(n, len(keys)))

    def _new_id(self, table: str) -> int:
        i = self.next_id[table]
        self.next_id[table] += 1
        return i

    # ------------------------------------------------------------------ DDL

    def _alter_customers(self) -> BinlogEntry:
        before = self.schemas["customers"]
        after = before.with_column(LOYALTY_TIER)
        self.schemas["customers"] = after
        for table_rows in (self.rows["customers"], self.deleted["customers"]):
            for row in table_rows.values():
                row["loyalty_tier"] = None  # existing rows get the column's default
        sql = "ALTER TABLE `customers` ADD COLUMN `loyalty_tier` varchar(16) NULL"
        return self.binlog.ddl(self._ms, "table-alter", sql, before, after)

    # ------------------------------------------------------------------ persistence

    def to_state(self) -> dict[str, Any]:
        """JSON-ready state; :meth:`from_state` continues the history exactly."""
        def rows(table_rows: dict[Key, Row]) -> list[dict[str, Any]]:
            return [{c: encode_value(v) for c, v in r.items()} for r in table_rows.values()]

        return {
            "seed": self.seed, "txns_per_day": self.txns_per_day, "alter_day": self.alter_day,
            "day": self.day, "last_ms": self.last_ms, "next_id": dict(self.next_id),
            "binlog": self.binlog.state(),
            "schemas": {t: [[c.name, c.mysql_type, c.nullable] for c in s.columns]
                        for t, s in self.schemas.items()},
            "rows": {t: rows(r) for t, r in self.rows.items()},
            "deleted": {t: rows(r) for t, r in self.deleted.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ShopSimulation:
        sim = cls(state["seed"], txns_per_day=state["txns_per_day"],
                  alter_day=state["alter_day"])
        sim.day, sim.last_ms = state["day"], state["last_ms"]
        sim.next_id = dict(state["next_id"])
        sim.binlog = Binlog.from_state(state["binlog"])
        for t, cols in state["schemas"].items():
            base = sim.schemas[t]
            sim.schemas[t] = TableSchema(base.database, base.name,
                                         tuple(Column(n, ty, nl) for n, ty, nl in cols), base.pk)
        for attr in ("rows", "deleted"):
            target: dict[str, dict[Key, Row]] = getattr(sim, attr)
            for t, rows in state[attr].items():
                for raw in rows:
                    row = {c: decode_value(v) for c, v in raw.items()}
                    target[t][sim._key(t, row)] = row
        return sim


def encode_value(v: Any) -> Any:
    """Python value -> JSON with type tags (Decimal, date, datetime survive a round trip)."""
    if isinstance(v, Decimal):
        return {"$decimal": str(v)}
    if isinstance(v, datetime):
        return {"$datetime": v.isoformat()}
    if isinstance(v, date):
        return {"$date": v.isoformat()}
    return v


def decode_value(v: Any) -> Any:
    if isinstance(v, dict):
        (tag, s), = v.items()
        return {"$decimal": Decimal, "$datetime": datetime.fromisoformat,
                "$date": date.fromisoformat}[tag](s)
    return v
