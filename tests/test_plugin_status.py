"""Fast unit tests of the plugin's status readers (``cdc_lake.airflow.status``) and HTML page.

Real files only: Delta tables written with ``deltalake``, a Spark-like checkpoint folder
(``offsets/N``, ``commits/N``, ``.N.crc``, ``.tmp``), run summaries, pipeline YAML.
No Airflow server, no Spark.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

pa = pytest.importorskip("pyarrow")
deltalake = pytest.importorskip("deltalake")

from cdc_lake.airflow import status  # noqa: E402
from cdc_lake.airflow.plugin_app import create_app, render_html  # noqa: E402

PIPELINE_YAML = """\
pipeline: {name}
description: "Shop <orders> & customers"
source:
  format: maxwell
  path: landing/{name}
  database: shop
storage:
  root: lake/{name}
tables:
  orders:
    keys: [id]
  customers:
    keys: [id]
    scd: 2
"""


def write_pipeline(folder: Path, name: str = "shop_maxwell") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / f"{name}.yaml"
    f.write_text(PIPELINE_YAML.format(name=name))
    return f


def write_delta(path: Path, versions: int) -> None:
    """Create a Delta table at ``path`` with ``versions`` commits (latest version = versions-1)."""
    for i in range(versions):
        tbl = pa.table({"id": pa.array([i], pa.int64()), "name": pa.array([f"n{i}"])})
        deltalake.write_deltalake(str(path), tbl, mode="append")


def write_checkpoint(path: Path, offsets: list[int], commits: list[int]) -> None:
    (path / "offsets").mkdir(parents=True, exist_ok=True)
    (path / "commits").mkdir(parents=True, exist_ok=True)
    (path / "metadata").write_text('{"id":"abc"}\n')
    for n in offsets:
        (path / "offsets" / str(n)).write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":%d}\n' % n)
        (path / "offsets" / f".{n}.crc").write_bytes(b"crc")
    for n in commits:
        (path / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
        (path / "commits" / f".{n}.crc").write_bytes(b"crc")


def write_summary(runs: Path, pipeline: str, **over) -> dict:
    s = {"pipeline": pipeline, "run_id": "manual__2026-11-21T12:00:00+00:00", "status": "succeeded",
         "engine": "deltalake", "trigger": "available_now", "full_refresh": False,
         "started_at": "2026-11-21T12:00:00+00:00", "finished_at": "2026-11-21T12:00:04+00:00",
         "duration_s": 4.2, "batches": 2, "batch_ids": [3, 4], "last_batch_id": 4,
         "events_read": 1234, "quarantined": 3, "ddl_events": 1, "skipped_lines": 0,
         "tables": {"orders": {"inserted": 10, "updated": 4, "deleted": 1, "delta_version": 7,
                               "skipped_batches": 0}},
         "quarantine_version": 2, "ddl_log_version": 1, "checkpoint": "/abs/path"}
    s.update(over)
    (runs / pipeline).mkdir(parents=True, exist_ok=True)
    (runs / pipeline / "latest.json").write_text(json.dumps(s))
    return s


# ----------------------------------------------------------------------------- checkpoint


def test_checkpoint_missing(tmp_path):
    st = status.read_checkpoint(tmp_path / "nope")
    assert st.exists is False and st.last_batch_id is None and st.pending_batch_id is None


def test_checkpoint_empty_folder(tmp_path):
    st = status.read_checkpoint(tmp_path)
    assert st.exists is True and st.last_batch_id is None and st.pending_batch_id is None


def test_checkpoint_all_committed_ignores_crc_and_tmp(tmp_path):
    write_checkpoint(tmp_path, offsets=[0, 1, 2, 10], commits=[0, 1, 2, 10])
    (tmp_path / "commits" / ".11.3f2a.tmp").write_text("partial")
    (tmp_path / "offsets" / "11.tmp").write_text("partial")
    (tmp_path / "commits" / "12").mkdir()  # a directory named like a batch is not a commit
    st = status.read_checkpoint(tmp_path)
    assert st.last_batch_id == 10  # numeric, not lexical (10 > 2)
    assert st.pending_batch_id is None


def test_checkpoint_offset_without_commit_is_pending(tmp_path):
    write_checkpoint(tmp_path, offsets=[0, 1, 2, 3], commits=[0, 1, 2])
    st = status.read_checkpoint(tmp_path)
    assert (st.last_batch_id, st.pending_batch_id) == (2, 3)


def test_checkpoint_first_batch_pending(tmp_path):
    write_checkpoint(tmp_path, offsets=[0], commits=[])
    st = status.read_checkpoint(tmp_path)
    assert (st.last_batch_id, st.pending_batch_id) == (None, 0)


def test_checkpoint_purged_old_entries(tmp_path):
    # Spark purges old log entries; only the retained tail is left on disk.
    write_checkpoint(tmp_path, offsets=[98, 99, 100], commits=[98, 99, 100])
    st = status.read_checkpoint(tmp_path)
    assert (st.last_batch_id, st.pending_batch_id) == (100, None)


# ----------------------------------------------------------------------------- delta


def test_delta_version_real_table(tmp_path):
    write_delta(tmp_path / "t", versions=3)
    st = status.read_delta_version(tmp_path / "t")
    assert (st.exists, st.version, st.error) == (True, 2, None)


def test_delta_missing_table(tmp_path):
    assert status.read_delta_version(tmp_path / "absent").exists is False
    (tmp_path / "empty").mkdir()
    assert status.read_delta_version(tmp_path / "empty").exists is False
    (tmp_path / "emptylog" / "_delta_log").mkdir(parents=True)
    assert status.read_delta_version(tmp_path / "emptylog").exists is False


def test_delta_corrupt_log_is_reported_not_raised(tmp_path):
    log = tmp_path / "bad" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("{not json")
    st = status.read_delta_version(tmp_path / "bad")
    assert st.version is None
    assert st.error or st.exists is False


# ----------------------------------------------------------------------------- summary


def test_run_summary_missing_invalid_and_ok(tmp_path):
    assert status.read_run_summary(tmp_path, "p") == (None, None)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "latest.json").write_text("{oops")
    s, err = status.read_run_summary(tmp_path, "p")
    assert s is None and "not valid JSON" in err
    (tmp_path / "p" / "latest.json").write_text("[1, 2]")
    s, err = status.read_run_summary(tmp_path, "p")
    assert s is None and "expected a JSON object" in err
    want = write_summary(tmp_path, "p")
    assert status.read_run_summary(tmp_path, "p") == (want, None)


# ----------------------------------------------------------------------------- assembly


@pytest.fixture
def layout(tmp_path):
    """pipelines/ with one config; lake with orders (3 versions), customers not created."""
    pdir = tmp_path / "pipelines"
    write_pipeline(pdir)
    lake = pdir / "lake" / "shop_maxwell"
    write_delta(lake / "orders", versions=3)
    write_checkpoint(lake / "_checkpoints" / "shop_maxwell", offsets=[0, 1, 2, 3, 4, 5],
                     commits=[0, 1, 2, 3, 4])
    write_summary(lake / "_runs", "shop_maxwell")
    return pdir


def test_collect_status_reads_all_three_sources(layout):
    data = status.collect_status(layout)
    assert data["config_errors"] == []
    (p,) = data["pipelines"]
    assert p["pipeline"] == "shop_maxwell" and p["format"] == "maxwell"
    assert p["checkpoint"]["last_batch_id"] == 4
    assert p["checkpoint"]["pending_batch_id"] == 5
    assert p["last_run"]["status"] == "succeeded"
    assert p["last_run"]["quarantined"] == 3
    assert p["last_run"]["last_batch_id"] == 4
    tables = {t["table"]: t for t in p["tables"]}
    assert tables["orders"]["delta_version"] == 2  # from the Delta log, not the summary's 7
    assert tables["orders"]["last_run"] == {"inserted": 10, "updated": 4, "deleted": 1,
                                            "delta_version": 7}
    assert tables["customers"]["exists"] is False and tables["customers"]["delta_version"] is None
    assert tables["customers"]["last_run"] is None
    assert tables["customers"]["source"] == "shop.customers" and tables["customers"]["scd"] == 2
    json.dumps(data)  # the JSON endpoint returns exactly this


def test_collect_status_fresh_pipeline(tmp_path):
    write_pipeline(tmp_path)
    (p,) = status.collect_status(tmp_path)["pipelines"]
    assert p["checkpoint"]["exists"] is False
    assert p["last_run"] is None and p["last_run_error"] is None
    assert all(t["exists"] is False for t in p["tables"])


def test_collect_status_reports_broken_config_and_keeps_others(tmp_path):
    write_pipeline(tmp_path, "good_one")
    (tmp_path / "broken.yaml").write_text("pipeline: broken\nsource: {format: nope, path: x}\n")
    data = status.collect_status(tmp_path)
    assert [p["pipeline"] for p in data["pipelines"]] == ["good_one"]
    assert len(data["config_errors"]) == 1 and "broken.yaml" in data["config_errors"][0]


def test_collect_status_missing_folder(tmp_path):
    data = status.collect_status(tmp_path / "missing")
    assert data["pipelines"] == [] and "not found" in data["config_errors"][0]


def test_pipelines_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("CDC_PIPELINES_DIR", str(tmp_path))
    assert status.pipelines_dir() == tmp_path
    monkeypatch.delenv("CDC_PIPELINES_DIR")
    assert status.pipelines_dir() == ROOT / "pipelines"


def test_corrupt_summary_shown_as_error(layout):
    (layout / "lake" / "shop_maxwell" / "_runs" / "shop_maxwell" / "latest.json").write_text("{")
    (p,) = status.collect_status(layout)["pipelines"]
    assert p["last_run"] is None and "not valid JSON" in p["last_run_error"]


# ----------------------------------------------------------------------------- HTML


def test_html_shows_values_and_escapes_everything(layout):
    evil = "<script>alert(1)</script>"
    write_summary(layout / "lake" / "shop_maxwell" / "_runs", "shop_maxwell",
                  run_id=evil, status="succeeded\"><img src=x onerror=alert(2)>")
    page = render_html(status.collect_status(layout))
    assert "<script>alert" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Shop &lt;orders&gt; &amp; customers" in page  # description from YAML
    assert "data-testid='delta-version-shop_maxwell-orders'>2</td>" in page
    assert "not created" in page  # customers
    assert "data-testid='last-batch-shop_maxwell'>4</b>" in page
    assert "batch 5 planned, not committed" in page
    assert "data-testid='quarantined-shop_maxwell'>3</b>" in page


def test_html_escapes_config_errors(tmp_path):
    (tmp_path / "x.yaml").write_text("pipeline: '<b>bad</b>'\n")
    page = render_html(status.collect_status(tmp_path))
    assert "<b>bad</b>" not in page and "&lt;b&gt;bad&lt;/b&gt;" in page


def test_app_routes_without_auth(layout, monkeypatch):
    from fastapi.testclient import TestClient

    monkeypatch.setenv("CDC_PIPELINES_DIR", str(layout))
    client = TestClient(create_app(authenticate=False))
    r = client.get("/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert "shop_maxwell" in r.text
    r = client.get("/api/status")
    assert r.status_code == 200
    assert r.json()["pipelines"][0]["checkpoint"]["last_batch_id"] == 4


def test_app_with_auth_refuses_anonymous(layout, monkeypatch):
    """The real Airflow dependency is wired in: no token/cookie -> 401.

    Bad tokens and a logged-in 200 need an initialised auth manager: see test_airflow_live.py.
    """
    from fastapi.testclient import TestClient

    monkeypatch.setenv("CDC_PIPELINES_DIR", str(layout))
    client = TestClient(create_app())
    for path in ("/", "/api/status"):
        r = client.get(path)
        assert r.status_code in (401, 403), (path, r.status_code, r.text)


def test_plugin_module_is_cheap_and_spark_free():
    """Airflow imports plugins in every task process: no pyspark, no API-server security code."""
    import subprocess

    code = ("import sys; sys.path.insert(0, 'plugins'); import cdc_lake_plugin as p; "
            "assert 'pyspark' not in sys.modules, 'pyspark imported'; "
            "assert 'airflow.api_fastapi.core_api.security' not in sys.modules; "
            "v = p.CdcLakePlugin.external_views[0]; assert v['href'] == '/cdc/'; "
            "assert p.CdcLakePlugin.fastapi_apps[0]['url_prefix'] == '/cdc'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_html_reports_an_enrichment_runs_facts_and_its_reprocess_snapshot(layout):
    """Tester: after a --reprocess that rebuilt 210 facts the view said "0 batch(es) · 0 events
    read" (the summary counts facts, and the snapshot batch apart)."""
    from cdc_lake.airflow.kind_status import _enrich_last_run

    data = status.collect_status(layout)
    data["pipelines"][0]["last_run"] = _enrich_last_run({
        "run_id": "r", "status": "succeeded", "batches": 0, "batch_ids": [], "facts_read": 0,
        "quarantined": 0, "reprocess": True,
        "reprocess_snapshot": {"facts_read": 210, "enriched_upserted": 155, "parked": 55}})
    page = render_html(data)
    assert "0 facts read" in page, page
    assert "data-testid='reprocess-shop_maxwell'>210 facts read, 155 enriched, 55 parked</span>" in page
