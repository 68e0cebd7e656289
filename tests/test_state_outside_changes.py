"""Stored state changed from outside between runs (testers, 2026-11-27): a table that lost a
commit of the pipeline's or holds another writer's row change, a landed file replaced by an
older copy, a moved landing folder, a full refresh over a landing folder that lost ingested
files, a data file deleted from a table. Each stops with exit 3 naming what and how to recover
(``docs/run-safety.md``). Split from ``test_job_state.py`` so the two xdist workers share them."""

from __future__ import annotations

from pathlib import Path

import pytest
from job_helpers import event, land, pipeline, rows, run_cli

from cdc_lake.cdc.job import run_pipeline




def test_a_landed_file_replaced_by_a_copy_with_an_older_time_stops_the_run(spark, tmp_path):
    """Tester: a corrected copy of a file already read, put in place with `cp -p` (an older
    modification time kept): the run took the no-op path, exit 0, the table kept the old values."""
    import os

    from cdc_lake.cdc.backlog import LandedFileChanged

    cfg = pipeline(tmp_path)
    a = land(cfg.landing_path, "a.json", event(1), event(2))
    run_pipeline(cfg, spark=spark, run_id="r1")
    fixed = tmp_path / "fixed.json"
    fixed.write_text(event(1, status="fixed") + "\n" + event(2) + "\n", encoding="utf-8")
    os.utime(fixed, (1_600_000_000, 1_600_000_000))  # 2020: cp -p keeps the copy's own time
    os.replace(fixed, a)
    with pytest.raises(LandedFileChanged) as e:
        run_pipeline(cfg, spark=spark, run_id="r2")
    assert str(a) in str(e.value) and "2020-09-13" in str(e.value), str(e.value)
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2"}


def test_a_table_changed_behind_the_pipeline_stops_the_run_and_maintenance_leaves_it_alone(spark, tmp_path):
    """Tester: the newest commit of a table removed, then a maintenance run: its OPTIMIZE/VACUUM
    commits took the lost commit's version number, the version check saw nothing, and the next
    runs went on without the lost changes (12 rows missing, exit 0); a RESTORE or DELETE by hand
    likewise (keys missing, deleted keys back, exit 0). Now maintenance leaves such a table alone
    (exit 3, the other tables maintained) and the run stops naming the table and commit; the
    full refresh it prints restores the truth; maintenance of an intact table changes nothing
    the next run checks."""
    from deltalake import DeltaTable

    from cdc_lake.cdc.state import TableChangedBehind
    from cdc_lake.maintenance import MaintenanceSettings, run_maintenance

    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", *(event(i) for i in range(1, 6)), event(9, "customers"))
    run_pipeline(cfg, spark=spark, run_id="r1")
    land(cfg.landing_path, "b.json", event(12, typ="update", id=2, status="s2b"), event(6))
    run_pipeline(cfg, spark=spark, run_id="r2")
    truth = {1: "s1", 2: "s2b", 3: "s3", 4: "s4", 5: "s5", 6: "s6"}
    orders = cfg.tables["orders"].path
    assert rows(orders) == truth
    settings = MaintenanceSettings(vacuum_retention_hours=0)

    # intact: maintenance compacts and vacuums, the next run passes its checks
    report = run_maintenance(cfg, settings=settings, pipelines=[cfg])
    assert report["failed"] == [] and report["tables"]["orders"]["status"] == "ok", report
    land(cfg.landing_path, "c.json", event(7))
    assert run_pipeline(cfg, spark=spark, run_id="r3")["status"] == "succeeded"
    truth[7] = "s7"
    assert rows(orders) == truth

    # the newest commit lost: maintenance does not touch the table
    v = DeltaTable(str(orders)).version()
    (orders / "_delta_log" / f"{v:020d}.json").unlink()
    report = run_maintenance(cfg, settings=settings, pipelines=[cfg])
    t = report["tables"]["orders"]
    assert t["status"] == "changed_behind" and "orders" in report["failed"], report
    assert "--full-refresh --tables orders" in t["recovery"], t
    assert report["tables"]["customers"]["status"] == "ok"
    assert DeltaTable(str(orders)).version() == v - 1
    # another commit that changes no rows takes the version number (as maintenance's did)
    DeltaTable(str(orders)).alter.set_table_properties({"delta.logRetentionDuration": "interval 30 days"})
    assert DeltaTable(str(orders)).version() == v
    with pytest.raises(TableChangedBehind) as e:
        run_pipeline(cfg, spark=spark, run_id="r4")
    assert "'orders'" in str(e.value) and f"version {v}" in str(e.value), str(e.value)
    assert "--full-refresh --tables orders" in str(e.value)
    run_pipeline(cfg, spark=spark, run_id="refresh", tables=["orders"], full_refresh=True)
    assert rows(orders) == truth

    # a DELETE by hand
    DeltaTable(str(orders)).delete("id < 3")
    r = run_cli(spark, cfg.file)
    assert r.returncode == 3 and "NEEDS RECOVERY" in r.stderr and "changed rows" in r.stderr, r.stderr[-2000:]
    # (tester) the end of a run recording the tables, as if the DELETE had come during it, and a
    # full refresh of another table, do not take the change as the new normal
    from cdc_lake.cdc.state import check_state
    from cdc_lake.cdc.table_records import record_versions

    record_versions(cfg)
    run_pipeline(cfg, spark=spark, run_id="refresh_other", tables=["customers"], full_refresh=True)
    with pytest.raises(TableChangedBehind):
        check_state(cfg)
    run_pipeline(cfg, spark=spark, run_id="refresh2", tables=["orders"], full_refresh=True)
    land(cfg.landing_path, "d.json", event(8))
    assert run_pipeline(cfg, spark=spark, run_id="r5")["status"] == "succeeded"
    truth[8] = "s8"
    assert rows(orders) == truth


def test_a_moved_landing_folder_stops_the_run_naming_both_folders(spark, tmp_path):
    """Tester: the landing folder renamed and source.path changed to match: every run failed
    (exit 1) with Spark's "Wrong basePath" after a page of plan. Now exit 3 before Spark, naming
    the folders and both recoveries; the move-aside recovery converges."""
    from cdc_lake.cdc.backlog import LandingMoved
    from cdc_lake.config import load_pipeline

    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", event(1), event(2))
    run_pipeline(cfg, spark=spark, run_id="r1")
    moved = tmp_path / "landing_new"
    cfg.landing_path.rename(moved)
    cfg.file.write_text(cfg.file.read_text().replace("path: landing", "path: landing_new"))
    cfg = load_pipeline(cfg.file)
    assert cfg.landing_path == moved
    land(moved, "b.json", event(3))
    with pytest.raises(LandingMoved) as e:
        run_pipeline(cfg, spark=spark, run_id="r2")
    msg = str(e.value)
    assert str(tmp_path / "landing") in msg and str(moved) in msg and ".moved" in msg, msg
    cp = cfg.checkpoint_path
    cp.rename(cp.with_name(cp.name + ".moved"))
    assert run_pipeline(cfg, spark=spark, run_id="r3")["status"] == "succeeded"
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2", 3: "s3"}


def test_a_full_refresh_with_ingested_landing_files_gone_stops_before_rebuilding(spark, tmp_path):
    """Tester: ingested files archived out of the landing folder (fine for incremental runs),
    then the full refresh recovery messages recommend: 6 of 31 rows missing, exit 0. Now the
    refresh stops before rebuilding, naming the files; with them back it rebuilds the truth."""
    from cdc_lake.cdc.backlog import LandingHistoryIncomplete

    cfg = pipeline(tmp_path)
    a = land(cfg.landing_path, "a.json", event(1), event(2))
    land(cfg.landing_path, "b.json", event(3))
    run_pipeline(cfg, spark=spark, run_id="r1")
    archive = tmp_path / "archive"
    archive.mkdir()
    a.rename(archive / a.name)
    land(cfg.landing_path, "c.json", event(4))
    assert run_pipeline(cfg, spark=spark, run_id="r2")["status"] == "succeeded"  # incremental: fine
    before = rows(cfg.tables["orders"].path)
    with pytest.raises(LandingHistoryIncomplete) as e:
        run_pipeline(cfg, spark=spark, run_id="refresh", tables=["orders"], full_refresh=True)
    assert str(a) in str(e.value) and "put those files back" in str(e.value), str(e.value)
    assert rows(cfg.tables["orders"].path) == before
    # compressed in place: still there for the refresh (Spark reads .gz); no glob is set here
    import gzip

    with open(archive / a.name, "rb") as src, gzip.open(f"{a}.gz", "wb") as dst:
        dst.write(src.read())
    from cdc_lake.cdc.backlog import check_history_complete

    check_history_complete(cfg)
    Path(f"{a}.gz").unlink()
    (archive / a.name).rename(a)  # mv keeps the time: the next incremental run is fine
    run_pipeline(cfg, spark=spark, run_id="refresh2", tables=["orders"], full_refresh=True)
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2", 3: "s3", 4: "s4"}
    assert run_pipeline(cfg, spark=spark, run_id="r3")["status"] == "succeeded"


def test_a_deleted_data_file_ends_the_run_with_exit_3_naming_it(spark, tmp_path):
    """Tester: a table's data file deleted by hand: the next run with new data failed with
    exit 1 (Airflow retried it for nothing) and delta-rs's 'not found' on line ~550 of the
    output. Now the failure is recognised: exit 3, the file, the table and the recovery last."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", event(1), event(2))
    run_pipeline(cfg, spark=spark, run_id="r1")
    [victim] = list(cfg.tables["orders"].path.glob("*.parquet"))
    victim.unlink()
    land(cfg.landing_path, "b.json", event(3), event(12, typ="update", id=1, status="x"))
    r = run_cli(spark, cfg.file)
    assert r.returncode == 3, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("[cdc] NEEDS RECOVERY") and str(victim) in last, last
    assert "--full-refresh --tables orders" in last, last


def test_a_table_another_pipeline_or_a_hand_wrote_is_never_merged_into(spark, tmp_path):
    """Tester: two YAMLs sharing one storage.root with a table name in common, run by hand:
    the second pipeline's first run merged its rows into the first's table with exit 0 (the
    first's next run stopped only afterwards). Now every run checks the owner marks of the
    tables it would write (``cdc_lake.cdc.owners``): the second pipeline stops with exit 3 and
    writes nothing, its full refresh replaces nothing, its maintenance leaves the tables alone,
    and the owner goes on. The owner's own
    mark under a new checkpoint instance (the reset) passes, also when only a full refresh wrote
    the table; an unmarked table holding rows is refused, an empty one is taken."""
    import shutil

    import pyarrow as pa
    from deltalake import write_deltalake

    from cdc_lake.cdc.owners import TableOwnedElsewhere

    lake = tmp_path / "lake"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    owner = pipeline(tmp_path / "a", name="shop", root=str(lake))
    other = pipeline(tmp_path / "b", name="shop_eu", root=str(lake))
    orders = owner.tables["orders"].path
    assert other.tables["orders"].path == orders and other.checkpoint_path != owner.checkpoint_path
    land(owner.landing_path, "a.json", event(1), event(2), event(5, "customers"))
    # the owner's first run is a full refresh: its replacing commit carries the owner mark too
    run_pipeline(owner, spark=spark, run_id="refresh", full_refresh=True)
    truth = {1: "s1", 2: "s2"}
    assert rows(orders) == truth

    land(other.landing_path, "x.json", event(12, typ="update", id=1, status="eu"), event(3))
    version = __import__("deltalake").DeltaTable(str(orders)).version()
    r = run_cli(spark, other.file, run_id="eu1")
    assert r.returncode == 3, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "NEEDS RECOVERY" in last and "pipeline 'shop' (kind: cdc)" in last, last
    assert "tables.orders.path" in last and "tables.customers.path" in last, last
    with pytest.raises(TableOwnedElsewhere):
        run_pipeline(other, spark=spark, run_id="eu2", tables=["orders"], full_refresh=True)
    # nor does its maintenance compact or VACUUM the owner's tables (the shared quarantine: yes)
    from cdc_lake.maintenance import MaintenanceSettings, run_maintenance

    report = run_maintenance(other, settings=MaintenanceSettings(vacuum_retention_hours=0),
                             pipelines=[other])
    t = report["tables"]
    assert t["orders"]["status"] == t["customers"]["status"] == "owned_elsewhere", t
    assert "pipeline 'shop' (kind: cdc)" in t["orders"]["error"] and "orders" in report["failed"], t
    assert t["_quarantine"]["status"] in ("ok", "absent"), t
    assert rows(orders) == truth
    assert __import__("deltalake").DeltaTable(str(orders)).version() == version

    # the owner goes on; then its checkpoint is reset (moved aside): its own tables are taken
    land(owner.landing_path, "b.json", event(4))
    assert run_pipeline(owner, spark=spark, run_id="r1")["status"] == "succeeded"
    cp = owner.checkpoint_path
    shutil.move(cp, cp.with_name(cp.name + ".aside"))
    land(owner.landing_path, "c.json", event(16, typ="update", id=2, status="s2c"))
    assert run_pipeline(owner, spark=spark, run_id="r2")["status"] == "succeeded"
    assert rows(orders) == {1: "s1", 2: "s2c", 4: "s4"}
    # a table both have written (as the old code let happen): named mixed, moved aside to rebuild
    from deltalake import CommitProperties, Transaction

    from cdc_lake.cdc.owners import check_owners

    write_deltalake(str(owner.tables["customers"].path), pa.table({"id": [6]}), mode="append",
                    schema_mode="merge", commit_properties=CommitProperties(
                        app_transactions=[Transaction("cdc-shop_eu-0f", 0)]))
    with pytest.raises(TableOwnedElsewhere) as e:
        check_owners(other)
    msg = str(e.value)
    assert "also written by this pipeline 'shop_eu'" in msg and ".mixed-" in msg, msg
    assert f"mv {owner.tables['customers'].path} " in msg and f"mv {orders} " not in msg, msg

    # tables made by hand at a third pipeline's paths: refused with rows, or empty with columns
    # this job never writes (the MERGE failed deep in delta-rs, exit 1); taken when empty with
    # the key and _cdc_seq (what a run stopped between creating the table and its write leaves)
    third = pipeline(tmp_path / "b", name="hand", root=str(tmp_path / "lake3"), yaml_name="h.yaml")
    customers3, orders3 = third.tables["customers"].path, third.tables["orders"].path
    write_deltalake(str(customers3), pa.table({"id": [7], "status": ["h"]}))
    write_deltalake(str(orders3), pa.table({"id": pa.array([], pa.int64()),
                                            "status": pa.array([], pa.string())}))
    with pytest.raises(TableOwnedElsewhere) as e:
        run_pipeline(third, spark=spark, run_id="h1")
    msg = str(e.value)
    assert "'customers' at" in msg and "yet it holds rows" in msg, msg
    assert "'orders' at" in msg and "lacks the column(s) ['_cdc_seq']" in msg, msg
    shutil.rmtree(customers3)
    shutil.rmtree(orders3)
    write_deltalake(str(orders3), pa.table({"id": pa.array([], pa.int64()),
                                            "_cdc_seq": pa.array([], pa.string())}))
    assert run_pipeline(third, spark=spark, run_id="h2")["status"] == "succeeded"
    assert rows(orders3) == {1: "eu", 3: "s3"}  # b/x.json: an update of an unseen key upserts
