"""Upstream types change under a running enrichment pipeline: no value is stored changed.

Before, each batch's rows were cast to the output tables' first types: a fact column widened
upstream (``bigint -> double``, as a CDC table is widened) stored ``2.5`` as ``2`` in the
enriched table and the aggregates, and the outputs of a dimension that had no table on the first
run stayed strings for good (``5`` stored as ``'5'``). All exit 0. Now the job widens its own
tables where every stored value survives the new type, and stops (exit 3, nothing written,
``--reprocess``) where a stored group key would change. The fact key here holds a dot
(``line.id``), which used to fail every batch with UNRESOLVED_COLUMN.

Truth: computed here from the upstream tables as they are at each check (no ``cdc_lake`` code).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from test_enrich_safety import CDF, _read, cli, write_yaml

TS = pa.timestamp("us", tz="UTC")
T0 = datetime(2026, 3, 1, tzinfo=UTC)
KEY = "line.id"
YAML = """
    kind: enrich
    pipeline: types
    fact: {change_feed: lake/facts, keys: ["line.id"]}
    dimensions:
      products: {table: lake/products, keys: [id], scd: 1, on: {product_id: id},
                 columns: {category: cat, w: w}}
    late_members: {wait: 0s}
    outputs:
      enriched: gold/lines
      aggregates:
        units: {group_by: [category], sums: {units: qty, wsum: w}}
        by_shop: {group_by: [shop], sums: {units: qty}}
    engine: {name: deltalake}
    spark: {conf: {spark.sql.shuffle.partitions: "2"}}
"""


def facts_schema(qty: pa.DataType, shop: pa.DataType) -> pa.Schema:
    return pa.schema([(KEY, pa.int64()), ("product_id", pa.int64()), ("shop", shop),
                      ("qty", qty), ("ts", TS)])


def upsert(root: Path, schema: pa.Schema, *rows: tuple) -> None:
    path = str(root / "lake/facts")
    t = pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows], schema=schema)
    if not DeltaTable.is_deltatable(path):
        write_deltalake(path, t, configuration=CDF)
        return
    (DeltaTable(path).merge(t, "t.`line.id` = s.`line.id`", "s", "t")
     .when_matched_update_all().when_not_matched_insert_all().execute())


def widen_upstream(root: Path, name: str, types: dict[str, pa.DataType]) -> None:
    """What the CDC kind does to widen a column: rewrite the table once, same rows, the commit
    tagged so change-feed readers skip it."""
    path = str(root / "lake" / name)
    t = DeltaTable(path).to_pyarrow_table()
    for c, typ in types.items():
        t = t.set_column(t.schema.get_field_index(c), c, t.column(c).cast(typ))
    write_deltalake(path, t, mode="overwrite", schema_mode="overwrite", configuration=CDF,
                    commit_properties=CommitProperties(custom_metadata={"cdc_lake.same_rows": "true"}))


def truth(root: Path) -> dict:
    """Every fact joined to its product now (the products table is written once, before any
    fact is enriched against it; facts seen before it existed are restated when it appears)."""
    prods = {r["id"]: (r["cat"], r["w"]) for r in _read(root / "lake/products")}
    enriched, units, by_shop = {}, {}, {}
    for f in _read(root / "lake/facts"):
        cat, w = prods.get(f["product_id"], (None, None))
        enriched[f[KEY]] = (f["qty"], cat, w)
        s, ws, n = units.get(cat, (0, 0, 0))
        units[cat] = (s + f["qty"], ws + (w or 0), n + 1)
        s, n = by_shop.get(f["shop"], (0, 0))
        by_shop[f["shop"]] = (s + f["qty"], n + 1)
    return {"enriched": enriched, "units": units, "by_shop": by_shop}


def actual(root: Path) -> dict:
    return {"enriched": {r[KEY]: (r["qty"], r["category"], r["w"]) for r in _read(root / "gold/lines")},
            "units": {r["category"]: (r["units"], r["wsum"], r["count"]) for r in _read(root / "gold/units")},
            "by_shop": {r["shop"]: (r["units"], r["count"]) for r in _read(root / "gold/by_shop")}}


def types_of(path: Path) -> dict[str, str]:
    return {f.name: str(f.type) for f in DeltaTable(str(path)).to_pyarrow_table().schema}


def test_outputs_follow_widened_and_late_typed_columns_exactly(tmp_path: Path, capsys) -> None:
    root, yaml = tmp_path, write_yaml(tmp_path, YAML)
    v1 = facts_schema(pa.int64(), pa.int64())
    # 1. no products table yet: facts parked, then released with unknown members in the next
    # batch (wait 0s); their dimension outputs are null, of no known type yet
    upsert(root, v1, (1, 10, 7, 1, T0), (2, 10, 8, 2, T0))
    code, out = cli(capsys, yaml, "--run-id", "r1")
    assert code == 0, out
    upsert(root, v1, (6, 10, 7, 4, T0))
    code, out = cli(capsys, yaml, "--run-id", "r1b")
    assert code == 0, out
    assert actual(root)["enriched"] == {1: (1, None, None), 2: (2, None, None)}, out

    # 2. the dimension appears (w bigint): restated, and stored as numbers, not strings
    write_deltalake(str(root / "lake/products"), pa.table(
        {"id": [10], "cat": ["A"], "w": pa.array([5], pa.int64())}), configuration=CDF)
    upsert(root, v1, (3, 10, 7, 3, T0))
    code, out = cli(capsys, yaml, "--run-id", "r2")
    assert code == 0, out
    assert actual(root) == truth(root)
    assert types_of(root / "gold/lines")["w"] == "int64", out
    assert types_of(root / "gold/units")["wsum"] == "int64", out

    # 3. qty widened upstream, then fractions: stored exactly in enriched and both aggregates
    widen_upstream(root, "facts", {"qty": pa.float64()})
    v2 = facts_schema(pa.float64(), pa.int64())
    upsert(root, v2, (4, 10, 8, 2.5, T0), (2, 10, 8, 0.5, T0))
    code, out = cli(capsys, yaml, "--run-id", "r3")
    assert code == 0, out
    assert "[enrich] widening" in out, out
    assert actual(root) == truth(root), out
    assert actual(root)["by_shop"][8] == (3.0, 2)
    assert types_of(root / "gold/lines")["qty"] == "double"

    # 4. a group_by column widened to double: its stored group keys ({"shop":7}) would change.
    # Stop before any write; --reprocess rebuilds everything in the new types.
    widen_upstream(root, "facts", {"shop": pa.float64()})
    upsert(root, facts_schema(pa.float64(), pa.float64()), (5, 10, 7.0, 1.0, T0))
    versions = {n: DeltaTable(str(root / "gold" / n)).version() for n in ("lines", "units", "by_shop")}
    code, out = cli(capsys, yaml, "--run-id", "r4")
    assert code == 3, out
    for text in ("aggregate:by_shop", "'shop' is bigint in the table, double in this batch",
                 "group_by", "--reprocess"):
        assert text in out, (text, out)
    assert {n: DeltaTable(str(root / "gold" / n)).version() for n in versions} == versions
    code, out = cli(capsys, yaml, "--run-id", "r5", "--reprocess")
    assert code == 0, out
    assert actual(root) == truth(root), out
    code, out = cli(capsys, yaml, "--run-id", "r6")   # and it goes on from there
    assert code == 0, out
    assert actual(root) == truth(root), out
