"""The CDC job on a real Spark standalone cluster (master + 2 workers on 127.0.0.1), client mode.

local[*] hides whatever must reach executors; here the landing files are read and parsed by
executor JVMs of separate worker processes. Truth is the plain-Python reference model, as for
local runs. The slow tier also SIGKILLs a worker mid-run: Spark reschedules its tasks on the other
worker, the run completes and the tables converge.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from reference_model import (ReferenceModel, RefConfig, assert_no_diff, diff_scd2, diff_table,
                             read_delta_rows)
from spark_cluster import SPARK_SUBMIT, StandaloneCluster, cluster_env

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


def test_cdc_job_on_a_standalone_cluster_equals_the_reference(tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    generate(landing, "maxwell", days=1, seed=21, lines_per_file=80)
    yaml = write_pipeline_yaml(tmp_path / "p.yaml", "maxwell", name="on_cluster", landing=landing,
                               lake_root=lake, max_files_per_trigger=4, scd={"customers": 2})
    with StandaloneCluster(tmp_path, workers=2) as cluster:
        r = _submit(cluster, yaml, "c1")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
        apps = cluster.state().get("completedapps", []) + cluster.state().get("activeapps", [])
        assert any(a.get("name") == "cdc-on_cluster" for a in apps), apps  # the job's appName
        # The executors really ran on the workers (client mode: the driver is this machine's
        # spark-submit process; tasks ran in the workers' executor JVMs).
        assert _executor_logs(cluster), "no executor ran on the cluster's workers"
    assert "CDC_RUN_SUMMARY" in r.stdout
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


def test_cluster_fixture_stops_everything(tmp_path):
    with StandaloneCluster(tmp_path, workers=1) as cluster:
        pids = [cluster.master.pid, cluster.workers[0].pid]  # type: ignore[union-attr]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
