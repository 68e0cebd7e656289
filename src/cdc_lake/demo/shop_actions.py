"""The shop's business activity: what a day of customers and staff does to the database.

:class:`ShopActions` is the half of :class:`~cdc_lake.demo.shop_model.ShopSimulation` that decides
*what* happens — sign-ups, profile edits, orders with several items, status changes, price
changes, cancellations, GDPR deletes, returning customers, renumbered and swapped products,
rewritten order lines — and the catalog of names, cities, products and notes (unicode, emoji,
quotes, control characters) the rows are drawn from. Each ``_act_<kind>`` returns the statements
of one transaction, or ``None`` when its precondition does not hold (the simulation then does
something ordinary instead). The row primitives (``_insert``, ``_update``, ``_delete``, ``_pick``,
``_sample``, ``_new_id``) and the state they change live in :mod:`cdc_lake.demo.shop_model`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from cdc_lake.demo.binlog import Statement
from cdc_lake.demo.schema import TableSchema

Key = tuple[Any, ...]
Row = dict[str, Any]

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


class ShopActions:
    """Business actions over the simulation's state (mixed into ``ShopSimulation``)."""

    schemas: dict[str, TableSchema]
    rows: dict[str, dict[Key, Row]]
    deleted: dict[str, dict[Key, Row]]
    next_id: dict[str, int]
    _rng: random.Random
    _ms: int

    # primitives provided by ShopSimulation
    _now: Callable[[], datetime]
    _insert: Callable[[str, list[Row]], Statement]
    _update: Callable[[str, list[tuple[Key, Row]]], Statement]
    _delete: Callable[[str, list[Key]], Statement]
    _pick: Callable[..., Key | None]
    _sample: Callable[..., list[Key]]
    _new_id: Callable[[str], int]

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
