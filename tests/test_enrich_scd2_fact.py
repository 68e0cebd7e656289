"""A CDC table kept as SCD2 (``scd: 2``) as the enrichment's fact: a fact's state is its open
version. Such a table's change feed holds, per changed key and commit, the new version (an
insert) *and* the closed old one (an update post-image with ``_valid_to`` set); a delete is a
new version marked ``_cdc_op = 'delete'``. Before, the job took one of the two rows
arbitrarily and enriched a deleted order as a live one; with the key check it stopped with a
false key violation. The CDC job writes the fact table here (real SCD2 MERGE commits); the
truth is read from that table: its open, non-delete versions."""

from __future__ import annotations

from pathlib import Path

import job_helpers
import pyarrow as pa
from deltalake import write_deltalake
from job_helpers import event, land
from test_enrich_safety import _read, cli, write_yaml

from cdc_lake.cdc.job import run_pipeline

YAML = """
    kind: enrich
    pipeline: scd2fact
    fact: {{change_feed: {orders}, keys: [id]}}
    dimensions:
      customers: {{table: dims/customers, keys: [id], on: {{customer_id: id}},
                  columns: {{customer: name}}}}
    outputs:
      enriched: gold/orders
      aggregates:
        per_customer: {{group_by: [customer], sums: {{amount: amount}}}}
    engine: {{name: deltalake}}
    spark: {{conf: {{spark.sql.shuffle.partitions: "2"}}}}
"""


def truth(orders: Path, customers: dict[int, str]) -> tuple[dict, dict]:
    live = {r["id"]: r for r in _read(orders)
            if r["_valid_to"] is None and r.get("_cdc_op") != "delete"}
    enriched = {i: (r["status"], customers[r["customer_id"]]) for i, r in live.items()}
    per: dict[str, tuple[int, int]] = {}
    for i, r in live.items():
        s, n = per.get(customers[r["customer_id"]], (0, 0))
        per[customers[r["customer_id"]]] = (s + r["amount"], n + 1)
    return enriched, per


def actual(root: Path) -> tuple[dict, dict]:
    rows = _read(root / "gold/orders")
    assert len(rows) == len({r["id"] for r in rows}), rows
    return ({r["id"]: (r["status"], r["customer"]) for r in rows},
            {r["customer"]: (r["amount"], r["count"]) for r in _read(root / "gold/per_customer")
             if r["count"]})


def test_scd2_cdc_table_as_fact_enriches_open_versions(spark, tmp_path: Path, capsys,
                                                       monkeypatch) -> None:
    monkeypatch.setattr(job_helpers, "YAML", job_helpers.YAML.replace(
        "  orders: {{keys: [id]}}\n", "  orders: {{keys: [id], scd: 2}}\n"))
    cdc = job_helpers.pipeline(tmp_path)
    orders = cdc.table_path("orders")
    customers = {1: "ann", 2: "bob"}
    write_deltalake(str(tmp_path / "dims/customers"), pa.Table.from_pylist(
        [{"id": k, "name": v} for k, v in customers.items()]))
    yaml = write_yaml(tmp_path, YAML.format(orders=orders))

    def o(i: int, key: int, typ: str = "insert", **kw) -> str:  # type: ignore[no-untyped-def]
        return event(i, typ=typ, id=key, **{"customer_id": 1, "amount": 10 * key, **kw})

    steps = [[o(1, 1), o(2, 2), o(3, 3, customer_id=2)],
             [o(4, 1, "update", customer_id=2, status="moved"), o(5, 2, "delete"),
              o(6, 3, "update", amount=7)],
             [o(7, 2, status="back"), o(8, 3, "delete"), o(9, 4)]]
    for n, lines in enumerate(steps):
        land(tmp_path / "landing", f"{n}.json", *lines)
        assert run_pipeline(cdc, spark=spark, run_id=f"c{n}")["status"] == "succeeded"
        code, out = cli(capsys, yaml, "--run-id", f"e{n}")
        assert code == 0, out
        assert actual(tmp_path) == truth(orders, customers), (n, out[-2000:])
    assert actual(tmp_path)[0] == {1: ("moved", "bob"), 2: ("back", "ann"), 4: ("s9", "ann")}
    code, out = cli(capsys, yaml, "--run-id", "again", "--reprocess")   # the snapshot path
    assert code == 0, out
    assert actual(tmp_path) == truth(orders, customers)
