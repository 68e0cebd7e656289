"""Demo dimension snapshots: the merchandising system's daily product-category export (CSV).

One full snapshot per day, ``<out>/<YYYY-MM-DD>.csv`` with ``product_id,category``, for the
products in the shop's CDC products table. To show the enrichment's guarantees:

* the **late** product (by default the highest product id that has order lines) is missing from
  the first day's export — its order lines are parked — and present from the second day on, so
  the next enrichment run releases them;
* each later day **changes** one product's category (the ``changed`` product, another product
  with order lines), so facts enriched after that refresh carry the new category.

Example::

    python -m cdc_lake.demo.categories --products data/lake/shop_maxwell/products \\
        --order-items data/lake/shop_maxwell/order_items --out data/snapshots/product_categories \\
        --start 2026-01-01 --days 2
    # wrote 2026-01-01.csv (41 products, late product 131 held back), 2026-01-02.csv (...)
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

CATEGORIES = ("Books", "Garden", "Toys", "Kitchen", "Électronique", "Spielwaren")


@dataclass(frozen=True)
class SnapshotPlan:
    products: tuple[int, ...]
    late: int | None
    changed: int | None


def plan(products: list[int], ordered: list[int]) -> SnapshotPlan:
    """Pick the late and the changed product among those with order lines (if any)."""
    with_lines = sorted(set(ordered) & set(products)) or sorted(products)
    late = with_lines[-1] if with_lines else None
    changed = next((p for p in with_lines if p != late), None)
    return SnapshotPlan(tuple(sorted(products)), late, changed)


def category(pid: int, day_index: int, p: SnapshotPlan) -> str:
    """The product's category on demo day ``day_index``: fixed, except the ``changed`` product's,
    which moves to the next category every day."""
    i = pid % len(CATEGORIES)
    if pid == p.changed:
        i = (i + day_index) % len(CATEGORIES)
    return CATEGORIES[i]


def write_snapshots(out: Path, p: SnapshotPlan, start: date, days: int, first_index: int = 0) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(days):
        idx = first_index + i
        f = out / f"{(start + timedelta(days=i)).isoformat()}.csv"
        tmp = f.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["product_id", "category"])
            for pid in p.products:
                if pid == p.late and idx == 0:
                    continue
                w.writerow([pid, category(pid, idx, p)])
        tmp.replace(f)
        files.append(f)
    return files


def _column(table: Path, col: str) -> list[int]:
    from deltalake import DeltaTable

    # single-threaded scan: deltalake 1.6.6's threaded `to_pyarrow_table` aborts this process at
    # exit on this machine ("terminate called without an active exception")
    data = DeltaTable(str(table)).to_pyarrow_dataset().to_table(columns=[col], use_threads=False)
    return [int(v) for v in data.column(col).to_pylist() if v is not None]


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(prog="python -m cdc_lake.demo.categories", description=__doc__.splitlines()[0])
    a.add_argument("--products", required=True, type=Path, help="the CDC products Delta table")
    a.add_argument("--order-items", required=True, type=Path, help="the CDC order_items Delta table")
    a.add_argument("--out", required=True, type=Path)
    a.add_argument("--start", required=True, help="first date YYYY-MM-DD")
    a.add_argument("--days", type=int, default=1)
    a.add_argument("--day-index", type=int, default=0, help="index of --start in the demo (0 = first day)")
    args = a.parse_args(argv)
    try:
        p = plan(_column(args.products, "id"), _column(args.order_items, "product_id"))
    except Exception as e:  # noqa: BLE001
        print(f"error: cannot read the CDC tables ({e}); run the CDC pipeline first", file=sys.stderr)
        return 2
    files = write_snapshots(args.out, p, date.fromisoformat(args.start), args.days, args.day_index)
    print(json.dumps({"files": [f.name for f in files], "products": len(p.products), "late_product": p.late,
                      "changed_product": p.changed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
