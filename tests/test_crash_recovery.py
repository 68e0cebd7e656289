"""Exactly once across driver deaths: the job process is really killed (SIGKILL) mid-run.

The job sends itself SIGKILL at a named point (``CDC_CRASH_AT``): after the offset log is written
and before any write (``batch_start``), after the quarantine/DDL writes, between two tables of
one micro-batch (``after_table:<t>``), and after all writes but before Spark's commit log
(``before_commit``). The slow tier also kills the process from outside at a random moment. Then
a normal run must converge to exactly the reference model's tables: no loss, no duplicates.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reference_model import (ReferenceModel, RefConfig, assert_no_diff, diff_scd2, diff_table,
                             read_delta_rows)

from cdc_lake.demo.generator import generate
from cdc_lake.demo.pipeline_yaml import write_pipeline_yaml

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "spark_jobs" / "cdc_ingest.py"


def _setup(tmp_path: Path, days: int = 1, seed: int = 11) -> Path:
    landing = tmp_path / "landing"
    generate(landing, "maxwell", days=days, seed=seed, lines_per_file=40)
    return write_pipeline_yaml(tmp_path / "p.yaml", "maxwell", name="crash", landing=landing,
                               lake_root=tmp_path / "lake", max_files_per_trigger=3,
                               scd={"orders": 2})


def _run(yaml: Path, crash: str | None = None, timeout: int = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("CDC_CRASH_AT", None)
    if crash:
        env["CDC_CRASH_AT"] = crash
    return subprocess.run([sys.executable, str(JOB), "--pipeline", str(yaml), "--run-id",
                           f"r{time.time_ns()}"], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _assert_converged(yaml: Path, tmp_path: Path) -> None:
    cfg = RefConfig.from_yaml(yaml)
    model = ReferenceModel(cfg)
    for f in sorted((tmp_path / "landing").glob("*.json")):
        model.add_file(f)
    for name, spec in cfg.tables.items():
        rows = read_delta_rows(tmp_path / "lake" / name)
        keys = spec.keys or ("id",)
        if spec.scd == 2:
            assert_no_diff(diff_scd2(model.scd2(name), rows, keys, table=name))
        else:
            assert_no_diff(diff_table(model.scd1(name), rows, keys, table=name))
    q = read_delta_rows(tmp_path / "lake" / "_quarantine")
    pairs = [(r["source_file"], r["raw_line"]) for r in q]
    assert len(pairs) == len(set(pairs)), "quarantine has duplicates after the crash"


@pytest.mark.parametrize("point", ["after_table:customers", "before_commit"])
def test_kill_then_rerun_converges(tmp_path, point):
    yaml = _setup(tmp_path)
    crashed = _run(yaml, crash=point)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout[-2000:] + crashed.stderr[-3000:]
    cp = tmp_path / "lake" / "_checkpoints" / "crash"
    offsets = {p.name for p in (cp / "offsets").iterdir() if p.name.isdigit()}
    commits = {p.name for p in (cp / "commits").iterdir() if p.name.isdigit()} \
        if (cp / "commits").is_dir() else set()
    assert offsets - commits, "the kill should leave a batch planned (offset log) but not committed"
    done = _run(yaml)
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_converged(yaml, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["batch_start", "after_side_tables", "after_table:order_items"])
def test_kill_at_other_points(tmp_path, point):
    yaml = _setup(tmp_path)
    assert _run(yaml, crash=point).returncode == -signal.SIGKILL
    assert _run(yaml).returncode == 0
    _assert_converged(yaml, tmp_path)


@pytest.mark.slow
def test_external_kill_at_random_moments(tmp_path):
    yaml = _setup(tmp_path, days=2)
    rnd = random.Random(5)
    for _ in range(3):
        env = {**os.environ}
        env.pop("CDC_CRASH_AT", None)
        proc = subprocess.Popen([sys.executable, str(JOB), "--pipeline", str(yaml)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rnd.uniform(8, 20))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _run(yaml).returncode == 0
    _assert_converged(yaml, tmp_path)


def test_rebuilt_checkpoint_does_not_skip_new_batches(tmp_path):
    """Delete the checkpoint (batch ids restart at 0), add new files: they must be applied."""
    landing = tmp_path / "landing"
    generate(landing, "maxwell", days=1, seed=3, lines_per_file=60)
    yaml = write_pipeline_yaml(tmp_path / "p.yaml", "maxwell", name="rebuild", landing=landing,
                               lake_root=tmp_path / "lake")
    assert _run(yaml).returncode == 0
    shutil.rmtree(tmp_path / "lake" / "_checkpoints")
    generate(landing, "maxwell", days=1, seed=3, start_day=1, lines_per_file=60)
    r = _run(yaml)
    assert r.returncode == 0, r.stderr[-3000:]
    _assert_converged(yaml, tmp_path)
