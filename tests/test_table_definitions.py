"""A table's definition changed in the YAML of a running pipeline (``cdc_lake.cdc.definitions``).

Tester, 2026-11-29: ``scd: 2`` removed from a table -> SCD2 version rows and SCD1 rows mixed in
one table, exit 0; ``keys`` changed or ``scd: 2`` added -> a delta-rs / pyarrow traceback, exit
1 (retried); a table renamed in the YAML (``source_table`` kept) -> the new table held only the
changes from then on, exit 0. Now each stops with exit 2 naming the setting, both values and the
full refresh that rebuilds the table under the new definition; the refresh converges.
"""

from __future__ import annotations

from pathlib import Path

from job_helpers import event, land, pipeline, rows, run_cli

from cdc_lake.cdc.job import run_pipeline
from cdc_lake.config import load_pipeline


def _yaml(cfg_file: Path, tables: str) -> None:
    text = cfg_file.read_text(encoding="utf-8")
    head = text[: text.index("tables:")]
    cfg_file.write_text(head + "tables:\n" + tables, encoding="utf-8")


def _version(path: Path) -> int:
    from deltalake import DeltaTable

    return DeltaTable(str(path)).version()


def test_keys_or_scd_changed_on_a_running_pipeline_stop_until_a_full_refresh(spark, tmp_path):
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", *(event(i) for i in range(1, 4)), event(9, "customers"))
    run_pipeline(cfg, spark=spark, run_id="r1")
    orders, customers = cfg.tables["orders"].path, cfg.tables["customers"].path
    before = (_version(orders), _version(customers))

    _yaml(cfg.file, "  orders: {keys: [id], scd: 2}\n  customers: {keys: [id, status]}\n")
    land(cfg.landing_path, "b.json", event(4), event(10, "customers"))
    r = run_cli(spark, cfg.file)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr
    assert "CONFIG ERROR" in err and "tables.orders.scd: 1 -> 2" in err, err
    assert "tables.customers.keys: ['id'] -> ['id', 'status']" in err, err
    assert f"--pipeline {cfg.file} --full-refresh --tables customers,orders" in err, err
    assert (_version(orders), _version(customers)) == before, "nothing may be written"

    # put back, the run passes; changed again, the fix the message names converges
    _yaml(cfg.file, "  orders: {keys: [id]}\n  customers: {keys: [id]}\n")
    assert run_cli(spark, cfg.file, run_id="r2").returncode == 0
    _yaml(cfg.file, "  orders: {keys: [id], scd: 2}\n  customers: {keys: [id, status]}\n")
    cfg = load_pipeline(cfg.file)
    land(cfg.landing_path, "c.json", event(5))
    assert run_cli(spark, cfg.file, run_id="r3").returncode == 2
    run_pipeline(cfg, spark=spark, run_id="refresh", tables=["orders", "customers"], full_refresh=True)
    r = run_cli(spark, cfg.file, run_id="r4")
    assert r.returncode == 0, r.stdout + r.stderr
    from deltalake import DeltaTable

    assert "_valid_to" in DeltaTable(str(orders)).schema().to_arrow().names  # SCD2 now
    assert rows(orders) == {i: f"s{i}" for i in range(1, 6)}
    assert rows(customers) == {9: "s9", 10: "s10"}


def test_a_renamed_table_or_one_listed_after_its_events_were_quarantined_stops(spark, tmp_path):
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", event(1), event(9, "customers"), event(20, "items"))
    run_pipeline(cfg, spark=spark, run_id="r1")   # items: not listed -> quarantined
    _yaml(cfg.file, "  orders: {keys: [id]}\n  clients: {keys: [id], source_table: customers}\n"
                    "  items: {keys: [id]}\n")
    cfg = load_pipeline(cfg.file)
    land(cfg.landing_path, "b.json", event(10, "customers"), event(21, "items"))
    r = run_cli(spark, cfg.file)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr
    assert ("tables.clients reads source shop.customers, which this checkpoint's runs wrote to "
            "table 'customers'") in err, err
    assert ("tables.items is newly listed, but 1 earlier event(s) of its source shop.items are "
            "in the quarantine") in err, err
    assert "--full-refresh --tables clients,items" in err, err
    assert not cfg.tables["clients"].path.exists() and not cfg.tables["items"].path.exists()

    run_pipeline(cfg, spark=spark, run_id="refresh", tables=["clients", "items"], full_refresh=True)
    r = run_cli(spark, cfg.file, run_id="r2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert rows(cfg.tables["clients"].path) == {9: "s9", 10: "s10"}
    assert rows(cfg.tables["items"].path) == {20: "s20", 21: "s21"}
    # a table listed for a source nobody read before is simply new
    _yaml(cfg.file, "  orders: {keys: [id]}\n  clients: {keys: [id], source_table: customers}\n"
                    "  items: {keys: [id]}\n  refunds: {keys: [id]}\n")
    land(cfg.landing_path, "c.json", event(30, "refunds"))
    r = run_cli(spark, cfg.file, run_id="r3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert rows(load_pipeline(cfg.file).tables["refunds"].path) == {30: "s30"}
