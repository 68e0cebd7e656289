"""Declared keys that are not unique stop the enrichment run before it writes (F8, F9).

F8: a dimension with two rows for one join key (SCD1), or two versions of one key whose
validity intervals overlap (SCD2), duplicated every fact joined to it (2 facts -> 3 enriched
rows, aggregates counting a fact twice). F9: two rows of one ``fact.keys`` value in one commit
kept one and lost the other. Both exited 0. Now the micro-batch stops before any write (exit 3,
``UPSTREAM KEY VIOLATION`` naming YAML, table, version, key values and counts), the output
tables keep their versions, and after the upstream fix a rerun converges to the truth computed
here from the upstream tables alone (no import from ``cdc_lake.enrich``). Legitimate repeats —
update pre/post images, several commits of one key in a batch, re-insert after delete, SCD2
versions of one key that do not overlap, facts with no member — still run.

Upstream tables are written with delta-rs; the job runs through its CLI main in this process
(``cli`` of ``test_enrich_safety``), on the session's Spark.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from test_enrich_safety import CDF, _read, cli, write_yaml

T0 = datetime(2026, 3, 1, tzinfo=UTC)
TS = pa.timestamp("us", tz="UTC")
FACTS = pa.schema([("line_id", pa.int64()), ("product_id", pa.int64()), ("shop_id", pa.int64()),
                   ("qty", pa.int64()), ("ts", TS)])
PRODUCTS = pa.schema([("id", pa.int64()), ("cat", pa.string())])
SHOPS = pa.schema([("id", pa.int64()), ("region", pa.string()), ("_valid_from", TS),
                   ("_valid_to", TS), ("_is_current", pa.bool_())])
KEYS = {"facts": "line_id", "products": "id", "shops": "id"}
SCHEMAS = {"facts": FACTS, "products": PRODUCTS, "shops": SHOPS}

YAML = """
    kind: enrich
    pipeline: keys
    fact: {change_feed: lake/facts, keys: [line_id]}
    dimensions:
      products: {table: lake/products, keys: [id], scd: 1, on: {product_id: id},
                 columns: {category: cat}}
      shops: {table: lake/shops, keys: [id], scd: 2, on: {shop_id: id},
              columns: {region: region}}
    event_time: ts
    late_members: {wait: 1d}
    outputs:
      enriched: gold/lines
      aggregates:
        units: {group_by: [category], sums: {units: qty}}
    engine: {name: deltalake}
    spark: {conf: {spark.sql.shuffle.partitions: "2"}}
"""
OUTPUTS = ("gold/lines", "gold/_pending/keys", "gold/units", "gold/_manifests/keys")


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def table(root: Path, name: str) -> Path:
    return root / "lake" / name


def merge(root: Path, name: str, *rows: tuple, delete: tuple = ()) -> None:
    """One commit: upsert ``rows`` and delete keys ``delete`` by the table's key (SCD2 shops:
    id + _valid_from); the first write creates the table with the change data feed on."""
    schema, path = SCHEMAS[name], str(table(root, name))
    t = pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows], schema=schema)
    if not DeltaTable.is_deltatable(path):
        write_deltalake(path, t, configuration=CDF)
        return
    on = f"t.{KEYS[name]} = s.{KEYS[name]}" + (" AND t._valid_from = s._valid_from"
                                                if name == "shops" else "")
    if rows:
        (DeltaTable(path).merge(t, on, "s", "t").when_matched_update_all()
         .when_not_matched_insert_all().execute())
    for key in delete:
        DeltaTable(path).delete(f"{KEYS[name]} = {key}")


def append(root: Path, name: str, *rows: tuple) -> None:
    """One commit that inserts ``rows`` as they are (how an upstream gets a duplicate key)."""
    schema = SCHEMAS[name]
    write_deltalake(str(table(root, name)), pa.Table.from_pylist(
        [dict(zip(schema.names, r)) for r in rows], schema=schema), mode="append")


def truth(root: Path) -> dict:
    """What the outputs must hold, from the upstream tables now (the dimensions change only to
    undo a duplicate, so point-in-time = current): enriched {line_id: (qty, category, region)},
    pending line ids, units per category {category: (sum qty, count)}."""
    cats: dict = {}
    for r in _read(table(root, "products")):
        cats.setdefault(r["id"], []).append(r["cat"])
    shops = _read(table(root, "shops"))
    enriched, pending, units = {}, [], {}
    for f in _read(table(root, "facts")):
        cat = cats.get(f["product_id"], [])
        regions = [s["region"] for s in shops if s["id"] == f["shop_id"]
                   and s["_valid_from"] <= f["ts"] and (s["_valid_to"] is None or f["ts"] < s["_valid_to"])]
        assert len(cat) <= 1 and len(regions) <= 1, "the truth needs unique upstream keys"
        if not cat or not regions:
            pending.append(f["line_id"])
            continue
        enriched[f["line_id"]] = (f["qty"], cat[0], regions[0])
        s, n = units.get(cat[0], (0, 0))
        units[cat[0]] = (s + f["qty"], n + 1)
    return {"enriched": enriched, "pending": sorted(pending), "units": units}


def actual(root: Path) -> dict:
    lines = _read(root / "gold/lines")
    return {"enriched": {r["line_id"]: (r["qty"], r["category"], r["region"]) for r in lines},
            "pending": sorted(r["line_id"] for r in _read(root / "gold/_pending/keys")),
            "units": {r["category"]: (r["units"], r["count"]) for r in _read(root / "gold/units")},
            # a duplicated fact would hide in the dict above: count the rows too
            "rows": len(lines)}


def converged(root: Path) -> None:
    got, want = actual(root), truth(root)
    assert got.pop("rows") == len(want["enriched"]), got
    assert got == want


def versions(root: Path) -> dict[str, int | None]:
    return {rel: DeltaTable(str(root / rel)).version() if DeltaTable.is_deltatable(str(root / rel))
            else None for rel in OUTPUTS}


def start(root: Path, capsys) -> Path:  # type: ignore[no-untyped-def]
    """Dimensions (shop 1 moved from north to south at T0: two non-overlapping versions) and two
    facts, enriched by run r1."""
    merge(root, "products", (10, "A"), (11, "B"))
    merge(root, "shops", (1, "north", h(-240), h(0), False), (1, "south", h(0), None, True),
          (2, "west", h(-240), None, True))
    merge(root, "facts", (1, 10, 1, 1, h(-5)), (2, 11, 1, 2, h(5)))
    yaml = write_yaml(root, YAML)
    code, out = cli(capsys, yaml, "--run-id", "r1")
    assert code == 0, out
    converged(root)
    return yaml


def stopped(capsys, root: Path, yaml: Path, run_id: str, *names: str) -> str:  # type: ignore[no-untyped-def]
    before = versions(root)
    code, out = cli(capsys, yaml, "--run-id", run_id)
    assert code == 3 and "UPSTREAM KEY VIOLATION" in out, out
    assert str(yaml) in out and "stopped before writing anything" in out, out
    for n in names:
        assert n in out, (n, out)
    assert versions(root) == before, "the stopped batch wrote"
    return out


# -- F8 ----------------------------------------------------------------------------------------
def test_scd1_dimension_with_a_duplicated_key_stops_then_converges(spark, tmp_path: Path,
                                                                  capsys) -> None:
    yaml = start(tmp_path, capsys)
    append(tmp_path, "products", (10, "C"))                 # a second row for product 10
    dim_version = DeltaTable(str(table(tmp_path, "products"))).version()
    merge(tmp_path, "facts", (3, 10, 2, 4, h(1)), (4, 11, 2, 8, h(2)), (5, 99, 2, 1, h(3)))
    out = stopped(capsys, tmp_path, yaml, "r2", "dimension 'products'",
                  str(table(tmp_path, "products")), f"Delta version {dim_version}", "id=10: 2 rows",
                  "1 fact(s)")
    DeltaTable(str(table(tmp_path, "products"))).delete("id = 10 AND cat = 'C'")
    code, out = cli(capsys, yaml, "--run-id", "r4")
    assert code == 0, out
    converged(tmp_path)
    assert actual(tmp_path)["pending"] == [5]


def test_scd2_overlapping_versions_stop_then_converge(spark, tmp_path: Path, capsys) -> None:
    yaml = start(tmp_path, capsys)
    # a version of shop 1 inside the open 'south' one: [T0+1h, T0+3h) overlaps [T0, open)
    merge(tmp_path, "shops", (1, "east", h(1), h(3), False))
    merge(tmp_path, "facts", (3, 10, 1, 4, h(2)), (4, 11, 1, 8, h(6)), (6, 10, 2, 3, h(2)))
    stopped(capsys, tmp_path, yaml, "r2", "dimension 'shops'", str(table(tmp_path, "shops")),
            "overlap", "id=1 at ts 2026-03-01 02:00:00", "2 versions valid")
    # the fix: the open version starts where the inserted one ends ('south' from T0 + 3h)
    DeltaTable(str(table(tmp_path, "shops"))).update(
        {"_valid_from": "CAST('2026-03-01 03:00:00' AS TIMESTAMP)"},
        predicate="id = 1 AND region = 'south'")
    merge(tmp_path, "shops", (1, "north2", h(0), h(1), False))   # and [T0, T0+1h) is covered
    code, out = cli(capsys, yaml, "--run-id", "r3")
    assert code == 0, out
    converged(tmp_path)
    assert actual(tmp_path)["enriched"][3][2] == "east"


# -- F9 ----------------------------------------------------------------------------------------
def test_fact_key_twice_in_one_commit_stops_nothing_lost(spark, tmp_path: Path, capsys) -> None:
    yaml = start(tmp_path, capsys)
    append(tmp_path, "facts", (7, 10, 1, 1, h(1)), (7, 11, 1, 2, h(1)), (8, 10, 1, 3, h(1)))
    version = DeltaTable(str(table(tmp_path, "facts"))).version()
    stopped(capsys, tmp_path, yaml, "r2", str(table(tmp_path, "facts")), "line_id=7",
            f"Delta version {version}: 2 rows", "--reprocess")
    # the upstream fix: the change feed keeps the duplicated commit, so a plain rerun stops again
    DeltaTable(str(table(tmp_path, "facts"))).delete("line_id = 7 AND qty = 2")
    stopped(capsys, tmp_path, yaml, "r3", "line_id=7")
    code, out = cli(capsys, yaml, "--run-id", "r4", "--reprocess")
    assert code == 0, out
    converged(tmp_path)
    assert actual(tmp_path)["enriched"][7] == (1, "A", "south")
    merge(tmp_path, "facts", (9, 11, 2, 5, h(4)))
    code, out = cli(capsys, yaml, "--run-id", "r5")
    assert code == 0, out
    converged(tmp_path)


# -- what must still run -----------------------------------------------------------------------
def test_legitimate_repeats_still_run(spark, tmp_path: Path, capsys) -> None:
    """One micro-batch with: update pre/post images, three commits of line 1, line 2 deleted
    and re-inserted, a fact with no product (parked), facts on both sides of shop 1's version
    change (SCD2 key repeated, intervals not overlapping)."""
    yaml = start(tmp_path, capsys)
    merge(tmp_path, "facts", (1, 10, 1, 5, h(-5)), (3, 11, 1, 2, h(-1)))
    merge(tmp_path, "facts", (1, 11, 1, 6, h(7)))
    merge(tmp_path, "facts", delete=(2,))
    merge(tmp_path, "facts", (2, 10, 1, 9, h(-3)), (4, 12, 2, 1, h(1)))
    merge(tmp_path, "facts", (1, 10, 2, 7, h(8)), (5, 10, 1, 4, h(0)))
    code, out = cli(capsys, yaml, "--run-id", "r2")
    assert code == 0 and '"batches": 1,' in out, out   # all five commits in one micro-batch
    converged(tmp_path)
    got = actual(tmp_path)
    assert got["pending"] == [4] and got["enriched"][2] == (9, "A", "north"), got
    assert got["enriched"][5][2] == "south" and got["enriched"][1] == (7, "A", "west"), got
