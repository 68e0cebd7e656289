"""Full refresh: chosen tables are rebuilt from the whole landing history and swapped in with
one Delta commit each; other tables and the main checkpoint are untouched; the next incremental
run still converges (it re-applies files the refresh already saw, which changes nothing)."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from reference_model import ReferenceModel, RefConfig, assert_no_diff, diff_table, read_delta_rows

from cdc_lake.config import load_pipeline
from cdc_lake.demo.generator import generate
from cdc_lake.demo.pipeline_yaml import write_pipeline_yaml
from cdc_lake.cdc.job import run_pipeline


def _expected(yaml, landing):  # type: ignore[no-untyped-def]
    model = ReferenceModel(RefConfig.from_yaml(yaml))
    for f in sorted(landing.glob("*.json")):
        model.add_file(f)
    return model


def test_full_refresh_rebuilds_chosen_table_atomically(spark, tmp_path):
    landing = tmp_path / "landing"
    generate(landing, "maxwell", days=1, seed=21, lines_per_file=80)
    yaml = write_pipeline_yaml(tmp_path / "p.yaml", "maxwell", name="refresh", landing=landing,
                               lake_root=tmp_path / "lake", tables=["products", "orders"])
    cfg = load_pipeline(yaml)
    run_pipeline(cfg, spark=spark, run_id="r1")
    products = str(cfg.tables["products"].path)
    orders = str(cfg.tables["orders"].path)
    # Damage the table the way an operator mistake would: rows deleted outside the pipeline.
    DeltaTable(products).delete("id % 2 = 0")
    damaged_version = DeltaTable(products).version()
    orders_version = DeltaTable(orders).version()
    checkpoint_before = sorted(p.name for p in (cfg.checkpoint_path / "commits").iterdir())

    summary = run_pipeline(cfg, spark=spark, run_id="refresh1", tables=["products"], full_refresh=True)

    assert summary["full_refresh"] is True and summary["status"] == "succeeded"
    assert DeltaTable(products).version() == damaged_version + 1  # one swap commit
    assert DeltaTable(orders).version() == orders_version  # untouched
    assert sorted(p.name for p in (cfg.checkpoint_path / "commits").iterdir()) == checkpoint_before
    assert not list((cfg.lake_root / "_staging").glob("*")), "staging must be cleaned up"
    model = _expected(yaml, landing)
    assert_no_diff(diff_table(model.scd1("products"), read_delta_rows(products), ("id",), table="products"))
    # Readers of the previous version still see the damaged table (time travel), i.e. the
    # refresh never exposed a half-built table.
    assert DeltaTable(products, version=damaged_version).to_pyarrow_table().num_rows < \
        DeltaTable(products).to_pyarrow_table().num_rows

    # New data after the refresh: the incremental run converges for every table.
    generate(landing, "maxwell", days=1, seed=21, start_day=1, lines_per_file=80)
    run_pipeline(cfg, spark=spark, run_id="r2")
    model = _expected(yaml, landing)
    for name in ("products", "orders"):
        assert_no_diff(diff_table(model.scd1(name), read_delta_rows(cfg.tables[name].path), ("id",),
                                  table=name))


def test_full_refresh_of_table_without_events_empties_it_and_keeps_other_staging(spark, tmp_path):
    """Issue 6 items 8a and 10: a table with no events in the landing history is rebuilt as an
    empty table (one swap commit, schema kept); another pipeline's ``_staging`` under the same
    storage root is left alone."""
    from job_helpers import event, land, pipeline, rows

    cfg = pipeline(tmp_path, name="refresh_empty")
    land(cfg.landing_path, "a.json", event(1), event(2))
    gone = land(cfg.landing_path, "b.json", event(3, "customers"), event(4, "customers"))
    run_pipeline(cfg, spark=spark, run_id="r1")
    customers = cfg.tables["customers"].path
    assert rows(customers) == {3: "s3", 4: "s4"}
    before = DeltaTable(str(customers)).version()
    other = cfg.lake_root / "_staging" / "other_pipeline" / "run_x"
    other.mkdir(parents=True)
    (other / "keep.txt").write_text("another pipeline's refresh in progress")
    gone.unlink()  # the landing history no longer holds any customers event
    # an ingested file gone: the refresh stops (its rows would be lost), unless the operator
    # moves the checkpoint aside as the message says (deleting the file on purpose)
    from cdc_lake.cdc.backlog import LandingHistoryIncomplete

    with pytest.raises(LandingHistoryIncomplete):
        run_pipeline(cfg, spark=spark, run_id="refresh0", tables=["customers"], full_refresh=True)
    assert rows(customers) == {3: "s3", 4: "s4"}
    cfg.checkpoint_path.rename(cfg.checkpoint_path.with_name(cfg.checkpoint_path.name + ".before-refresh"))

    s = run_pipeline(cfg, spark=spark, run_id="refresh1", tables=["customers"], full_refresh=True)

    assert s["status"] == "succeeded"
    assert rows(customers) == {}, "an empty table is the truth"
    assert DeltaTable(str(customers)).version() == before + 1
    assert "status" in DeltaTable(str(customers)).schema().to_arrow().names  # schema kept
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2"}
    assert (other / "keep.txt").is_file(), "another pipeline's staging was deleted"
    assert not (cfg.lake_root / "_staging" / cfg.name).exists()


def test_full_refresh_keeps_the_types_the_incremental_runs_gave_and_quarantines_alike(spark, tmp_path):
    """Tester (2026-11-28): a value the incremental run quarantined (``"qty": "three"`` in a
    bigint column) was let back in by the full refresh the exit-3 messages recommend: the
    rebuild typed the whole history as one first batch, so ``qty`` became a string column
    holding "three" (exit 0, 0 quarantined; an enrichment summing ``qty`` then failed). The
    rebuild starts from the live table's types: the same rows and types as the incremental runs.
    A column widened on the way (bigint -> decimal) keeps its wider type."""
    from job_helpers import event, land, pipeline

    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", *(event(i, qty=i, price=i) for i in range(1, 4)))
    run_pipeline(cfg, spark=spark, run_id="r1")
    land(cfg.landing_path, "b.json", event(4, qty="three", price=4), event(5, qty=5, price=5.25))
    s = run_pipeline(cfg, spark=spark, run_id="r2")
    assert s["quarantined"] == 1, s
    orders = str(cfg.tables["orders"].path)

    def state():  # type: ignore[no-untyped-def]
        dt = DeltaTable(orders)
        types = {f.name: str(f.type) for f in dt.schema().fields if f.name in ("qty", "price")}
        rows = sorted((r["id"], r["qty"], r["price"]) for r in dt.to_pyarrow_table().to_pylist())
        return types, rows

    incremental = state()
    assert "long" in incremental[0]["qty"] and "decimal" in incremental[0]["price"], incremental
    assert [r[0] for r in incremental[1]] == [1, 2, 3, 5], incremental
    refresh = run_pipeline(cfg, spark=spark, run_id="refresh", tables=["orders"], full_refresh=True)
    assert state() == incremental, (state(), incremental)
    # the summary counts the line the rebuild left out (it said 0); the quarantine keeps its one row
    assert refresh["quarantined"] == 1, refresh
    assert DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().num_rows == 1
    # a per-run quarantine limit judges incremental runs only: the rebuild's count is history
    import dataclasses

    from cdc_lake.quarantine_limits import QuarantineLimits
    strict = dataclasses.replace(cfg, quarantine_limits=QuarantineLimits(max_rows=0))
    again = run_pipeline(strict, spark=spark, run_id="refresh2", tables=["orders"], full_refresh=True)
    assert again["status"] == "succeeded" and again["quarantined"] == 1, again
    assert state() == incremental
