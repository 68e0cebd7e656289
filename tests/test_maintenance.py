"""Table maintenance (issue 9, "flat cost"): compaction, checkpoint + log cleanup, VACUUM with a
retention that respects lagging change-feed readers; never changes what a table holds.

Truth: the reference model (tests/reference_model.py) replaying the landing files, before and
after maintenance, and after a later incremental run on the maintained tables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]

import pytest

from cdc_lake.config import ConfigError
from deltalake import DeltaTable
from reference_model import ReferenceModel, RefConfig, assert_no_diff, diff_table, read_delta_rows

from cdc_lake.checkpoint import PipelineLocked, lock_for
from cdc_lake.cdc.job import run_pipeline
from cdc_lake.config import load_pipeline
from cdc_lake.demo.generator import generate
from cdc_lake.demo.pipeline_yaml import write_pipeline_yaml
from cdc_lake.maintenance import MaintenanceSettings, maintain_table, run_maintenance
from cdc_lake.retention import committed_source_versions

DAG_YAML = """\
pipeline: cap_dag
source: {{format: maxwell, path: {root}/landing, database: shop}}
storage: {{root: {root}/lake}}
tables:
  orders: {{keys: [id]}}
"""
TABLES = ("products", "orders")


def _assert_matches_reference(yaml: Path, landing: Path, cfg) -> None:  # type: ignore[no-untyped-def]
    model = ReferenceModel(RefConfig.from_yaml(yaml))
    for f in sorted(landing.glob("*.json")):
        model.add_file(f)
    for name in TABLES:
        assert_no_diff(diff_table(model.scd1(name), read_delta_rows(cfg.tables[name].path), ("id",),
                                  table=name))


def test_maintenance_compacts_and_vacuums_without_changing_any_table(spark, tmp_path):
    landing = tmp_path / "landing"
    generate(landing, "maxwell", days=1, seed=5, lines_per_file=40)
    yaml = write_pipeline_yaml(tmp_path / "p.yaml", "maxwell", name="maint", landing=landing,
                               lake_root=tmp_path / "lake", tables=list(TABLES), max_files_per_trigger=2)
    cfg = load_pipeline(yaml)
    run_pipeline(cfg, spark=spark, run_id="r1")  # several micro-batches -> several small files
    orders = str(cfg.tables["orders"].path)
    before_rows = sorted(map(str, DeltaTable(orders).to_pyarrow_table().to_pylist()))
    on_disk = len(list(Path(orders).glob("*.parquet")))
    live = len(DeltaTable(orders).file_uris())
    assert on_disk > live, "the setup must leave files that MERGEs rewrote (VACUUM candidates)"

    report = run_maintenance(cfg, settings=MaintenanceSettings(vacuum_retention_hours=0), pipelines=[])

    t = report["tables"]["orders"]
    assert t["files_before"] == live and t["files_after"] <= live, t
    assert t["vacuum"]["files_removed"] >= on_disk - live, t
    assert len(list(Path(orders).glob("*.parquet"))) == t["files_after"]
    assert sorted(map(str, DeltaTable(orders).to_pyarrow_table().to_pylist())) == before_rows
    assert (Path(orders) / "_delta_log" / f"{t['checkpoint_version']:020d}.checkpoint.parquet").is_file()
    assert report["files_vacuumed"] >= on_disk - live
    assert report["tables"]["_quarantine"]["status"] in ("ok", "absent")
    _assert_matches_reference(yaml, landing, cfg)

    # the pipeline goes on on the maintained tables (its txn ids survive compaction)
    generate(landing, "maxwell", days=1, seed=5, start_day=1, lines_per_file=40)
    s = run_pipeline(cfg, spark=spark, run_id="r2")
    assert s["status"] == "succeeded" and s["batches"] >= 1
    _assert_matches_reference(yaml, landing, cfg)


def test_dry_run_changes_nothing_and_a_held_lock_stops_maintenance(spark, tmp_path):
    landing = tmp_path / "landing"
    generate(landing, "maxwell", days=1, seed=6, lines_per_file=60)
    yaml = write_pipeline_yaml(tmp_path / "p.yaml", "maxwell", name="maint_dry", landing=landing,
                               lake_root=tmp_path / "lake", tables=list(TABLES), max_files_per_trigger=2)
    cfg = load_pipeline(yaml)
    run_pipeline(cfg, spark=spark, run_id="r1")
    orders = cfg.tables["orders"].path
    version = DeltaTable(str(orders)).version()
    report = run_maintenance(cfg, settings=MaintenanceSettings(vacuum_retention_hours=0), dry_run=True,
                             pipelines=[])
    assert DeltaTable(str(orders)).version() == version
    assert report["tables"]["orders"]["files_after"] == report["tables"]["orders"]["files_before"]
    # the totals say what a real run would remove (they said 0; tester H), and nothing removed
    would = sum(t["vacuum"]["would_remove"] for t in report["tables"].values() if "vacuum" in t)
    assert report["files_vacuumed"] == 0 and report["files_would_vacuum"] == would > 0, report

    holder = lock_for(cfg.checkpoint_path)
    holder.acquire("an_ingest_run")
    try:
        with pytest.raises(PipelineLocked, match="an_ingest_run"):
            run_maintenance(cfg, pipelines=[])
        r = subprocess.run([sys.executable, "-m", "cdc_lake.maintenance", "--pipeline", str(yaml)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 75, r.stderr
    finally:
        holder.release()
    real = run_maintenance(cfg, settings=MaintenanceSettings(vacuum_retention_hours=0, compact=False),
                           pipelines=[])
    assert real["files_vacuumed"] == would and "files_would_vacuum" not in real, real
    r = subprocess.run([sys.executable, "-m", "cdc_lake.maintenance", "--pipeline", str(yaml), "--dry-run"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.split("CDC_MAINTENANCE_SUMMARY ", 1)[1])
    assert summary["dry_run"] is True and "orders" in summary["tables"]

    # the Airflow task runs the same CLI and returns its report (XCom)
    from cdc_lake.airflow.maintenance import CdcMaintenanceOperator

    op = CdcMaintenanceOperator(task_id="maintain", pipeline=cfg, dry_run=True)
    report = op.execute({})  # type: ignore[arg-type]
    assert report and report["pipeline"] == "maint_dry" and report["dry_run"] is True


def test_compaction_bin_packs_small_files_and_keeps_rows(tmp_path):
    from deltalake import write_deltalake
    import pyarrow as pa

    table = tmp_path / "appended"
    for i in range(6):
        write_deltalake(str(table), pa.table({"id": [i, i + 100], "v": [str(i), None]}), mode="append")
    rows = sorted(map(str, DeltaTable(str(table)).to_pyarrow_table().to_pylist()))
    report = maintain_table(table, MaintenanceSettings(vacuum_retention_hours=0))
    assert (report["files_before"], report["files_after"]) == (6, 1), report
    assert report["compacted"] == {"files_removed": 6, "files_added": 1}
    assert report["vacuum"]["files_removed"] == 6
    assert sorted(map(str, DeltaTable(str(table)).to_pyarrow_table().to_pylist())) == rows


def test_delta_spark_change_feed_offsets_count_as_read_versions(tmp_path):
    """delta-spark's change-feed source (Delta's own) records ``reservoirVersion``/``index``,
    not ``{"version": n}``: read as "nothing read" (-1), every delta-spark enrichment held the
    VACUUM of its upstream back to the table's first version for good (reviewer I). Version
    ``v`` of such an offset may be read in part, so ``v - 1`` is the last version read."""
    ckpt = tmp_path / "delta_spark_reader"
    (ckpt / "commits").mkdir(parents=True)
    (ckpt / "offsets").mkdir()
    (ckpt / "commits" / "0").write_text("v1\n{}\n")
    (ckpt / "commits" / "1").write_text("v1\n{}\n")
    delta_offset = ('{"sourceVersion":1,"reservoirId":"5a0d5c16-1b7e-4f1f-9a3e-2d7f0c8b9a11",'
                    '"reservoirVersion":%d,"index":%d,"isStartingVersion":false}')
    (ckpt / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n' + delta_offset % (3, 2) + "\n")
    (ckpt / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n' + delta_offset % (7, -1)
                                        + '\n{"version": 5}\n{"logOffset":4}\n')
    assert committed_source_versions(ckpt) == [6, 5]
    (ckpt / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n' + delta_offset % (0, -1) + "\n")
    assert committed_source_versions(ckpt) == [-1]


def test_vacuum_retention_is_held_back_by_a_lagging_change_feed_reader(tmp_path):
    """A reader whose checkpoint says it has read version 0 still needs versions 1.. (their
    files and change data): VACUUM keeps everything newer than version 1's commit."""
    from deltalake import write_deltalake
    import pyarrow as pa

    table = tmp_path / "t"
    for i in range(4):  # 4 versions, each replacing the previous file
        write_deltalake(str(table), pa.table({"id": [i]}), mode="overwrite")
    ckpt = tmp_path / "reader_ckpt"
    (ckpt / "commits").mkdir(parents=True)
    (ckpt / "offsets").mkdir()
    (ckpt / "commits" / "0").write_text("v1\n{}\n")
    (ckpt / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"version": 0}\n')
    assert committed_source_versions(ckpt) == [0]
    from cdc_lake.retention import _commit_time  # read from the commit file, not the history

    dt = DeltaTable(str(table))
    assert {e["version"]: e["timestamp"] for e in dt.history()} == {
        v: int(_commit_time(dt, v).timestamp() * 1000 + 0.5) for v in range(4)}
    reader = SimpleNamespace(name="enrich_x", checkpoint_path=ckpt, change_feed_sources=[str(table)])
    from cdc_lake.retention import lagging_readers

    readers = lagging_readers(table, [reader])
    assert readers == [("enrich_x", 0)]
    report = maintain_table(table, MaintenanceSettings(vacuum_retention_hours=0, compact=False),
                            readers=readers)
    assert report["vacuum"]["held_back_by"] == "enrich_x" and report["vacuum"]["files_removed"] == 0
    assert len(list(table.glob("*.parquet"))) == 4
    # once the reader has caught up, the old files go
    (ckpt / "commits" / "1").write_text("v1\n{}\n")
    (ckpt / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"version": 3}\n')
    report = maintain_table(table, MaintenanceSettings(vacuum_retention_hours=0, compact=False),
                            readers=lagging_readers(table, [reader]))
    assert report["vacuum"]["held_back_by"] is None and report["vacuum"]["files_removed"] == 3
    assert len(list(table.glob("*.parquet"))) == 1


def test_maintenance_section_adds_a_maintenance_dag(tmp_path):
    from cdc_lake.airflow.dag_factory import build_dags

    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / "m.yaml").write_text(DAG_YAML.format(root=tmp_path)
                                   + "maintenance: {schedule: '@weekly', vacuum_retention_hours: 240}\n")
    dags = build_dags(folder)
    assert set(dags) == {"cap_dag", "cap_dag__maintenance"}
    m = dags["cap_dag__maintenance"]
    assert list(m.task_dict) == ["maintain"] and m.max_active_runs == 1
    assert "240 h" in (m.doc_md or "")


def test_bad_maintenance_section_names_the_key(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(DAG_YAML.format(root=tmp_path)
                 + "maintenance: {vacuum_retention_hourz: 1}\n")
    with pytest.raises(ConfigError) as e:
        load_pipeline(f)
    assert e.value.key.startswith("maintenance"), e.value


def test_the_shipped_enrich_pipeline_is_seen_as_a_change_feed_reader_of_its_fact_table(tmp_path, monkeypatch):
    """Maintenance of shop_maxwell must see shop_order_lines (a real enrich YAML, loaded the way
    run_maintenance loads its neighbours) as the reader of order_items' change feed."""
    from cdc_lake.config import load_all
    from cdc_lake.retention import lagging_readers

    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path))
    pipelines, errors = load_all(REPO / "pipelines")
    assert not errors, errors
    order_items = tmp_path / "lake" / "shop_maxwell" / "order_items"
    readers = lagging_readers(order_items, pipelines)
    assert [name for name, _ in readers] == ["shop_order_lines"]
    assert readers[0][1] == -1  # no checkpoint yet: it has read nothing, VACUUM keeps everything
    assert lagging_readers(tmp_path / "lake" / "shop_maxwell" / "customers", pipelines) == []


def _cdf_table(path: Path, versions: int) -> None:
    """A change-feed-enabled Delta table with versions 0..versions-1 (delta-rs, no Spark):
    appends, and at version 5 an UPDATE (which writes _change_data files)."""
    from deltalake import write_deltalake
    import pyarrow as pa

    for v in range(versions):
        if v == 5:
            DeltaTable(str(path)).update(updates={"v": "'updated'"}, predicate="id = 1")
            continue
        write_deltalake(str(path), pa.table({"id": [v], "v": [str(v)]}), mode="append",
                        configuration={"delta.enableChangeDataFeed": "true"} if v == 0 else None)


def _cdf_rows(table: Path, first: int, last: int) -> list[dict]:
    import pyarrow as pa

    return pa.table(DeltaTable(str(table)).load_cdf(starting_version=first, ending_version=last)
                    .read_all()).to_pylist()


def _reader_at(tmp_path: Path, table: Path, version: int) -> SimpleNamespace:
    """An enrichment pipeline reading ``table``'s change feed whose checkpoint has read ``version``."""
    ckpt = tmp_path / "reader_ckpt"
    (ckpt / "commits").mkdir(parents=True)
    (ckpt / "offsets").mkdir()
    (ckpt / "commits" / "0").write_text("v1\n{}\n")
    (ckpt / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"version": %d}\n' % version)
    return SimpleNamespace(name="enrich_lag", checkpoint_path=ckpt, change_feed_sources=[str(table)])


def _backdate_log(table: Path, days: float, versions: range | None = None) -> None:
    old = __import__("time").time() - days * 86400
    for f in (table / "_delta_log").iterdir():
        if versions is None or (f.name[:20].isdigit() and int(f.name[:20]) in versions):
            os.utime(f, (old, old))


def test_log_cleanup_keeps_the_commits_a_reader_paused_past_the_log_retention_still_needs(tmp_path):
    """Tester: a reader at version 4, versions 5..7 ingested, the log 40 days old (past the
    30-day log retention): checkpoint + cleanup_metadata() removed commits 0..6 and the reader
    then stopped with "the log entry of version 5 was removed" (exit 3) although the report said
    the reader held retention back. The cleanup is skipped for that table and the report says why."""
    from cdc_lake.retention import lagging_readers
    from cdc_lake.sources.delta_log import DeltaLog

    table = tmp_path / "orders"
    _cdf_table(table, 8)
    readers = lagging_readers(table, [_reader_at(tmp_path, table, 4)])
    assert readers == [("enrich_lag", 4)]
    _backdate_log(table, 40)

    report = maintain_table(table, MaintenanceSettings(vacuum_retention_hours=0), readers=readers)

    for v in range(4, 8):  # its last read version (continuity check) and everything after it
        assert (table / "_delta_log" / f"{v:020d}.json").is_file(), (v, report)
    # the reader's next batch: commits 5..7 and their change data (the UPDATE's _change_data
    # files survive VACUUM) are all there
    commits = DeltaLog(str(table)).check(5, 7, table_id=None, cdf_enabled_before=True)
    assert [c.version for c in commits] == [5, 6, 7]
    assert list((table / "_change_data").glob("*.parquet")), "the UPDATE's change files were vacuumed"
    changes = _cdf_rows(table, 5, 7)
    assert sorted((r["_change_type"], r["id"]) for r in changes) == [
        ("insert", 6), ("insert", 7), ("update_postimage", 1), ("update_preimage", 1)]
    # the report says the cleanup was skipped and why; the checkpoint was still written
    log = report["log_cleanup"]
    assert log["skipped"] is True and log["held_back_by"] == "enrich_lag", report
    assert log["keep_from_version"] == 4 and "enrich_lag" in log["reason"], log
    assert "log cleanup skipped" in log["reason"], log
    assert (table / "_delta_log" / f"{report['checkpoint_version']:020d}.checkpoint.parquet").is_file()
    assert report["vacuum"]["held_back_by"] == "enrich_lag"


def test_log_cleanup_still_removes_expired_commits_older_than_what_readers_need(tmp_path):
    """The hold is by version: expired commits below the lagging reader's last read version go
    (and the reader still reads its change feed); with no lagging reader every expired one goes."""
    from cdc_lake.retention import lagging_readers

    table = tmp_path / "orders"
    _cdf_table(table, 8)
    DeltaTable(str(table), version=3).create_checkpoint()  # an earlier maintenance run's
    _backdate_log(table, 40, range(0, 4))  # versions 0..3 expired, 4..7 recent
    readers = lagging_readers(table, [_reader_at(tmp_path, table, 4)])
    report = maintain_table(table, MaintenanceSettings(vacuum_retention_hours=0, compact=False),
                            readers=readers)
    assert report["log_cleanup"] == {"held_back_by": "enrich_lag", "skipped": False,
                                     "keep_from_version": 4}, report
    left = sorted(int(f.name[:20]) for f in (table / "_delta_log").glob("*.json"))
    assert left[0] == 3 and left[-1] == report["checkpoint_version"], left  # 0..2 went
    assert len(_cdf_rows(table, 5, 7)) == 4

    _backdate_log(table, 40)  # everything expired, the reader has caught up: no hold
    first_checkpoint = report["checkpoint_version"]
    report = maintain_table(table, MaintenanceSettings(vacuum_retention_hours=0, compact=False),
                            readers=[("caught_up", report["version_after"])])
    assert report["log_cleanup"] == {"held_back_by": None, "skipped": False}, report
    left = sorted(int(f.name[:20]) for f in (table / "_delta_log").glob("*.json"))
    # delta-rs keeps everything from the newest expired checkpoint on
    assert left[0] == first_checkpoint, left


def _two_appended_tables(tmp_path: Path, name: str):  # type: ignore[no-untyped-def]
    """A pipeline (maintenance retention 0) whose customers and orders tables hold 3 appended
    files each; returns (yaml, cfg)."""
    from deltalake import write_deltalake
    import pyarrow as pa

    yaml = tmp_path / "p.yaml"
    yaml.write_text(DAG_YAML.format(root=tmp_path).replace("cap_dag", name)
                    + "  customers: {keys: [id]}\nmaintenance: {vacuum_retention_hours: 0}\n")
    cfg = load_pipeline(yaml)
    for table in ("customers", "orders"):
        for i in range(3):
            write_deltalake(str(cfg.tables[table].path), pa.table({"id": [i]}), mode="append")
    return yaml, cfg


def test_a_table_whose_log_cannot_be_read_is_reported_and_the_others_are_maintained(tmp_path):
    """Tester: the newest _delta_log/*.json of one table cut to 100 bytes: maintenance crashed
    with a DeltaError traceback naming no table (exit 1), maintained no later table and printed
    no summary. Now: that table is reported with its path, the error and the ingest job's
    recovery; the others are maintained; the summary lists it; exit 3 (NEEDS RECOVERY)."""
    yaml, cfg = _two_appended_tables(tmp_path, "maint_damaged")
    customers = cfg.tables["customers"].path  # sorted before orders: the run goes on after it
    newest = customers / "_delta_log" / f"{2:020d}.json"
    newest.write_bytes(newest.read_bytes()[:100])

    report = run_maintenance(cfg, pipelines=[])
    t = report["tables"]["customers"]
    assert t["status"] == "damaged" and t["path"] == str(customers), t
    assert "DeltaError" in t["error"] and "Truncated" in t["error"], t
    assert f"mv {customers} {customers}.damaged" in t["recovery"], t
    assert "--full-refresh --tables customers" in t["recovery"], t
    assert report["failed"] == ["customers"]
    assert report["tables"]["orders"]["status"] == "ok"
    assert (report["tables"]["orders"]["files_before"], report["tables"]["orders"]["files_after"]) == (3, 1)

    r = subprocess.run([sys.executable, "-m", "cdc_lake.maintenance", "--pipeline", str(yaml)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "customers" in r.stderr and str(customers) in r.stderr and "NEEDS RECOVERY" in r.stderr
    assert "--full-refresh --tables customers" in r.stderr
    summary = json.loads(r.stdout.split("CDC_MAINTENANCE_SUMMARY ", 1)[1])
    assert summary["failed"] == ["customers"] and summary["tables"]["orders"]["status"] == "ok"

    # the quarantine / DDL log's recovery is the ingest's: move it aside, the next run makes a new one
    from cdc_lake.maintenance import damaged_recovery

    q = damaged_recovery(cfg, "_quarantine", cfg.quarantine_path)
    assert f"mv {cfg.quarantine_path} {cfg.quarantine_path}.damaged" in q and "creates a new one" in q
    assert "--tables orders" in damaged_recovery(cfg, "_tombstones/orders", cfg.tombstone_path("orders"))

    # the Airflow task fails without a retry (exit 3: an operator has to act)
    from airflow.sdk.exceptions import AirflowFailException
    from cdc_lake.airflow.maintenance import CdcMaintenanceOperator

    with pytest.raises(AirflowFailException, match="customers"):
        CdcMaintenanceOperator(task_id="maintain", pipeline=cfg).execute({})  # type: ignore[arg-type]


def test_vacuum_removes_change_data_files_older_than_the_retention_and_keeps_what_readers_need(tmp_path):
    """delta-rs 1.6.6's VACUUM never deletes ``_change_data/`` files (the UPDATE's change files
    piled up forever). Maintenance removes those older than the VACUUM retention; a lagging
    reader that still needs their version holds them like it holds data files."""
    from cdc_lake.retention import lagging_readers

    table = tmp_path / "orders"
    _cdf_table(table, 8)  # version 5: an UPDATE writing change files
    change = sorted((table / "_change_data").rglob("*.parquet"))
    assert change
    old = __import__("time").time() - 3 * 86400
    for f in change:
        os.utime(f, (old, old))
    settings = MaintenanceSettings(vacuum_retention_hours=24, compact=False)
    # a reader at version 4 needs version 5's change files: kept although older than 24 h
    # (their modification time is set back here; the commit is recent)
    readers = lagging_readers(table, [_reader_at(tmp_path, table, 4)])
    dry = maintain_table(table, settings, readers=readers, dry_run=True)
    assert dry["vacuum"]["change_files_would_remove"] == 0, dry
    report = maintain_table(table, settings, readers=readers)
    assert report["vacuum"]["change_files_removed"] == 0, report
    assert all(f.exists() for f in change)
    assert len(_cdf_rows(table, 5, 7)) == 4
    # no lagging reader: the 3-day-old change files are past the 24 h retention
    dry = maintain_table(table, settings, readers=[("caught_up", 7)], dry_run=True)
    assert dry["vacuum"]["change_files_would_remove"] == len(change) and all(f.exists() for f in change)
    report = maintain_table(table, settings, readers=[("caught_up", 7)])
    assert report["vacuum"]["change_files_removed"] == len(change), report
    assert report["vacuum"]["change_bytes"] > 0
    assert not any(f.exists() for f in change)
    # a recent change file (a new UPDATE) stays
    DeltaTable(str(table)).update(updates={"v": "'again'"}, predicate="id = 2")
    fresh = sorted((table / "_change_data").rglob("*.parquet"))
    assert fresh
    report = maintain_table(table, settings, readers=[("caught_up", 8)])
    assert report["vacuum"]["change_files_removed"] == 0 and all(f.exists() for f in fresh)


def test_vacuum_counts_only_files_it_deletes_and_leaves_an_unchanged_table_alone(tmp_path):
    """delta-rs's VACUUM lists every file a tombstone past the retention names, also files an
    earlier VACUUM (or a person) already deleted: an unchanged table reported files vacuumed on
    every maintenance run, and each run added a VACUUM START/END commit pair. The count is what
    left the disk; a table with nothing to delete gets no commit. A folder with a space checks
    the paths delta-rs gives (relative and encoded, or absolute)."""
    from deltalake import write_deltalake
    import pyarrow as pa

    table = tmp_path / "with space" / "t"
    for i in range(3):
        write_deltalake(str(table), pa.table({"id": [i]}), mode="overwrite")
    old = sorted(table.glob("*.parquet"))
    assert len(old) == 3
    settings = MaintenanceSettings(vacuum_retention_hours=0, compact=False, checkpoint=False)
    live = {Path(u).name for u in DeltaTable(str(table)).file_uris()}
    stale = [f for f in old if f.name not in live]
    assert len(stale) == 2
    stale[0].unlink()  # gone already: not counted
    dry = maintain_table(table, MaintenanceSettings(vacuum_retention_hours=0, compact=False,
                                                    checkpoint=False), dry_run=True)
    assert dry["vacuum"]["would_remove"] == 1, dry
    report = maintain_table(table, settings)
    assert report["vacuum"]["files_removed"] == 1, report
    assert len(list(table.glob("*.parquet"))) == 1
    version = DeltaTable(str(table)).version()
    again = maintain_table(table, settings)
    assert again["vacuum"]["files_removed"] == 0, again
    assert DeltaTable(str(table)).version() == version  # nothing to delete: no VACUUM commits
    assert [r["id"] for r in DeltaTable(str(table)).to_pyarrow_table().to_pylist()] == [2]


def test_a_table_that_lost_a_data_file_is_reported_with_exit_3_and_left_alone(tmp_path):
    """Tester: a data file of one table deleted by hand: maintenance exited 1 (Airflow retried
    it for nothing) with delta-rs's error cut at 300 characters and no recovery. Now: exit 3,
    the file and the table named with the ingest job's recovery; the other tables maintained."""
    yaml, cfg = _two_appended_tables(tmp_path, "maint_gone")
    customers = cfg.tables["customers"].path
    victim = sorted(customers.glob("*.parquet"))[0]
    victim.unlink()
    version = DeltaTable(str(customers)).version()

    r = subprocess.run([sys.executable, "-m", "cdc_lake.maintenance", "--pipeline", str(yaml)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    assert str(victim) in r.stderr and "NEEDS RECOVERY" in r.stderr, r.stderr[-2000:]
    assert "--full-refresh --tables customers" in r.stderr and "put the data file back" in r.stderr
    summary = json.loads(r.stdout.split("CDC_MAINTENANCE_SUMMARY ", 1)[1])
    assert summary["failed"] == ["customers"] and summary["tables"]["customers"]["status"] == "missing_file"
    assert summary["tables"]["orders"]["status"] == "ok"
    assert DeltaTable(str(customers)).version() == version  # not maintained


def test_printed_move_aside_commands_work_when_pasted_for_paths_with_spaces(tmp_path):
    """Tester: `mv /x/lake dir/orders /x/lake dir/orders.damaged` as printed failed when pasted
    (rc 1). The recoveries quote their paths; the command runs in a real shell here."""
    import re

    yaml = tmp_path / "sp ace" / "p.yaml"
    yaml.parent.mkdir()
    yaml.write_text(DAG_YAML.format(root=tmp_path / "lake dir").replace("cap_dag", "spaced"))
    cfg = load_pipeline(yaml)
    table = cfg.tables["orders"].path
    table.mkdir(parents=True)
    from cdc_lake.maintenance import damaged_recovery

    text = damaged_recovery(cfg, "orders", table)
    [mv] = re.findall(r"`(mv [^`]+)`", text)
    refresh = re.findall(r"`(spark-submit [^`]+)`", text)[0]
    assert f"--pipeline '{yaml}'" in refresh, refresh
    r = subprocess.run(["bash", "-c", mv], capture_output=True, text=True)
    assert r.returncode == 0 and not table.exists(), (mv, r.stderr)
    [first] = table.parent.glob("orders.damaged-*")
    # a second recovery of the same table (a later message) keeps both copies side by side;
    # `mv a a.damaged` with a.damaged already there had moved the table inside the first copy
    time.sleep(1.1)
    table.mkdir()
    [mv2] = re.findall(r"`(mv [^`]+)`", damaged_recovery(cfg, "orders", table))
    r = subprocess.run(["bash", "-c", mv2], capture_output=True, text=True)
    assert r.returncode == 0 and not table.exists(), (mv2, r.stderr)
    assert len(list(table.parent.glob("orders.damaged-*"))) == 2 and not list(first.iterdir())


# -- the maintenance tester's findings, 2026-11-27 ----------------------------------------------
def test_a_batch_planned_but_not_committed_holds_the_versions_it_pinned(tmp_path):
    """An enrichment batch killed after its plan replays reading its dimensions (and its own
    tables) at the planned versions. Maintenance vacuumed a dimension version in between (only
    the fact table's change feed counted as read); the replay then stopped with exit 3 blaming
    a VACUUM outside the pipeline. The planned version is held until the batch commits."""
    from deltalake import write_deltalake
    import pyarrow as pa

    from cdc_lake.retention import pinned_readers

    dim = tmp_path / "dim"
    for i in range(4):  # versions 0..3, each replacing the previous file
        write_deltalake(str(dim), pa.table({"id": [i]}), mode="overwrite")
    ckpt = tmp_path / "reader_ckpt"
    (ckpt / "commits").mkdir(parents=True)
    (ckpt / "enrich_batches").mkdir()
    (ckpt / "commits" / "0").write_text("v1\n{}\n")
    for b, v in ((0, 0), (1, 1)):  # batch 0 committed; batch 1 planned on version 1, not committed
        (ckpt / "enrich_batches" / f"{b}.json").write_text(json.dumps(
            {"batch_id": b, "started_at": "2026-11-27T10:00:00+00:00",
             "versions": {"dim:products": v, "enriched": None, "pending": None}}))
    reader = SimpleNamespace(name="lines", checkpoint_path=ckpt, pinned_tables={"dim:products": dim})
    readers = pinned_readers(dim, [reader])
    assert readers == [("lines (batch 1 replay)", 0)]
    report = maintain_table(dim, MaintenanceSettings(vacuum_retention_hours=0, compact=False), readers=readers)
    assert report["vacuum"]["held_back_by"] == "lines (batch 1 replay)", report
    assert DeltaTable(str(dim), version=1).to_pyarrow_table().to_pylist() == [{"id": 1}]  # replayable
    (ckpt / "commits" / "1").write_text("v1\n{}\n")  # the replay committed: nothing pinned
    assert pinned_readers(dim, [reader]) == []
    report = maintain_table(dim, MaintenanceSettings(vacuum_retention_hours=0, compact=False),
                            readers=pinned_readers(dim, [reader]))
    assert report["vacuum"]["held_back_by"] is None and len(list(dim.glob("*.parquet"))) == 1


def test_the_shipped_enrich_pipeline_pins_its_dimensions_and_own_tables():
    cfg = load_pipeline(REPO / "pipelines" / "shop_order_lines.yaml")
    assert {k for k in cfg.pinned_tables if k.startswith("dim:")} == {f"dim:{d.name}" for d in cfg.dimensions}
    assert cfg.pinned_tables["enriched"] == cfg.outputs.enriched
    assert cfg.pinned_tables["pending"] == cfg.outputs.pending


def test_a_yaml_in_the_folder_that_does_not_load_holds_vacuum_of_every_table(tmp_path, capsys):
    """A typo in an enrichment YAML dropped that reader from the reader check; its change feed
    was vacuumed (exit 0, no warning). Which tables a broken YAML reads is unknown: VACUUM and
    log cleanup of every table wait until it loads, and maintenance says so."""
    from cdc_lake.maintenance import main

    yaml, cfg = _two_appended_tables(tmp_path, "maint_held")
    (tmp_path / "lines.yaml").write_text("kind: enrich\npipeline: lines\nlate_members: {wait: 2hours}\n")
    (tmp_path / "latin.yaml").write_bytes(b"pipeline: caf\xe9\n")  # not UTF-8: was a crash, exit 1
    files = {t: len(list(cfg.tables[t].path.glob("*.parquet"))) for t in ("orders", "customers")}
    assert main(["--pipeline", str(yaml)]) == 0
    out = capsys.readouterr()
    summary = json.loads(out.out.split("CDC_MAINTENANCE_SUMMARY ", 1)[1])
    assert [h.split(" (")[0] for h in summary["held_by_unloadable"]] == [str(tmp_path / "latin.yaml"),
                                                                        str(tmp_path / "lines.yaml")]
    assert "not UTF-8" in summary["held_by_unloadable"][0]
    assert "WARNING: VACUUM and log cleanup of every table held back" in out.err
    for t in ("orders", "customers"):
        vac = summary["tables"][t]["vacuum"]
        assert vac["files_removed"] == 0 and str(tmp_path / "latin.yaml") in vac["held_back_by"], vac
        assert len(list(cfg.tables[t].path.glob("*.parquet"))) == files[t] + 1  # + the compacted file


def test_a_lost_single_data_file_a_gone_table_and_an_unreadable_record_stop_maintenance(tmp_path, capsys):
    """Three states maintenance reported as fine (exit 0), each burying evidence: the only data
    file of a table deleted (noticed only when compaction read it, i.e. with several files); a
    table a run wrote removed ("absent"); its record of the tables' versions unreadable (the
    lost-commit check silently skipped). Each is exit 3 now; a dry run says the same."""
    from cdc_lake.cdc.table_records import VERSIONS_FILE, record_versions
    from cdc_lake.maintenance import main

    yaml, cfg = _two_appended_tables(tmp_path, "maint_states")
    assert main(["--pipeline", str(yaml)]) == 0  # compacted: one data file per table
    cfg.checkpoint_path.mkdir(parents=True, exist_ok=True)
    record_versions(cfg)  # what a run records
    capsys.readouterr()
    [only] = [Path(u) for u in DeltaTable(str(cfg.tables["customers"].path)).file_uris()]
    only.unlink()
    import shutil

    shutil.rmtree(cfg.tables["orders"].path)
    for dry in ([], ["--dry-run"]):
        assert main(["--pipeline", str(yaml), *dry]) == 3, dry
        out = capsys.readouterr()
        summary = json.loads(out.out.split("CDC_MAINTENANCE_SUMMARY ", 1)[1])
        assert summary["tables"]["customers"]["status"] == "missing_file", summary
        assert summary["tables"]["orders"]["status"] == "missing_table", summary
        assert str(only) in out.err and "--full-refresh --tables orders" in out.err, out.err
        [gone_line] = [x for x in out.err.splitlines() if "the table is gone" in x]
        assert "orders" in gone_line and "mv " not in gone_line, gone_line  # nothing to move
    record = cfg.checkpoint_path / VERSIONS_FILE
    record.write_text(record.read_text()[:10])
    assert main(["--pipeline", str(yaml)]) == 3
    err = capsys.readouterr().err
    assert "NEEDS RECOVERY: nothing maintained" in err and str(record) in err, err


def test_retention_beyond_what_vacuum_takes_and_abbreviations_are_refused(tmp_path, capsys):
    from cdc_lake.maintenance import main

    f = tmp_path / "p.yaml"
    f.write_text(DAG_YAML.format(root=tmp_path) + "maintenance: {vacuum_retention_hours: 10000000000000}\n")
    with pytest.raises(ConfigError) as e:
        load_pipeline(f)
    assert e.value.key == "maintenance.vacuum_retention_hours" and "at most" in str(e.value)
    with pytest.raises(SystemExit):
        main(["--pipeline", str(f), "--dry"])
    assert "unrecognized arguments: --dry" in capsys.readouterr().err


def test_a_dry_run_of_a_pipeline_that_never_ran_creates_nothing(tmp_path):
    from cdc_lake.maintenance import main

    f = tmp_path / "p.yaml"
    f.write_text(DAG_YAML.format(root=tmp_path / "lake_root"))
    assert main(["--pipeline", str(f), "--dry-run"]) == 0
    assert not (tmp_path / "lake_root").exists()
