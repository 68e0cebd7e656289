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


def test_a_types_pin_changed_on_a_running_pipeline_widens_losslessly_or_stops(spark, tmp_path):
    """Tester, 2026-11-29: a pin changed from ``decimal(10,2)`` to ``decimal(12,4)`` stored
    ``5.1234`` as ``5.12`` and ``bigint`` -> ``double`` stored ``2.5`` as ``2`` (exit 0: values
    were checked against the pin and cast to the stored column); ``bigint`` -> ``string`` failed
    every run with a cast error. Now a pin that is a lossless widening of the stored column
    widens it; any other stops before anything is written, naming the pin and the stored type."""
    from decimal import Decimal

    from deltalake import DeltaTable

    cfg = pipeline(tmp_path)
    _yaml(cfg.file, "  orders: {keys: [id], types: {amt: 'decimal(10,2)'}}\n"
                    "  customers: {keys: [id], types: {code: bigint}}\n")
    land(cfg.landing_path, "a.json", event(1, amt=1.25), event(9, "customers", code=7))
    assert run_cli(spark, cfg.file, run_id="r1").returncode == 0
    orders, customers = (load_pipeline(cfg.file).tables[n].path for n in ("orders", "customers"))

    # (Spark's other type names are the same pins: ``long`` was refused, tester)
    _yaml(cfg.file, "  orders: {keys: [id], types: {amt: 'numeric(12, 4)'}}\n"
                    "  customers: {keys: [id], types: {code: Long}}\n")
    land(cfg.landing_path, "b.json", event(2, amt=5.1234))
    r = run_cli(spark, cfg.file, run_id="r2")
    assert r.returncode == 0, r.stdout + r.stderr
    got = {x["id"]: x["amt"] for x in DeltaTable(str(orders)).to_pyarrow_table().to_pylist()}
    assert got == {1: Decimal("1.25"), 2: Decimal("5.1234")}, got
    assert str(DeltaTable(str(orders)).to_pyarrow_table().schema.field("amt").type) == \
        "decimal128(12, 4)"

    _yaml(cfg.file, "  orders: {keys: [id], types: {amt: double}}\n"
                    "  customers: {keys: [id], types: {code: string}}\n")
    land(cfg.landing_path, "c.json", event(3, amt=2.5), event(10, "customers", code="abc"))
    before = (_version(orders), _version(customers))
    r = run_cli(spark, cfg.file, run_id="r3")
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("tables.orders.types.amt: 'double', but the table stores the column as "
            "'decimal(12,4)'") in r.stderr, r.stderr
    assert "tables.customers.types.code: 'string', but the table stores the column as 'long'" \
        in r.stderr, r.stderr
    assert "--full-refresh --tables customers,orders" in r.stderr, r.stderr
    assert (_version(orders), _version(customers)) == before, "nothing may be written"

    run_pipeline(load_pipeline(cfg.file), spark=spark, run_id="refresh",
                 tables=["orders", "customers"], full_refresh=True)
    assert run_cli(spark, cfg.file, run_id="r4").returncode == 0
    got = {x["id"]: x["amt"] for x in DeltaTable(str(orders)).to_pyarrow_table().to_pylist()}
    assert got == {1: 1.25, 2: 5.1234, 3: 2.5}, got
    got = {x["id"]: x["code"] for x in DeltaTable(str(customers)).to_pyarrow_table().to_pylist()}
    assert got == {9: "7", 10: "abc"}, got


def test_column_selection_ignore_tables_or_format_changed_on_a_running_pipeline_stop(spark, tmp_path):
    """Tester, 2026-11-29, each exit 0 before: a column no longer excluded (or added to
    ``columns``) was NULL in every row stored so far; a column of the table excluded from then
    on was NULL in rows changed after, stale in the others; a table listed after its source was
    in ``ignore_tables`` held only the later changes; ``source.format`` switched from Maxwell to
    Debezium dropped every later update as older (binlog positions of two formats compare as
    text). Each now stops naming the setting; a selection change that leaves the table as it is
    (a column the table never held) goes on."""
    cfg = pipeline(tmp_path, extra="ignore_tables: [shop.z]\n")
    _yaml(cfg.file, "  orders: {keys: [id], exclude_columns: [secret]}\n"
                    "  customers: {keys: [id], columns: [id, status]}\n"
                    "ignore_tables: [shop.z]\n")
    land(cfg.landing_path, "a.json", event(1, secret="x1"), event(9, "customers", note="n9"),
         event(40, "z"))
    assert run_cli(spark, cfg.file, run_id="r1").returncode == 0
    cfg = load_pipeline(cfg.file)
    orders, customers = cfg.tables["orders"].path, cfg.tables["customers"].path

    # a column the table never held, excluded from now on: nothing to mix
    _yaml(cfg.file, "  orders: {keys: [id], exclude_columns: [secret, extra]}\n"
                    "  customers: {keys: [id], columns: [id, status]}\n"
                    "ignore_tables: [shop.z]\n")
    land(cfg.landing_path, "b.json", event(2, secret="x2"))
    r = run_cli(spark, cfg.file, run_id="r2")
    assert r.returncode == 0, r.stdout + r.stderr

    _yaml(cfg.file, "  orders: {keys: [id]}\n"
                    "  customers: {keys: [id], columns: [id, note]}\n"
                    "  z: {keys: [id]}\n")
    land(cfg.landing_path, "c.json", event(3, secret="x3"), event(41, "z"))
    before = (_version(orders), _version(customers))
    r = run_cli(spark, cfg.file, run_id="r3")
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr
    # (``extra`` too: whether earlier events carried it, the record cannot tell)
    assert "column(s) ['extra', 'secret'] are kept from now on, but the runs so far dropped them" \
        in err, err
    assert "column(s) ['note'] are kept from now on" in err, err
    assert "column(s) ['status'] of the table are dropped from now on" in err, err
    assert ("tables.z is newly listed, but the runs so far dropped the events of its source "
            "shop.z (ignore_tables: 'shop.z')") in err, err
    assert "--full-refresh --tables customers,orders,z" in err, err
    assert (_version(orders), _version(customers)) == before and not cfg.tables["orders"].path \
        .with_name("z").exists(), "nothing may be written"

    run_pipeline(load_pipeline(cfg.file), spark=spark, run_id="refresh",
                 tables=["orders", "customers", "z"], full_refresh=True)
    assert run_cli(spark, cfg.file, run_id="r4").returncode == 0
    from deltalake import DeltaTable

    got = {x["id"]: x["secret"] for x in DeltaTable(str(orders)).to_pyarrow_table().to_pylist()}
    assert got == {1: "x1", 2: "x2", 3: "x3"}, got
    assert rows(load_pipeline(cfg.file).tables["z"].path) == {40: "s40", 41: "s41"}

    text = cfg.file.read_text(encoding="utf-8")
    cfg.file.write_text(text.replace("format: maxwell", "format: debezium"), encoding="utf-8")
    r = run_cli(spark, cfg.file, run_id="r5")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "source.format" in r.stderr and "'maxwell' -> 'debezium'" in r.stderr, r.stderr


def test_a_narrowing_pin_rebuilt_quarantines_what_it_cannot_hold(spark, tmp_path):
    """Tester, 2026-11-29: after a pin was narrowed back (``decimal(12,4)`` -> ``decimal(10,2)``)
    the full refresh the stop names dropped the row whose value no longer fits (the other went
    back to an older image), exit 0, and said the left-out lines were "in the quarantine table
    from the runs that first read them" although those runs had stored them. The rebuild now adds
    such lines to the quarantine (by their natural key: lines already there add nothing)."""
    from deltalake import DeltaTable

    cfg = pipeline(tmp_path)
    _yaml(cfg.file, "  orders: {keys: [id], types: {amt: 'decimal(12,4)'}}\n  customers: {keys: [id]}\n")
    land(cfg.landing_path, "a.json", event(1, amt=1.25), event(2, amt=5.1234), event(3, amt="x"))
    assert run_cli(spark, cfg.file, run_id="r1").returncode == 0  # id 3 quarantined
    _yaml(cfg.file, "  orders: {keys: [id], types: {amt: 'decimal(10,2)'}}\n  customers: {keys: [id]}\n")
    r = run_cli(spark, cfg.file, run_id="r2")
    assert r.returncode == 2 and "quarantines the stored values it cannot hold" in r.stderr, r.stderr
    r = run_cli(spark, cfg.file, "--full-refresh", "--tables", "orders", run_id="refresh")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LEFT OUT 2 of 3 events (in the quarantine table; 1 of them added by this refresh" \
        in r.stdout, r.stdout
    q = DeltaTable(str(load_pipeline(cfg.file).quarantine_path)).to_pyarrow_table().to_pylist()
    assert sorted('"id": 2' in x["raw_line"] or '"id": 3' in x["raw_line"] for x in q) == [True, True]
    assert len(q) == 2, q
    orders = load_pipeline(cfg.file).tables["orders"].path
    got = {x["id"]: x["amt"] for x in DeltaTable(str(orders)).to_pyarrow_table().to_pylist()}
    assert list(got) == [1], got
    r = run_cli(spark, cfg.file, "--full-refresh", "--tables", "orders", run_id="refresh2")
    assert r.returncode == 0 and "added by this refresh" not in r.stdout, r.stdout
    assert DeltaTable(str(load_pipeline(cfg.file).quarantine_path)).to_pyarrow_table().num_rows == 2


def test_a_table_taken_out_of_the_yaml_and_listed_again_stops(spark, tmp_path):
    """Tester, 2026-11-29: a table removed from ``tables:`` had its events quarantined as an
    unknown table; listed again (same keys) it resumed without them, exit 0."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", event(1), event(9, "customers"))
    assert run_cli(spark, cfg.file, run_id="r1").returncode == 0
    _yaml(cfg.file, "  orders: {keys: [id]}\n")
    land(cfg.landing_path, "b.json", event(2), event(10, "customers"))
    assert run_cli(spark, cfg.file, run_id="r2").returncode == 0  # customers: quarantined
    _yaml(cfg.file, "  orders: {keys: [id]}\n  customers: {keys: [id]}\n")
    land(cfg.landing_path, "c.json", event(11, "customers"))
    r = run_cli(spark, cfg.file, run_id="r3")
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("tables.customers is listed again after it left the YAML, but 1 earlier event(s) of "
            "its source shop.customers are in the quarantine as an unknown table") in r.stderr, r.stderr
    assert "--full-refresh --tables customers" in r.stderr, r.stderr
    run_pipeline(load_pipeline(cfg.file), spark=spark, run_id="refresh", tables=["customers"],
                 full_refresh=True)
    assert run_cli(spark, cfg.file, run_id="r4").returncode == 0
    assert rows(load_pipeline(cfg.file).tables["customers"].path) == {9: "s9", 10: "s10", 11: "s11"}
