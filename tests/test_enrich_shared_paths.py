"""Two pipelines must never share an output table (tester's s7: data loss with exit 0).

Two enrichment pipelines whose enriched tables sit in one folder and that both define an
aggregate ``units`` both wrote ``<root>/units``: the counts were mixed, and ``--reprocess`` of
one deleted the table and rebuilt only its own part. Now:

* the load of all pipelines (``cdc_lake.config.load_all``, the Airflow DAG factory) refuses two
  pipelines of any kinds whose written paths are one, or one inside the other (no Spark);
* the job, which loads only its own YAML, refuses (exit 2, nothing written, nothing deleted) an
  output table another pipeline's writes are recorded in (the Delta transaction app ids of its
  log), also under ``--reprocess``; a table without any mark is its own only when its records
  list it (tables from before) or it holds no rows.

Same style as ``tests/test_enrich_safety.py``: small upstream tables written with ``deltalake``,
the job run through its CLI in this process, truth computed here.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from test_enrich_safety import (CDF, FACTS, _read, actual, cli, facts, products, truth, two_runs,
                                upsert, write_yaml)

from cdc_lake.config import load_all, load_pipeline

ENRICH = """
    kind: enrich
    pipeline: {n}
    fact: {{change_feed: lake/orders_{n}, keys: [line_id]}}
    dimensions:
      products: {{table: lake/products, keys: [id], scd: 1, on: {{product_id: id}}, columns: {{category: cat}}}}
    late_members: {{wait: 1d}}
    outputs:
      enriched: gold/lines_{n}
      aggregates:
        {agg}: {{{path}group_by: [category], sums: {{units: qty}}}}
    engine: {{name: deltalake}}
    spark: {{conf: {{spark.sql.shuffle.partitions: "2"}}}}
"""

CDC = """
    pipeline: shop
    source: {format: maxwell, path: landing/shop, database: shop}
    storage: {root: lake/shop}
    tables:
      orders: {keys: [id]}
"""

DIMENSION = """
    kind: dimension
    pipeline: cats
    snapshots: {path: snapshots/cats, format: csv}
    keys: [product_id]
    table: lake/dims/cats
"""


def enrich(n: str, agg: str = "units", path: str = "", extra: str = "") -> str:
    return ENRICH.format(n=n, agg=agg, path=f"path: {path}, " if path else "") + extra


def write(folder: Path, name: str, body: str) -> Path:
    f = folder / name
    f.write_text(textwrap.dedent(body), encoding="utf-8")
    return f


# -- (a) load_all: every pipeline of a folder against the others --------------------------------
SHARED = {
    # case: (other YAML (name, body), enrich YAML body, enrich key, other key, shared path)
    "two enrich pipelines, one aggregate name in one folder": (
        ("eu.yaml", enrich("eu")), enrich("us"), "outputs.aggregates.units.path",
        "outputs.aggregates.units.path", "gold/units"),
    "enriched table is a CDC pipeline's table": (
        ("shop.yaml", CDC), enrich("us").replace("enriched: gold/lines_us", "enriched: lake/shop/orders"),
        "outputs.enriched", "tables.orders.path", "lake/shop/orders"),
    "aggregate inside a dimension kind's table": (
        ("cats.yaml", DIMENSION), enrich("us", path="lake/dims/cats/units"),
        "outputs.aggregates.units.path", "table", "lake/dims/cats"),
    "checkpoint holding a CDC pipeline's checkpoint": (
        ("shop.yaml", CDC), enrich("us", extra="    storage: {checkpoint: lake/shop/_checkpoints}\n"),
        "storage.checkpoint", "storage.checkpoint", "lake/shop/_checkpoints"),
}


@pytest.mark.parametrize("case", sorted(SHARED))
def test_load_all_refuses_two_pipelines_writing_one_path(tmp_path: Path, case: str) -> None:
    (other_name, other_body), body, key, other_key, shared = SHARED[case]
    other = write(tmp_path, other_name, other_body)
    mine = write(tmp_path, "us.yaml", body)
    load_pipeline(other), load_pipeline(mine)          # each file alone is valid
    ok, bad = load_all(tmp_path)
    assert ok == [], [c.name for c in ok]               # neither DAG is built
    by_file = {e.file: e for e in bad}
    assert set(by_file) == {str(mine), str(other)}, bad
    for me, you, k, ok_ in ((mine, other, key, other_key), (other, mine, other_key, key)):
        e = by_file[str(me)]
        msg = str(e)
        assert e.key == k and str(you) in msg and ok_ in msg, msg
        assert str(tmp_path / shared) in msg, msg


def test_load_all_keeps_pipelines_that_only_share_a_folder_and_the_quarantine(tmp_path: Path) -> None:
    """Same storage root, own aggregate names, the default `<root>/_quarantine` (an append-only
    log with a pipeline column) shared; a CDC and a dimension pipeline next to them."""
    write(tmp_path, "eu.yaml", enrich("eu", agg="units_eu"))
    write(tmp_path, "us.yaml", enrich("us", agg="units_us"))
    write(tmp_path, "shop.yaml", CDC)
    write(tmp_path, "cats.yaml", DIMENSION)
    ok, bad = load_all(tmp_path)
    assert bad == [] and {c.name for c in ok} == {"eu", "us", "shop", "cats"}, bad
    eu, us = (next(c for c in ok if c.name == n) for n in ("eu", "us"))
    assert eu.outputs.quarantine == us.outputs.quarantine


# -- (b) the job: an output table owned by another pipeline -------------------------------------
P = pa.schema([("id", pa.int64()), ("cat", pa.string())])


def _state(path: Path) -> tuple:
    """What must not change: Delta version, rows and the files of the table folder."""
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    rows = sorted(tuple(sorted(r.items())) for r in _read(path))
    return DeltaTable(str(path)).version(), rows, files


def _units(path: Path) -> dict:
    return {r["category"]: (r["units"], r["count"]) for r in _read(path)}


def test_job_refuses_to_write_or_reprocess_a_table_another_pipeline_owns(spark, tmp_path: Path,
                                                                        capsys) -> None:
    upsert(tmp_path / "lake/products", [(10, "A"), (11, "B")], P, "id")
    upsert(tmp_path / "lake/orders_eu", [(1, 10, 1), (2, 11, 2)], FACTS, "line_id")
    upsert(tmp_path / "lake/orders_us", [(1, 10, 100)], FACTS, "line_id")
    eu = write(tmp_path, "eu.yaml", enrich("eu"))
    us = write(tmp_path, "us.yaml", enrich("us"))
    units = tmp_path / "gold/units"
    code, out = cli(capsys, eu, "--run-id", "eu1")
    assert code == 0, out
    assert _units(units) == {"A": (1, 1), "B": (2, 1)}
    before = _state(units)

    for args in (("--run-id", "us1"), ("--run-id", "us2", "--reprocess")):
        code, out = cli(capsys, us, *args)
        assert code == 2, out
        assert f"{us}: outputs.aggregates.units.path:" in out, out
        assert str(units) in out and "pipeline 'eu'" in out and "pipeline 'us'" in out, out
        assert _state(units) == before, f"{args}: the other pipeline's table changed"
        assert not (tmp_path / "gold/lines_us").exists() and not (tmp_path / "gold/_pending/us").exists()

    # the owner goes on as before, runs and --reprocess
    upsert(tmp_path / "lake/orders_eu", [(3, 10, 4)], FACTS, "line_id")
    code, out = cli(capsys, eu, "--run-id", "eu2")
    assert code == 0, out
    assert _units(units) == {"A": (5, 2), "B": (2, 1)}
    code, out = cli(capsys, eu, "--run-id", "eu3", "--reprocess")
    assert code == 0, out
    assert _units(units) == {"A": (5, 2), "B": (2, 1)}


def _strip_marks(table: Path) -> None:
    """A table as if no job had marked it: the txn actions removed from its log (no checkpoint
    file yet in these small tables). Its commit files change, so the fingerprints the
    pipeline's records hold for them go too (a record of a release without fingerprints)."""
    import json

    log = table / "_delta_log"
    assert not list(log.glob("*.checkpoint*")), "test needs a log without checkpoint"
    for f in log.glob("*.json"):
        lines = f.read_text(encoding="utf-8").splitlines(keepends=True)
        f.write_text("".join(x for x in lines if '"txn"' not in x), encoding="utf-8")
    for rec in table.parents[1].rglob("enrich_table_versions.json"):
        data = json.loads(rec.read_text(encoding="utf-8"))
        for entry in data.get("tables", {}).values():
            if entry.get("path") == str(table):
                entry.pop("fingerprint", None)
        rec.write_text(json.dumps(data), encoding="utf-8")


@pytest.mark.slow  # tables from before the owner marks (2026-11); CI time, ~30 s of 4 runs
def test_unmarked_tables_of_the_pipeline_itself_still_work(spark, tmp_path: Path, capsys) -> None:
    """Unmarked state tables the pipeline's own records list are its own (runs and --reprocess)."""
    yaml = two_runs(tmp_path, capsys)
    for rel in ("gold/lines", "gold/_pending/safe", "gold/units"):
        _strip_marks(tmp_path / rel)
    facts(tmp_path, (6, 10, 7), (2, 11, 8))
    code, out = cli(capsys, yaml, "--run-id", "r3")
    assert code == 0, out
    assert actual(tmp_path) == truth(tmp_path)
    _strip_marks(tmp_path / "gold/units")
    code, out = cli(capsys, yaml, "--run-id", "r4", "--reprocess")
    assert code == 0, out
    assert actual(tmp_path) == truth(tmp_path)


def test_an_unmarked_empty_table_a_stopped_run_created_is_taken(spark, tmp_path: Path, capsys) -> None:
    """An unmarked empty output table (created by a run stopped before its first write) is the
    pipeline's own: the next run writes into it."""
    fresh = tmp_path / "fresh"
    products(fresh, (10, "A"))
    facts(fresh, (1, 10, 3))
    DeltaTable.create(str(fresh / "gold/units"), configuration=CDF, schema=pa.schema(
        [("_group_key", pa.string()), ("category", pa.string()), ("units", pa.int64()),
         ("count", pa.int64())]))   # as the job creates it, before its first write
    code, out = cli(capsys, write_yaml(fresh), "--run-id", "f1")
    assert code == 0, out
    assert actual(fresh) == truth(fresh)


def test_unmarked_table_with_rows_not_in_the_records_is_refused(spark, tmp_path: Path, capsys) -> None:
    """A table the pipeline's records do not list and no job marked (made by hand, another tool)
    at an output path: neither written into nor deleted by --reprocess."""
    products(tmp_path, (10, "A"))
    facts(tmp_path, (1, 10, 3))
    units = tmp_path / "gold/units"
    write_deltalake(str(units), pa.table({"category": ["X"], "units": [9], "count": [1]}),
                    configuration=CDF)
    before = _state(units)
    yaml = write_yaml(tmp_path)
    for args in (("--run-id", "r1"), ("--run-id", "r2", "--reprocess")):
        code, out = cli(capsys, yaml, *args)
        assert code == 2, out
        assert "outputs.aggregates.units.path" in out and str(units) in out and "no owner mark" in out, out
        assert _state(units) == before
        assert not (tmp_path / "gold/lines").exists()
