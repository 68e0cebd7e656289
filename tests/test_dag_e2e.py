"""``dag.test()`` end to end: DAG folder -> CdcSparkSubmitOperator -> spark-submit -> job -> Delta.

Two tiers:

* **fake spark-submit** (fast, no JVM): a stand-in ``spark-submit`` first on ``PATH`` records its
  argv and plays the job's exit codes (0 with a run summary, 75 lock held, 2 config error,
  1 failure), so the operator's command line, XCom, Asset events and exit-code mapping are
  checked exactly;
* **real** : the real provider operator runs the real ``spark-submit`` of the venv on
  ``spark_jobs/cdc_ingest.py`` with a 4-line Maxwell landing folder; the Delta table is read back
  with ``deltalake.DeltaTable``, and a second run shows that a repeated (or backfilled) run after
  an up-to-date run writes nothing.

The DAG always comes from the real DAG folder (``dags/``) with ``CDC_PIPELINES_DIR`` pointing at a
temp folder, exactly as the DAG processor would build it; no Spark connection is defined, so the
master is the default ``local[*]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
from pathlib import Path

import airflow_env  # noqa: F401  (configures Airflow before it is imported)

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow_env import DAGS_FOLDER, REPO, airflow_db  # noqa: F401
from sqlalchemy import select

from cdc_lake import jvm_archive
from cdc_lake.launch import C1_ONLY
from cdc_lake.airflow.hook import CdcSparkSubmitHook
from cdc_lake.airflow.assets import format_summary
from cdc_lake.runids import run_summary_path, safe_run_id

JOB = REPO / "spark_jobs" / "cdc_ingest.py"

FAKE_SPARK_SUBMIT = f"""\
#!{sys.executable}
# Stand-in for spark-submit: records argv, then behaves like cdc_ingest.py with exit code $FAKE_SPARK_EXIT
# (0: a run summary, with the keys of $FAKE_SUMMARY replacing the defaults).
import json, os, sys
sys.path.insert(0, {str(REPO / 'src')!r})
from cdc_lake.config import load_pipeline
from cdc_lake.runids import run_summary_path, safe_run_id

argv = sys.argv[1:]
with open(os.environ["FAKE_SPARK_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
app_args = argv[next(i for i, a in enumerate(argv) if a.endswith(".py")) + 1:]
opt = lambda name: app_args[app_args.index(name) + 1]
code = int(os.environ.get("FAKE_SPARK_EXIT", "0"))
if code == 75:
    print("26/11/21 12:29:27 INFO BlockManager: Initialized BlockManager")
    from datetime import datetime, timezone
    since = os.environ.get("FAKE_LOCK_SINCE") or datetime.now(timezone.utc).isoformat()
    print("[cdc] PIPELINE LOCKED: checkpoint /x is locked by another run "
          "({{\\"pid\\": 4242, \\"run_id\\": \\"%s\\", \\"since\\": \\"%s\\"}}); this run stops without "
          "touching it." % (os.environ.get("FAKE_LOCK_HOLDER", "scheduled__other"), since))
elif code == 2:
    print("[cdc] CONFIG ERROR: p.yaml: source.path: landing folder does not exist")
elif code:
    import time
    time.sleep(float(os.environ.get("FAKE_SPARK_SLEEP", "0")))  # a run Airflow can stop
    if os.environ.get("FAKE_JOB_RECORD"):  # the job recorded its own failure
        cfg = load_pipeline(opt("--pipeline"))
        path = run_summary_path(cfg.runs_path, cfg.name, opt("--run-id"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({{"run_id": opt("--run-id"), "status": "failed",
                                    "error": "the job's own message"}}))
    print("Exception in thread \\"main\\" java.lang.OutOfMemoryError: fake")
else:
    cfg = load_pipeline(opt("--pipeline"))
    run_id = opt("--run-id")
    summary = {{"pipeline": cfg.name, "run_id": safe_run_id(run_id), "status": "succeeded",
               "engine": "deltalake", "trigger": "available_now", "full_refresh": "--full-refresh" in app_args,
               "duration_s": 0.1, "batches": 1, "batch_ids": [0], "last_batch_id": 0, "events_read": 3,
               "quarantined": 1, "ddl_events": 0, "skipped_lines": 0,
               "tables": {{t: {{"inserted": 2, "updated": 1, "deleted": 0, "delta_version": 3,
                              "skipped_batches": 0}} for t in cfg.tables}},
               "quarantine_version": 0, "ddl_log_version": None, "checkpoint": str(cfg.checkpoint_path)}}
    summary.update(json.loads(os.environ.get("FAKE_SUMMARY", "{{}}")))  # a test's own counts
    path = run_summary_path(cfg.runs_path, cfg.name, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))
    print("CDC_RUN_SUMMARY " + json.dumps(summary))
sys.exit(code)
"""

MAXWELL_LINES = [
    {"database": "shop", "table": "orders", "type": "insert", "ts": 1732150000, "xid": 1, "commit": True,
     "data": {"id": 1, "status": "new"}},
    {"database": "shop", "table": "orders", "type": "insert", "ts": 1732150001, "xid": 2, "commit": True,
     "data": {"id": 2, "status": "new"}},
    {"database": "shop", "table": "orders", "type": "update", "ts": 1732150002, "xid": 3, "commit": True,
     "data": {"id": 1, "status": "paid"}, "old": {"status": "new"}},
    {"database": "shop", "table": "orders", "type": "delete", "ts": 1732150003, "xid": 4, "commit": True,
     "data": {"id": 2, "status": "new"}},
]


def write_pipeline(folder: Path, name: str, *, retries: int = 0) -> Path:
    """A maxwell pipeline with tables orders + customers under ``folder`` (landing folder created)."""
    (folder / "landing" / name).mkdir(parents=True, exist_ok=True)
    path = folder / "pipelines" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(f"""\
        pipeline: {name}
        owner: e2e
        retries: {retries}
        source: {{format: maxwell, path: {folder / 'landing' / name}, database: shop}}
        storage: {{root: {folder / 'lake' / name}}}
        spark: {{conf: {{spark.ui.enabled: "false", spark.sql.shuffle.partitions: "2"}}}}
        tables:
          orders: {{keys: [id]}}
          customers: {{keys: [id], scd: 2}}
        """))
    return path


def pipeline_dag(monkeypatch, folder: Path, name: str):
    monkeypatch.setenv("CDC_PIPELINES_DIR", str(folder / "pipelines"))
    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    return bag.dags[name]


def task_result(dr) -> tuple[str, int, object]:
    """(state, try_number, XCom return_value) of the run's ingest task."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.scalar(select(TaskInstance).where(TaskInstance.dag_id == dr.dag_id,
                                                       TaskInstance.run_id == dr.run_id))
        row = session.scalar(select(XComModel).where(
            XComModel.dag_id == dr.dag_id, XComModel.run_id == dr.run_id, XComModel.key == "return_value"))
        value = XComModel.deserialize_value(row) if row is not None else None
        return str(ti.state), ti.try_number, value


def asset_events(dr) -> dict[str, dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.execute(select(AssetModel.uri, AssetEvent.extra).join(AssetEvent.asset).where(
            AssetEvent.source_dag_id == dr.dag_id, AssetEvent.source_run_id == dr.run_id)).all()
        return {uri: extra for uri, extra in rows}


# --------------------------------------------------------------------------- fake spark-submit


@pytest.fixture
def fake_spark(tmp_path, monkeypatch):
    """Put a recording stand-in spark-submit first on PATH; returns a reader of its calls."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    script = bin_dir / "spark-submit"
    script.write_text(FAKE_SPARK_SUBMIT)
    script.chmod(0o755)
    log = tmp_path / "spark-submit-calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SPARK_LOG", str(log))
    monkeypatch.delenv("FAKE_SPARK_EXIT", raising=False)
    monkeypatch.delenv("FAKE_SUMMARY", raising=False)

    def calls() -> list[list[str]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return calls


def test_success_builds_the_command_and_returns_the_summary(monkeypatch, tmp_path, fake_spark, airflow_db):
    cfg_file = write_pipeline(tmp_path, "e2e_ok")
    dag = pipeline_dag(monkeypatch, tmp_path, "e2e_ok")

    dr = dag.test(run_conf={"tables": ["orders"], "max_files_per_trigger": 5, "full_refresh": True})

    state, tries, summary = task_result(dr)
    assert (state, tries) == ("success", 1)
    [argv] = fake_spark()
    app = argv.index(str(JOB))
    assert argv[app + 1:] == ["--pipeline", str(cfg_file), "--run-id", dr.run_id, "--tables", "orders",
                              "--max-files-per-trigger", "5", "--full-refresh"]
    options = argv[:app]
    assert options[options.index("--master") + 1] == "local[*]"  # no Spark connection defined
    confs = {options[i + 1] for i, a in enumerate(options) if a == "--conf"}
    assert {"spark.sql.session.timeZone=UTC", f"spark.pyspark.python={sys.executable}",
            "spark.ui.enabled=false"} <= confs
    # a 0-file backlog: C1-only JIT; plus the class archive when make setup built a usable one
    [jvm] = [c.split("=", 1)[1] for c in confs if c.startswith("spark.driver.defaultJavaOptions=")]
    archive = jvm_archive.option()
    assert jvm.split() == C1_ONLY.split() + ([archive] if archive else []), jvm
    assert "--packages" not in options  # engine auto: no JVM Delta packages
    assert options[options.index("--name") + 1] == "cdc_lake-e2e_ok"

    # the run id (with ':' and '+') maps to the same summary file on both sides
    assert ":" in dr.run_id and "+" in dr.run_id
    written = json.loads(run_summary_path(tmp_path / "lake/e2e_ok/_runs", "e2e_ok", dr.run_id).read_text())
    assert summary == written and summary["run_id"] == safe_run_id(dr.run_id)

    events = asset_events(dr)
    lake = tmp_path / "lake" / "e2e_ok"
    assert set(events) == {(lake / "orders").as_uri(), (lake / "customers").as_uri(),
                           (lake / "_quarantine").as_uri()}
    assert events[(lake / "orders").as_uri()] == {
        "pipeline": "e2e_ok", "run_id": safe_run_id(dr.run_id), "inserted": 2, "updated": 1, "deleted": 0,
        "delta_version": 3, "skipped_batches": 0}
    assert events[(lake / "_quarantine").as_uri()]["quarantined"] == 1


# --------------------------------------------------------------------------- Asset events
# The task's outlet is the pipeline's AssetAlias; at run time it adds an event for each table the
# run changed (assets.cdc_table_changed), recorded against that table's Asset.


def _table(inserted: int = 0, updated: int = 0, deleted: int = 0, version: int | None = 5,
           skipped: int = 0) -> dict:
    return {"inserted": inserted, "updated": updated, "deleted": deleted, "delta_version": version,
            "skipped_batches": skipped}


def _lake_uri(tmp_path: Path, name: str, table: str) -> str:
    return (tmp_path / "lake" / name / table).as_uri()


def test_outlet_is_the_pipelines_asset_alias(monkeypatch, tmp_path):
    from airflow.sdk import AssetAlias

    write_pipeline(tmp_path, "e2e_alias")
    task = pipeline_dag(monkeypatch, tmp_path, "e2e_alias").task_dict["ingest"]
    assert task.outlets == [AssetAlias("cdc_lake:e2e_alias")]
    assert {a.uri for a in task.output_assets()} == {
        _lake_uri(tmp_path, "e2e_alias", t) for t in ("orders", "customers", "_quarantine")}


def test_a_run_records_events_for_exactly_the_tables_it_changed(monkeypatch, tmp_path, fake_spark, airflow_db):
    """orders changed, customers did not, nothing quarantined: one event, orders', with its metrics."""
    write_pipeline(tmp_path, "e2e_changed")
    tables = {"orders": _table(updated=4, deleted=1, version=6), "customers": _table(version=2)}
    monkeypatch.setenv("FAKE_SUMMARY", json.dumps({"tables": tables, "quarantined": 0,
                                                   "quarantine_version": 1}))
    dr = pipeline_dag(monkeypatch, tmp_path, "e2e_changed").test()
    assert task_result(dr)[0] == "success"
    assert asset_events(dr) == {_lake_uri(tmp_path, "e2e_changed", "orders"): {
        "pipeline": "e2e_changed", "run_id": safe_run_id(dr.run_id), **tables["orders"]}}


def test_a_run_with_nothing_new_records_no_asset_event(monkeypatch, tmp_path, fake_spark, airflow_db):
    """The no-op run of a backfill or a repeated schedule: success, no event, no downstream run."""
    from airflow.models.asset import AssetEvent

    write_pipeline(tmp_path, "e2e_noop")
    monkeypatch.setenv("FAKE_SUMMARY", json.dumps({
        "events_read": 0, "batches": 0, "batch_ids": [], "quarantined": 0, "quarantine_version": 0,
        "tables": {"orders": _table(version=6), "customers": _table(version=2)}}))
    dr = pipeline_dag(monkeypatch, tmp_path, "e2e_noop").test()
    assert task_result(dr)[0] == "success"
    assert asset_events(dr) == {}
    from airflow.utils.session import create_session

    uris = {_lake_uri(tmp_path, "e2e_noop", t) for t in ("orders", "customers", "_quarantine")}
    with create_session() as session:
        anywhere = [e.uri for e in session.scalars(select(AssetEvent)) if e.uri in uris]
    assert anywhere == []


def test_a_quarantine_only_run_records_the_quarantine_event(monkeypatch, tmp_path, fake_spark, airflow_db):
    write_pipeline(tmp_path, "e2e_quar")
    monkeypatch.setenv("FAKE_SUMMARY", json.dumps({
        "quarantined": 3, "quarantine_version": 2,
        "tables": {"orders": _table(version=6), "customers": _table(version=2)}}))
    dr = pipeline_dag(monkeypatch, tmp_path, "e2e_quar").test()
    assert task_result(dr)[0] == "success"
    assert asset_events(dr) == {_lake_uri(tmp_path, "e2e_quar", "_quarantine"): {
        "pipeline": "e2e_quar", "run_id": safe_run_id(dr.run_id), "quarantined": 3, "delta_version": 2}}


def test_a_full_refresh_counts_as_a_change_of_the_tables_it_rebuilt(monkeypatch, tmp_path, fake_spark,
                                                                    airflow_db):
    """A rebuild replaces the table in one commit: an event even when the staged run counted no
    rows (an empty table is the truth); the table the subset left alone gets none."""
    write_pipeline(tmp_path, "e2e_refresh")
    monkeypatch.setenv("FAKE_SUMMARY", json.dumps({
        "full_refresh": True, "events_read": 0, "quarantined": 0,
        "tables": {"orders": _table(version=9)}}))  # the job lists only the refreshed tables
    dr = pipeline_dag(monkeypatch, tmp_path, "e2e_refresh").test(
        run_conf={"tables": ["orders"], "full_refresh": True})
    assert task_result(dr)[0] == "success"
    assert set(asset_events(dr)) == {_lake_uri(tmp_path, "e2e_refresh", "orders")}


def test_an_alias_event_queues_the_dag_scheduled_on_that_table(monkeypatch, tmp_path, fake_spark, airflow_db):
    """A DAG scheduled on the plain ``Asset("file:///...")`` of a table is queued by the event the
    upstream task added through its alias, and only by a run that changed the table."""
    from airflow.dag_processing.dagbag import sync_bag_to_db
    from airflow.models.asset import AssetDagRunQueue
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    write_pipeline(tmp_path, "e2e_up")
    orders = _lake_uri(tmp_path, "e2e_up", "orders")
    down = write_pipeline(tmp_path, "e2e_down")
    down.write_text(down.read_text() + f"schedule: {{assets: ['{orders}']}}\n")
    monkeypatch.setenv("CDC_PIPELINES_DIR", str(tmp_path / "pipelines"))
    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    sync_bag_to_db(bag, "dags-folder", None)
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == "e2e_down").values(is_paused=False))

    def queued() -> int:
        with create_session() as session:
            return len(session.scalars(select(AssetDagRunQueue).where(
                AssetDagRunQueue.target_dag_id == "e2e_down")).all())

    monkeypatch.setenv("FAKE_SUMMARY", json.dumps({"quarantined": 0, "tables": {
        "orders": _table(version=6), "customers": _table(inserted=1, version=2)}}))
    assert task_result(bag.dags["e2e_up"].test())[0] == "success"
    assert queued() == 0, "customers changed, orders did not: the orders DAG must not run"
    monkeypatch.setenv("FAKE_SUMMARY", json.dumps({"quarantined": 0, "tables": {
        "orders": _table(inserted=2, version=7), "customers": _table(version=2)}}))
    assert task_result(bag.dags["e2e_up"].test())[0] == "success"
    assert queued() == 1


def test_explicit_static_outlets_still_win(tmp_path):
    """A caller's ``outlets=[table_asset(p)]``: Airflow records those on every success (the old
    behaviour, chosen explicitly); the operator only sets their metrics, adds no alias event."""
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from cdc_lake.airflow.assets import pipeline_alias, table_asset
    from cdc_lake.airflow.operator import CdcSparkSubmitOperator
    from cdc_lake.config import load_pipeline

    cfg = load_pipeline(write_pipeline(tmp_path, "e2e_static"))
    orders = table_asset(cfg.tables["orders"].path)
    op = CdcSparkSubmitOperator(task_id="ingest", pipeline=cfg, outlets=[orders])
    assert op.outlets == [orders]
    events = OutletEventAccessors()
    op._annotate_asset_events({"outlet_events": events}, {
        "run_id": "r1", "quarantined": 2, "tables": {"orders": _table(version=6),
                                                      "customers": _table(inserted=1, version=2)}})
    assert events[orders].extra == {"pipeline": "e2e_static", "run_id": "r1", **_table(version=6)}
    assert events[pipeline_alias("e2e_static")].asset_alias_events == []


@pytest.mark.parametrize(("metrics", "full_refresh", "changed"), [
    (_table(), False, False),                        # nothing new
    (_table(inserted=1), False, True),
    (_table(updated=1), False, True),
    (_table(deleted=1), False, True),
    (_table(skipped=1), False, True),                # a replay: the failed attempt's rows are announced now
    (_table(), True, True),                          # rebuilt by a full refresh
    (_table(version=None), True, False),             # a full refresh of a table that never existed
    ({"inserted": None, "delta_version": 3}, False, False),
])
def test_cdc_table_changed(metrics, full_refresh, changed):
    from cdc_lake.airflow.assets import cdc_table_changed

    assert cdc_table_changed(metrics, full_refresh=full_refresh) is changed


def test_scheduled_style_run_passes_no_optional_args(monkeypatch, tmp_path, fake_spark, airflow_db):
    write_pipeline(tmp_path, "e2e_plain")
    dr = pipeline_dag(monkeypatch, tmp_path, "e2e_plain").test()
    assert task_result(dr)[0] == "success"
    [argv] = fake_spark()
    assert argv[argv.index(str(JOB)) + 1:] == ["--pipeline", str(tmp_path / "pipelines/e2e_plain.yaml"),
                                               "--run-id", dr.run_id]


@pytest.mark.parametrize(("exit_code", "conf", "state"), [
    (75, {}, "skipped"),                        # lock held: the holder processes the pipeline
    (75, {"full_refresh": True}, "failed"),     # a requested rebuild must not vanish silently
    (2, {}, "failed"),                          # config/argument error: a retry cannot help
    (3, {}, "failed"),                          # checkpoint/table needs recovery: a retry cannot help
    (4, {}, "failed"),                          # quarantine threshold: a retry would find nothing new
])
def test_exit_codes_that_must_not_retry(monkeypatch, tmp_path, fake_spark, airflow_db, exit_code, conf, state):
    write_pipeline(tmp_path, "e2e_rc", retries=3)
    monkeypatch.setenv("FAKE_SPARK_EXIT", str(exit_code))

    dr = pipeline_dag(monkeypatch, tmp_path, "e2e_rc").test(run_conf=conf)

    assert task_result(dr)[:2] == (state, 1)  # first try final: no up_for_retry
    assert len(fake_spark()) == 1
    assert asset_events(dr) == {}


def test_other_failures_fail_the_task(monkeypatch, tmp_path, fake_spark, airflow_db):
    write_pipeline(tmp_path, "e2e_fail", retries=0)
    monkeypatch.setenv("FAKE_SPARK_EXIT", "1")
    dr = pipeline_dag(monkeypatch, tmp_path, "e2e_fail").test()
    assert task_result(dr)[:2] == ("failed", 1)
    assert asset_events(dr) == {}


def test_lock_held_by_maintenance_fails_so_that_airflow_retries(monkeypatch, tmp_path, fake_spark):
    """Tester: an ingest that met the pipeline's maintenance holding the lock was skipped (DAG run
    green) although maintenance ingests nothing: the new files waited for the next run, on a
    manual-only pipeline for ever. It now fails with a retryable error naming the holder."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

    from cdc_lake.airflow.operator import CdcSparkSubmitOperator
    from cdc_lake.config import load_pipeline

    monkeypatch.setenv("FAKE_SPARK_EXIT", "75")
    monkeypatch.setenv("FAKE_LOCK_HOLDER", "maintenance-20261128T060000")
    op = CdcSparkSubmitOperator(task_id="ingest", pipeline=load_pipeline(write_pipeline(tmp_path, "lkm")))
    with pytest.raises(AirflowException) as exc:
        op.execute({"params": {}, "run_id": "manual__1"})
    assert not isinstance(exc.value, (AirflowSkipException, AirflowFailException)), exc.value
    assert "The holder is the pipeline's maintenance" in str(exc.value)
    assert '"run_id": "maintenance-20261128T060000"' in str(exc.value)


def test_lock_held_by_a_run_that_started_before_new_files_fails_so_that_airflow_retries(
        monkeypatch, tmp_path, fake_spark):
    """Tester, 2026-11-29: the runs of a backfill that met the lock were skipped (DAG runs green)
    while files landed after the holder had started waited, unread, for some later run (the
    holder's Trigger.AvailableNow end was fixed before they landed). Skipped only while every
    landed file is older than the holder's lock; otherwise a retryable failure naming them."""
    from datetime import datetime, timedelta, timezone

    from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

    from cdc_lake.airflow.operator import CdcSparkSubmitOperator
    from cdc_lake.config import load_pipeline

    cfg = load_pipeline(write_pipeline(tmp_path, "lkn"))
    old = cfg.landing_path / "0001.json"
    old.write_text("{}\n", encoding="utf-8")
    since = datetime.now(timezone.utc) - timedelta(minutes=5)
    os.utime(old, (since.timestamp() - 60, since.timestamp() - 60))  # landed before the holder
    monkeypatch.setenv("FAKE_SPARK_EXIT", "75")
    monkeypatch.setenv("FAKE_LOCK_SINCE", since.isoformat())
    op = CdcSparkSubmitOperator(task_id="ingest", pipeline=cfg)
    with pytest.raises(AirflowSkipException):
        op.execute({"params": {}, "run_id": "backfill__2"})

    (cfg.landing_path / "0002.json").write_text("{}\n", encoding="utf-8")  # after the holder's lock
    op = CdcSparkSubmitOperator(task_id="ingest", pipeline=cfg)
    with pytest.raises(AirflowException) as exc:
        op.execute({"params": {}, "run_id": "backfill__3"})
    assert not isinstance(exc.value, (AirflowSkipException, AirflowFailException)), exc.value
    assert "1 input file(s) landed after the holder took the lock" in str(exc.value), exc.value
    assert "0002.json" in str(exc.value) and "retries this run" in str(exc.value), exc.value


def test_a_run_that_ends_without_its_own_record_is_recorded_as_failed(monkeypatch, tmp_path, fake_spark):
    """Tester, 2026-11-29: after a run whose driver was killed (or that Airflow stopped: task
    marked failed), the status view and ``latest.json`` still showed the run before as the last,
    "succeeded". The operator now records such a run as failed; a record the job wrote itself
    is kept, and a run that met the lock (exit 75) records nothing."""
    import threading
    import time

    from airflow.sdk.exceptions import AirflowException

    from cdc_lake.airflow.operator import CdcSparkSubmitOperator
    from cdc_lake.config import load_pipeline

    cfg = load_pipeline(write_pipeline(tmp_path, "rec"))
    latest = cfg.runs_path / cfg.name / "latest.json"

    def run(run_id: str, code: str, **env: str) -> None:
        monkeypatch.setenv("FAKE_SPARK_EXIT", code)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        op = CdcSparkSubmitOperator(task_id="ingest", pipeline=cfg)
        context = {"params": {}, "run_id": run_id}
        op.application_args = op.render_template(op.application_args, context)
        with contextlib.suppress(AirflowException):
            op.execute(context)

    run("manual__ok", "0")
    assert json.loads((latest.parent / "manual__ok.json").read_text())["status"] == "succeeded"
    run("manual__killed", "137")  # the driver killed: no record of its own
    last = json.loads(latest.read_text())
    assert (last["run_id"], last["status"], last["recorded_by"]) == ("manual__killed", "failed", "airflow")
    assert "exit code 137" in last["error"] and "OutOfMemoryError" in last["error"], last
    run("manual__locked", "75")
    assert json.loads(latest.read_text())["run_id"] == "manual__killed", "exit 75 records nothing"
    run("manual__own", "1", FAKE_JOB_RECORD="1")
    assert json.loads((latest.parent / "manual__own.json").read_text())["error"] == "the job's own message"

    # Airflow stops the task while spark-submit runs: on_kill stops it and records the run
    monkeypatch.setenv("FAKE_SPARK_EXIT", "1")
    monkeypatch.setenv("FAKE_SPARK_SLEEP", "60")
    monkeypatch.delenv("FAKE_JOB_RECORD")
    op = CdcSparkSubmitOperator(task_id="ingest", pipeline=cfg)
    context = {"params": {}, "run_id": "manual__stopped"}
    op.application_args = op.render_template(op.application_args, context)
    t = threading.Thread(target=_quietly, args=(op.execute, context))
    t.start()
    deadline = time.monotonic() + 30
    while getattr(getattr(op, "_hook", None), "_submit_sp", None) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    op.on_kill()
    t.join(30)
    assert not t.is_alive(), "spark-submit was stopped"
    last = json.loads(latest.read_text())
    assert (last["run_id"], last["status"]) == ("manual__stopped", "failed"), last
    assert "the Airflow task was stopped" in last["error"], last


def _quietly(fn, *args):  # type: ignore[no-untyped-def]
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - the stopped run's own failure
        pass


def test_lock_message_names_the_holder(monkeypatch, tmp_path, fake_spark):
    """The skip reason carries the job's lock line (pid/run id of the holder) from the driver output."""
    from airflow.sdk.exceptions import AirflowSkipException

    from cdc_lake.airflow.operator import CdcSparkSubmitOperator
    from cdc_lake.config import load_pipeline

    monkeypatch.setenv("FAKE_SPARK_EXIT", "75")
    op = CdcSparkSubmitOperator(task_id="ingest", pipeline=load_pipeline(write_pipeline(tmp_path, "lk")))
    with pytest.raises(AirflowSkipException) as exc:
        op.execute({"params": {}, "run_id": "manual__1"})
    assert "is locked by another run (job exit code 75)" in str(exc.value)
    assert '"pid": 4242, "run_id": "scheduled__other"' in str(exc.value)
    assert "BlockManager" not in str(exc.value)


def test_config_error_message_is_the_jobs_own(monkeypatch, tmp_path, fake_spark):
    """Exit 2: the task error carries the job's CONFIG ERROR line (file, key, value), not the
    hook's "Cannot execute: <whole spark-submit command line>"."""
    from airflow.sdk.exceptions import AirflowFailException

    from cdc_lake.airflow.operator import CdcSparkSubmitOperator
    from cdc_lake.config import load_pipeline

    monkeypatch.setenv("FAKE_SPARK_EXIT", "2")
    op = CdcSparkSubmitOperator(task_id="ingest", pipeline=load_pipeline(write_pipeline(tmp_path, "cfg2")))
    with pytest.raises(AirflowFailException) as exc:
        op.execute({"params": {}, "run_id": "manual__1"})
    assert "CONFIG ERROR: p.yaml: source.path: landing folder does not exist" in str(exc.value)
    assert "Cannot execute" not in str(exc.value)


def test_postgres_lock_dsn_is_exported_from_the_airflow_connection(monkeypatch, tmp_path):
    from cdc_lake.airflow.operator import CdcSparkSubmitOperator
    from cdc_lake.config import load_pipeline

    path = write_pipeline(tmp_path, "pglock")
    path.write_text(path.read_text() + "lock: {backend: postgres, conn_id: lake_locks}\n")
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_LOCKS", "postgres://locker:s3cret@db.example:5432/airflow")
    monkeypatch.setenv("CDC_PY_FILES_DIR", str(tmp_path / "py-files"))
    op = CdcSparkSubmitOperator(task_id="ingest", pipeline=load_pipeline(path))
    op._ship_package()
    assert op.env_vars["CDC_LOCK_DSN"].startswith("postgres://locker:s3cret@db.example:5432/airflow")
    plain = CdcSparkSubmitOperator(task_id="ingest", pipeline=load_pipeline(write_pipeline(tmp_path, "filelock")))
    plain._ship_package()
    assert "CDC_LOCK_DSN" not in (plain.env_vars or {})


def test_a_worker_without_a_locale_gives_spark_submit_a_utf8_one(monkeypatch, tmp_path):
    """Without LANG / LC_ALL / LC_CTYPE the driver JVM takes file names as ASCII and skips
    non-ASCII landing files (tester; the job now stops on them: test_job_cli.py). The operator
    passes LANG=C.UTF-8 then, and leaves a locale the worker has alone."""
    from cdc_lake.airflow.operator import CdcSparkSubmitOperator
    from cdc_lake.config import load_pipeline

    monkeypatch.setenv("CDC_PY_FILES_DIR", str(tmp_path / "py-files"))
    for v in ("LC_ALL", "LC_CTYPE", "LANG"):
        monkeypatch.delenv(v, raising=False)
    cfg = load_pipeline(write_pipeline(tmp_path, "nolocale"))
    op = CdcSparkSubmitOperator(task_id="ingest", pipeline=cfg)
    op._ship_package()
    assert (op.env_vars or {}).get("LANG") == "C.UTF-8", op.env_vars
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    op = CdcSparkSubmitOperator(task_id="ingest", pipeline=cfg)
    op._ship_package()
    assert "LANG" not in (op.env_vars or {}), op.env_vars


def test_hook_master_comes_from_the_connection(monkeypatch):
    assert CdcSparkSubmitHook(conn_id="cdc_undefined")._connection["master"] == "local[*]"
    monkeypatch.setenv("AIRFLOW_CONN_CDC_CLUSTER", '{"conn_type": "spark", "host": "spark://m1", "port": 7077}')
    assert CdcSparkSubmitHook(conn_id="cdc_cluster")._connection["master"] == "spark://m1:7077"
    monkeypatch.setenv("AIRFLOW_CONN_CDC_YARN", '{"conn_type": "spark", "host": "yarn"}')
    hook = CdcSparkSubmitHook(conn_id="cdc_yarn")
    assert hook._connection["master"] == "yarn" and hook._is_yarn


def test_format_summary():
    text = format_summary({"pipeline": "p", "run_id": "r", "status": "succeeded", "duration_s": 4.2,
                           "engine": "deltalake", "batches": 2, "batch_ids": [3, 4], "events_read": 10,
                           "quarantined": 1, "ddl_events": 0, "skipped_lines": 0,
                           "tables": {"orders": {"inserted": 3, "updated": 2, "deleted": 1, "delta_version": 7}}})
    assert text == ("CDC run p / r: succeeded in 4.2 s (engine deltalake)\n"
                    "  batches 2 [3, 4], events 10, quarantined 1, DDL 0, skipped lines 0\n"
                    "  orders  +3 ~2 -1  delta v7")


# --------------------------------------------------------------------------- real spark-submit


# Slow tier (~50 s): the same real path (DAG -> operator -> spark-submit -> job -> Delta, a
# repeated run writing nothing) runs in the default tier through a real Airflow scheduler
# (test_airflow_live: trigger with conf, sequential idempotent backfill) and on a standalone
# cluster (test_spark_cluster); this one adds dag.test() as the entry point.
@pytest.mark.slow
@pytest.mark.skipif(not JOB.is_file(), reason=f"needs the Spark job {JOB} (not written yet)")
def test_real_spark_submit_writes_delta_and_repeats_idempotently(monkeypatch, tmp_path, airflow_db):
    from deltalake import DeltaTable

    write_pipeline(tmp_path, "e2e_real", retries=0)
    (tmp_path / "landing/e2e_real/000001.json").write_text("".join(json.dumps(x) + "\n" for x in MAXWELL_LINES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    dag = pipeline_dag(monkeypatch, tmp_path, "e2e_real")

    first = dag.test()
    state, _, summary = task_result(first)
    assert state == "success", f"task {state}; see the spark-submit output above"
    assert summary["status"] == "succeeded" and summary["events_read"] == 4
    assert summary["tables"]["orders"]["delta_version"] is not None
    orders = DeltaTable(str(tmp_path / "lake/e2e_real/orders")).to_pyarrow_table().to_pylist()
    assert [(r["id"], r["status"], r["_cdc_op"]) for r in orders] == [(1, "paid", "update")]
    version = DeltaTable(str(tmp_path / "lake/e2e_real/orders")).version()

    second = dag.test()  # nothing new in the landing folder: a repeat/backfill writes nothing
    state, _, again = task_result(second)
    assert state == "success"
    assert again["events_read"] == 0
    assert DeltaTable(str(tmp_path / "lake/e2e_real/orders")).version() == version


@pytest.mark.skipif(not JOB.is_file(), reason=f"needs the Spark job {JOB} (not written yet)")
def test_real_run_while_another_run_holds_the_lock_is_skipped(monkeypatch, tmp_path, airflow_db):
    """What a concurrent backfill run sees: the job exits 75 at once, the task is skipped, no retry."""
    from cdc_lake.checkpoint import lock_for
    from cdc_lake.config import load_pipeline

    cfg = load_pipeline(write_pipeline(tmp_path, "e2e_locked", retries=2))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    dag = pipeline_dag(monkeypatch, tmp_path, "e2e_locked")
    holder = lock_for(cfg.checkpoint_path)
    holder.acquire("scheduled__the_holder")
    try:
        dr = dag.test()
    finally:
        holder.release()
    assert task_result(dr)[:2] == ("skipped", 1)
    assert asset_events(dr) == {}
