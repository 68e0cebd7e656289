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
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from cdc_lake.demo.binlog import Binlog, BinlogEntry, RowChange, Statement
from cdc_lake.demo.schema import LOYALTY_TIER, Column, TableSchema, shop_tables

Key = tuple[Any, ...]
Row = dict[str, Any]

BASE_DAY = date(2026, 1, 5)
CENT = Decimal("0.01")
FIRST_ORDER_ID = 5_000_000_001  # beyond int32 on purpose

NAMES = [
    "Zoë Ångström", "Jürgen Müller", "José Núñez", "Amélie Poulain", "李小龙", "山田 太郎",
    "Oğuz Kağan", "Nguyễn Văn An", "O'Brien, Seán", 'Ana "Nana" Silva', "Łukasz Żółć",
    "Παύλος Κ.", "Ольга Иванова", "محمد علي", "Back\\slash Bob", "Plain Jane", "Émile 🦊 Zola",
]
CITIES = ["東京", "Zürich", "São Paulo", "Kraków", "Reykjavík", "München", "İstanbul", "Москва",
          "Berlin", "Lisboa", "New York"]
PRODUCTS = [
    ("Espresso cup ☕", "29.90"), ("Bento box 弁当箱", "18.50"), ("Crème brûlée torch", "34.99"),
    ("Ski socks 🧦", "12.00"), ("Notebook A5", "4.75"), ("USB-C cable 2m", "9.99"),
    ("Green tea 緑茶 100g", "7.20"), ("Pretzel 🥨 pack", "3.10"), ("Desk lamp", "149.00"),
    ("Road bike", "2499.00"),
]
NOTES = ["Leave at the door 📦", "Gift wrap 🎁 please", "🚀 express", "Call before delivery ☎️",
         "second floor\nring twice", "tab\tseparated", "«Ring» — bell broken", None, None, None]
TIERS = ["bronze", "silver", "gold", "platinum"]
NEXT_STATUS = {"new": "paid", "paid": "shipped", "shipped": "delivered"}

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


class ShopSimulation:
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

    # ------------------------------------------------------------------ values

    def _customer(self, cid: int) -> Row:
        rng = self._rng
        name = rng.choice(NAMES) if cid > 1 else NAMES[0]  # customer 1 is always "Zoë ..."
        slug = "".join(ch for ch in name.lower() if ch.isascii() and ch.isalnum())[:10] or "user"
        birth = rng.choice([None, date(1969, 12, 31), date(1900, 1, 1),
                            date(1940, 1, 1) + timedelta(days=rng.randrange(24_000))])
        row: Row = {"id": cid, "email": f"{slug}.{cid}@example.com", "full_name": name,
                    "city": rng.choice([*CITIES, None]) if cid > 1 else CITIES[0],
                    "birth_date": birth,
                    "created_at": self._now(), "updated_at": self._now()}
        if "loyalty_tier" in self.schemas["customers"].column_names:
            row["loyalty_tier"] = rng.choice([*TIERS, None])
        return row

    def _product(self, pid: int) -> Row:
        name, price = self._rng.choice(PRODUCTS)
        return {"id": pid, "sku": f"SKU-{pid:05d}", "name": name, "price": Decimal(price),
                "stock": self._rng.randint(0, 200), "created_at": self._now(),
                "updated_at": self._now()}

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

    # ------------------------------------------------------------------ business actions
    # Each returns the statements of one transaction, or None if it cannot happen now.

    def _act_seed_products(self) -> list[Statement]:
        rows = [self._product(self._new_id("products")) for _ in range(6)]
        voucher = self._product(self._new_id("products"))
        voucher.update(name="Voucher −5.00 €", sku="VOUCHER-5", price=Decimal("-5.00"), stock=9999)
        return [self._insert("products", [*rows, voucher])]

    def _act_signup(self) -> list[Statement]:
        n = 1 if self._rng.random() < 0.8 else self._rng.randint(2, 3)  # bulk import
        return [self._insert("customers", [self._customer(self._new_id("customers"))
                                           for _ in range(n)])]

    def _act_profile_update(self) -> list[Statement] | None:
        rng = self._rng
        key = self._pick("customers")
        if key is None:
            return None
        row = self.rows["customers"][key]
        values: Row = {"updated_at": self._now()}
        for col in rng.sample(["email", "city", "full_name", "birth_date", "loyalty_tier"],
                              rng.randint(1, 3)):
            if col == "email":
                values["email"] = f"new.{row['id']}.{self._ms % 1000}@example.org"
            elif col == "city":
                values["city"] = rng.choice([*CITIES, None])
            elif col == "full_name":
                values["full_name"] = rng.choice(NAMES)
            elif col == "birth_date":
                values["birth_date"] = (None if row["birth_date"] else
                                        date(1950, 1, 1) + timedelta(days=rng.randrange(20_000)))
            elif "loyalty_tier" in row:
                values["loyalty_tier"] = rng.choice([*TIERS, None])
        return [self._update("customers", [(key, values)])]

    def _act_null_juggle(self) -> list[Statement] | None:
        """Set nullable columns to NULL, then (same transaction) give one a value back."""
        key = self._pick("customers")
        if key is None:
            return None
        first = self._update("customers", [(key, {"city": None, "birth_date": None,
                                                  "full_name": None})])
        second = self._update("customers", [(key, {"city": "東京", "updated_at": self._now()})])
        return [first, second]

    def _act_place_order(self) -> list[Statement] | None:
        rng = self._rng
        cust = self._pick("customers")
        products = [k for k, r in self.rows["products"].items() if r["stock"] < 9999]
        if cust is None or not products:
            return None
        oid = self._new_id("orders")
        order = {"id": oid, "customer_id": cust[0], "status": "new", "amount": Decimal("0.00"),
                 "note": rng.choice(NOTES) if oid > FIRST_ORDER_ID else NOTES[0],
                 "created_at": self._now(), "updated_at": self._now()}
        statements = [self._insert("orders", [order])]
        lines = [rng.choice(products) for _ in range(rng.randint(1, 4))]
        items = [{"order_id": oid, "line_no": i + 1, "product_id": p[0],
                  "qty": rng.randint(1, 5), "unit_price": self.rows["products"][p]["price"]}
                 for i, p in enumerate(lines)]
        if rng.random() < 0.2:
            voucher = [k for k, r in self.rows["products"].items() if r["sku"] == "VOUCHER-5"]
            if voucher:
                items.append({"order_id": oid, "line_no": len(items) + 1,
                              "product_id": voucher[0][0], "qty": 1,
                              "unit_price": Decimal("-5.00")})
        statements.append(self._insert("order_items", items))  # one multi-row INSERT
        for item in items[:len(lines)]:  # one UPDATE per line: same product may change twice
            pkey = (item["product_id"],)
            stock = self.rows["products"][pkey]["stock"]
            new_stock = stock - item["qty"] if stock >= item["qty"] else stock + 100 - item["qty"]
            statements.append(self._update("products", [(pkey, {"stock": new_stock})]))
        total = sum((i["unit_price"] * i["qty"] for i in items), Decimal("0.00"))
        statements.append(self._update("orders", [((oid,), {"amount": max(total, Decimal(0))
                                                            .quantize(CENT)})]))
        return statements

    def _act_order_progress(self) -> list[Statement] | None:
        open_orders = self._sample("orders", self._rng.choice([1, 1, 1, 3]),
                                   lambda r: r["status"] in NEXT_STATUS)
        if not open_orders:
            return None
        updates = [(k, {"status": NEXT_STATUS[self.rows["orders"][k]["status"]],
                        "updated_at": self._now()}) for k in open_orders]
        return [self._update("orders", updates)]

    def _act_cancel_order(self) -> list[Statement] | None:
        key = self._pick("orders", lambda r: r["status"] in ("new", "paid"))
        if key is None:
            return None
        if self._rng.random() < 0.5:
            return [self._update("orders", [(key, {"status": "cancelled",
                                                   "updated_at": self._now()})])]
        items = [k for k in self.rows["order_items"] if k[0] == key[0]]
        return [self._delete("order_items", items), self._delete("orders", [key])]

    def _act_price_change(self) -> list[Statement] | None:
        keys = self._sample("products", self._rng.randint(2, 4), lambda r: r["price"] > 0)
        if not keys:
            return None
        factor = self._rng.choice([Decimal("1.05"), Decimal("0.9"), Decimal("1.10")])
        updates = [(k, {"price": (self.rows["products"][k]["price"] * factor)
                        .quantize(CENT, ROUND_HALF_UP), "updated_at": self._now()})
                   for k in keys]
        return [self._update("products", updates)]  # one multi-row UPDATE

    def _act_new_product(self) -> list[Statement]:
        return [self._insert("products", [self._product(self._new_id("products"))])]

    def _act_discontinue_product(self) -> list[Statement] | None:
        key = self._pick("products", lambda r: r["sku"] != "VOUCHER-5")
        return None if key is None else [self._delete("products", [key])]

    def _act_restore_product(self) -> list[Statement] | None:
        """Re-insert a deleted product under its old id, with new values."""
        if not self.deleted["products"]:
            return None
        key = self._rng.choice(sorted(self.deleted["products"]))
        row = self._product(key[0])
        row["name"] = f"{row['name']} (restocked)"
        return [self._insert("products", [row])]

    def _act_gdpr_delete(self) -> list[Statement] | None:
        key = self._pick("customers")
        return None if key is None else [self._delete("customers", [key])]

    def _act_customer_return(self) -> list[Statement] | None:
        """A deleted customer signs up again and gets the old id back."""
        if not self.deleted["customers"]:
            return None
        key = self._rng.choice(sorted(self.deleted["customers"]))
        row = self._customer(key[0])
        row["email"] = f"welcome.back.{key[0]}@example.com"
        return [self._insert("customers", [row])]

    def _act_renumber_product(self) -> list[Statement] | None:
        key = self._pick("products", lambda r: r["sku"] != "VOUCHER-5")
        if key is None:
            return None
        return [self._update("products", [(key, {"id": self._new_id("products"),
                                                 "updated_at": self._now()})])]

    def _act_merge_customer(self) -> list[Statement] | None:
        key = self._pick("customers")
        if key is None:
            return None
        return [self._update("customers", [(key, {"id": self._new_id("customers"),
                                                  "updated_at": self._now()})])]

    def _act_renumber_lines(self) -> list[Statement] | None:
        """``UPDATE order_items SET line_no = line_no + 10 WHERE order_id = ?`` (multi-row PK change)."""
        orders = sorted({k[0] for k in self.rows["order_items"]})
        if not orders:
            return None
        oid = self._rng.choice(orders)
        keys = sorted((k for k in self.rows["order_items"] if k[0] == oid), reverse=True)
        return [self._update("order_items", [(k, {"line_no": k[1] + 10}) for k in keys])]

    def _act_rewrite_items(self) -> list[Statement] | None:
        """Delete all lines of an order and insert them again (same keys) with new quantities."""
        orders = sorted({k[0] for k in self.rows["order_items"]})
        if not orders:
            return None
        oid = self._rng.choice(orders)
        keys = sorted(k for k in self.rows["order_items"] if k[0] == oid)
        old = [dict(self.rows["order_items"][k]) for k in keys]
        new = [{**r, "qty": r["qty"] % 5 + 1} for r in old]
        statements = [self._delete("order_items", keys), self._insert("order_items", new)]
        if (oid,) in self.rows["orders"]:
            total = sum((r["unit_price"] * r["qty"] for r in new), Decimal("0.00"))
            statements.append(self._update("orders", [((oid,), {
                "amount": max(total, Decimal(0)).quantize(CENT), "updated_at": self._now()})]))
        return statements

    def _act_swap_products(self) -> list[Statement] | None:
        """Swap the ids of two products via a temporary id (three PK-changing updates)."""
        keys = self._sample("products", 2, lambda r: r["sku"] != "VOUCHER-5")
        if len(keys) < 2:
            return None
        a, b = keys
        tmp = (self.next_id["products"] + 90_000,)
        return [self._update("products", [(a, {"id": tmp[0]})]),
                self._update("products", [(b, {"id": a[0]})]),
                self._update("products", [(tmp, {"id": b[0]})])]

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
