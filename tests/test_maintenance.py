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
from cdc_lake.maintenance import (MaintenanceSettings, committed_source_versions, maintain_table,
                                  run_maintenance)

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
    reader = SimpleNamespace(name="enrich_x", checkpoint_path=ckpt, change_feed_sources=[str(table)])
    from cdc_lake.maintenance import lagging_readers

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
    from cdc_lake.maintenance import lagging_readers

    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path))
    pipelines, errors = load_all(REPO / "pipelines")
    assert not errors, errors
    order_items = tmp_path / "lake" / "shop_maxwell" / "order_items"
    readers = lagging_readers(order_items, pipelines)
    assert [name for name, _ in readers] == ["shop_order_lines"]
    assert readers[0][1] == -1  # no checkpoint yet: it has read nothing, VACUUM keeps everything
    assert lagging_readers(tmp_path / "lake" / "shop_maxwell" / "customers", pipelines) == []
