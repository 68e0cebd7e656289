"""The CDC job on a real Spark standalone cluster (a master and workers on 127.0.0.1), client mode.

local[*] hides whatever must reach executors; here the landing files are read and parsed by
executor JVMs of separate worker processes (the default tier: one worker with one executor, the
smallest real cluster; the slow tier: two workers). Truth is the plain-Python reference model, as for
local runs. The slow tier also SIGKILLs a worker mid-run: Spark reschedules its tasks on the other
worker, the run completes and the tables converge.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from reference_model import (ReferenceModel, RefConfig, assert_no_diff, diff_scd2, diff_table,
                             read_delta_rows)
from spark_cluster import SPARK_SUBMIT, StandaloneCluster, cluster_env, python_without_package

from cdc_lake.demo.generator import generate
from cdc_lake.demo.pipeline_yaml import write_pipeline_yaml

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "spark_jobs" / "cdc_ingest.py"


def _submit(cluster: StandaloneCluster, yaml: Path, run_id: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(SPARK_SUBMIT), "--master", cluster.master_url, "--deploy-mode", "client",
           "--conf", "spark.cores.max=2", "--conf", "spark.executor.memory=512m",
           "--conf", "spark.executor.cores=1", "--conf", "spark.driver.memory=1g",
           "--conf", f"spark.pyspark.python={sys.executable}",
           "--conf", "spark.sql.session.timeZone=UTC", "--conf", "spark.ui.enabled=false",
           str(JOB), "--pipeline", str(yaml), "--run-id", run_id]
    return subprocess.run(cmd, env=cluster_env(), capture_output=True, text=True, timeout=600)


def _assert_equals_reference(yaml: Path, landing: Path, lake: Path) -> int:
    cfg = RefConfig.from_yaml(yaml)
    model = ReferenceModel(cfg)
    for f in sorted(landing.glob("*.json")):
        model.add_file(f)
    compared = 0
    for name, spec in cfg.tables.items():
        rows = read_delta_rows(lake / name)
        keys = spec.keys or ("id",)
        if spec.scd == 2:
            assert_no_diff(diff_scd2(model.scd2(name), rows, keys, table=name))
        else:
            assert_no_diff(diff_table(model.scd1(name), rows, keys, table=name))
        compared += len(rows)
    return compared


def _executor_logs(cluster: StandaloneCluster) -> list[Path]:
    return sorted(cluster.root.glob("worker*/app-*/*/stderr"))


def _operator_run(cfg, run_id: str) -> dict:
    """Run the DAG's ingest task the way an Airflow worker does: the operator builds the
    spark-submit from the pipeline and the Airflow connection ``spark.conn_id`` (here defined by
    an ``AIRFLOW_CONN_*`` environment variable, as users can), then runs it."""
    from cdc_lake.airflow.dag_factory import build_dag

    op = build_dag(cfg).task_dict["ingest"]
    context = {"params": {}, "run_id": run_id}
    op.render_template_fields(context)  # type: ignore[arg-type]  # {{ run_id }} in the job args
    return op.execute(context)  # type: ignore[arg-type]


def test_cdc_dag_task_on_a_standalone_cluster_equals_the_reference(tmp_path, monkeypatch):
    """Submitted by the DAG's operator through the Airflow connection ``spark://127.0.0.1:PORT``
    (client mode); executors run a Python that does NOT have cdc_lake installed, so anything they
    need from it must come from the submission (the operator ships the package zip)."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    generate(landing, "maxwell", days=1, seed=21, lines_per_file=80)
    executor_python = python_without_package(tmp_path)
    # one worker, one executor: the smallest real cluster (every process it adds is a JVM start
    # on a 2-core CI machine); the slow tier's worker-kill test runs two workers
    conf = {"spark.cores.max": "1", "spark.executor.memory": "512m", "spark.executor.cores": "1",
            "spark.driver.memory": "1g", "spark.ui.enabled": "false",
            "spark.pyspark.python": str(executor_python),
            "spark.pyspark.driver.python": sys.executable}
    yaml = write_pipeline_yaml(tmp_path / "p.yaml", "maxwell", name="on_cluster", landing=landing,
                               lake_root=lake, max_files_per_trigger=4, scd={"customers": 2},
                               extra={"spark": {"conn_id": "spark_cluster_test", "conf": conf}})
    from cdc_lake.config import load_pipeline

    cfg = load_pipeline(yaml)
    monkeypatch.setenv("CDC_PY_FILES_DIR", str(tmp_path / "py-files"))
    with StandaloneCluster(tmp_path, workers=1) as cluster:
        for k, v in cluster_env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # spark-submit
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER_TEST", f"{cluster.master_url}?deploy-mode=client")
        summary = _operator_run(cfg, "c1")
        apps = cluster.state().get("completedapps", []) + cluster.state().get("activeapps", [])
        assert any(a.get("name") == "cdc-on_cluster" for a in apps), apps  # the job's appName
        # The executors really ran on the workers (client mode: the driver is this machine's
        # spark-submit process; tasks ran in the workers' executor JVMs).
        assert _executor_logs(cluster), "no executor ran on the cluster's workers"
    assert summary and summary["status"] == "succeeded", summary
    shipped = list((tmp_path / "py-files").glob("cdc_lake-*.zip"))
    assert len(shipped) == 1, "the operator did not build the package zip for --py-files"
    assert _assert_equals_reference(yaml, landing, lake) > 0


@pytest.mark.slow
def test_worker_killed_mid_run_the_run_completes_and_tables_converge(tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    generate(landing, "maxwell", days=3, seed=22, lines_per_file=40)
    yaml = write_pipeline_yaml(tmp_path / "p.yaml", "maxwell", name="worker_kill", landing=landing,
                               lake_root=lake, max_files_per_trigger=2)
    with StandaloneCluster(tmp_path, workers=2) as cluster:
        killed: list[float] = []

        def kill_when_busy() -> None:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if len(_executor_logs(cluster)) >= 2 and (lake / "_checkpoints").exists():
                    time.sleep(3)  # inside the micro-batches
                    cluster.kill_worker(0)
                    killed.append(time.monotonic())
                    return
                time.sleep(0.5)

        t = threading.Thread(target=kill_when_busy, daemon=True)
        t.start()
        r = _submit(cluster, yaml, "k1")
        t.join(timeout=5)
        assert killed, "the worker was never killed: the test proved nothing"
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
        assert cluster.alive_workers() == 1
    _assert_equals_reference(yaml, landing, lake)


def _change_feed_table(path: Path) -> list[tuple]:
    """A Delta table with the change data feed on and 3 versions; returns the expected change
    rows ``(id, v, change type, version)`` computed from the writes themselves."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(str(path), pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    (DeltaTable(str(path)).merge(pa.table({"id": pa.array([2, 4], pa.int64()), "v": ["B", "d"]}),
                                 "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())
    DeltaTable(str(path)).delete("id = 1")
    return sorted([(1, "a", "insert", 0), (2, "b", "insert", 0), (3, "c", "insert", 0),
                   (2, "b", "update_preimage", 1), (2, "B", "update_postimage", 1), (4, "d", "insert", 1),
                   (1, "a", "delete", 2)])


@pytest.mark.slow  # the default tier's DAG-task test already runs executors without cdc_lake
def test_executor_python_code_comes_from_the_shipped_package(tmp_path):
    """The change-feed source's ``read()`` runs in executor Python workers that cannot import
    cdc_lake: with the operator's package zip on ``--py-files`` the stream reads every change
    (checked against the writes); without it the same submission fails on the executors."""
    from cdc_lake.packaging import package_zip

    table = tmp_path / "t"
    expected = _change_feed_table(table)
    executor_python = python_without_package(tmp_path)
    job = REPO / "tests" / "cluster_jobs" / "change_feed_count.py"
    env = {**cluster_env(), "PYTHONPATH": ""}  # nothing leaks the package to the workers

    def submit(cluster: StandaloneCluster, name: str, zip_path: Path | None) -> subprocess.CompletedProcess[str]:
        # what the operator does (CdcSparkSubmitHook): --py-files for the executors, and the zip
        # on spark-submit's PYTHONPATH for the Python processes the driver JVM itself starts
        # (the streaming source's planner runs there, with spark.pyspark.python)
        py_files = ["--py-files", str(zip_path)] if zip_path else []
        run_env = {**env, "PYTHONPATH": str(zip_path) if zip_path else ""}
        cmd = [str(SPARK_SUBMIT), "--master", cluster.master_url, "--deploy-mode", "client",
               "--conf", "spark.cores.max=2", "--conf", "spark.executor.memory=512m",
               "--conf", "spark.executor.cores=1", "--conf", "spark.ui.enabled=false",
               "--conf", f"spark.pyspark.python={executor_python}",
               "--conf", f"spark.pyspark.driver.python={sys.executable}",
               "--conf", "spark.task.maxFailures=1", "--conf", "spark.sql.session.timeZone=UTC",
               *py_files, str(job), str(table), str(tmp_path / f"ckpt_{name}"), str(tmp_path / f"{name}.json")]
        return subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=600)

    with StandaloneCluster(tmp_path, workers=2) as cluster:
        shipped = submit(cluster, "shipped", package_zip(tmp_path / "py-files"))
        assert shipped.returncode == 0, shipped.stdout[-2000:] + shipped.stderr[-4000:]
        bare = submit(cluster, "bare", None)
    got = json.loads((tmp_path / "shipped.json").read_text())
    assert sorted((r["id"], r["v"], r["change"], r["version"]) for r in got) == expected
    assert sorted({r["batch"] for r in got}) == [0, 1, 2]  # one version per micro-batch
    # the control: the same job without the zip cannot run its Python on the executors
    assert bare.returncode != 0, "executors imported cdc_lake without the zip: the test proves nothing"
    out = bare.stdout + bare.stderr
    errors = "\n".join(ln for ln in out.splitlines() if "rror" in ln)[-4000:]
    assert "No module named 'cdc_lake'" in out, errors


@pytest.mark.slow  # the default tier's cluster test starts and stops the fixture too
def test_cluster_fixture_stops_everything(tmp_path):
    with StandaloneCluster(tmp_path, workers=1) as cluster:
        pids = [cluster.master.pid, cluster.workers[0].pid]  # type: ignore[union-attr]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_hook_puts_the_package_zip_on_the_driver_pythonpath_only_in_client_mode(monkeypatch):
    from cdc_lake.airflow.hook import CdcSparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLIENT_T", "spark://127.0.0.1:7077?deploy-mode=client")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER_T", "spark://127.0.0.1:7077?deploy-mode=cluster")
    monkeypatch.setenv("PYTHONPATH", "/already/there")
    client = CdcSparkSubmitHook(conn_id="spark_client_t", py_files="/z/cdc_lake.zip")
    client.driver_pythonpath = "/z/cdc_lake.zip"
    cmd = client._build_spark_submit_command("job.py")
    assert "--py-files" in cmd and client._env == {"PYTHONPATH": "/z/cdc_lake.zip:/already/there"}
    cluster = CdcSparkSubmitHook(conn_id="spark_cluster_t", py_files="/z/cdc_lake.zip")
    cluster.driver_pythonpath = "/z/cdc_lake.zip"
    cmd = cluster._build_spark_submit_command("job.py")
    assert "--py-files" in cmd and not cluster._env


@pytest.mark.slow  # its own cluster start + two enrichment runs: over the default tier's budget
def test_enrich_dag_task_on_a_standalone_cluster_equals_the_reference_model(tmp_path, monkeypatch):
    """The enrichment DAG's task, submitted by its operator through ``spark://`` (client mode),
    executors on a Python without cdc_lake: the change-feed source's ``read()`` and the joins run
    on the workers. Two runs (a dimension change, a late member and fact updates in between);
    after each, the outputs equal the independent plain-Python model (tests/enrich_reference.py)."""
    import yaml as yamllib
    from enrich_reference import EnrichModel
    from enrich_workload import model_config, write_commit, write_pipeline
    from test_enrich_crash import FIRST, THEN
    from test_enrich_properties import expected_vs_actual

    from cdc_lake.airflow.dag_factory import build_dag
    from cdc_lake.airflow.enrich_dags import ENRICH_TASK_ID
    from cdc_lake.config import load_pipeline

    mcfg = model_config()
    lake, out = tmp_path / "lake", tmp_path / "out"
    yaml = write_pipeline(tmp_path / "p.yaml", mcfg, lake, out, name="enrich_on_cluster")
    doc = yamllib.safe_load(yaml.read_text())
    doc["spark"] = {"conn_id": "spark_cluster_test", "conf": {
        "spark.cores.max": "2", "spark.executor.memory": "512m", "spark.executor.cores": "1",
        "spark.driver.memory": "1g", "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
        "spark.pyspark.python": str(python_without_package(tmp_path)),
        "spark.pyspark.driver.python": sys.executable}}
    yaml.write_text(yamllib.safe_dump(doc, sort_keys=False))
    model = EnrichModel(mcfg)
    for c in FIRST:
        write_commit(lake, c)
        model.apply(c)
    model.run()
    cfg = load_pipeline(yaml)
    monkeypatch.setenv("CDC_PY_FILES_DIR", str(tmp_path / "py-files"))
    with StandaloneCluster(tmp_path, workers=2) as cluster:
        for k, v in cluster_env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER_TEST", f"{cluster.master_url}?deploy-mode=client")
        for n in (1, 2):
            op = build_dag(cfg).task_dict[ENRICH_TASK_ID]
            context = {"params": {}, "run_id": f"e{n}"}
            op.render_template_fields(context)  # type: ignore[arg-type]
            summary = op.execute(context)  # type: ignore[arg-type]
            assert summary and summary["status"] == "succeeded", summary
            problems = expected_vs_actual(out, model, mcfg)
            assert not problems, f"after cluster run {n}:\n  " + "\n  ".join(problems)
            if n == 1:
                for c in THEN:
                    write_commit(lake, c)
                    model.apply(c)
                model.run()
        assert _executor_logs(cluster), "no executor ran on the cluster's workers"
