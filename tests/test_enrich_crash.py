"""Exactly once for the enrichment job's multi-table writes: the job process is really SIGKILLed.

``spark_jobs/enrich.py`` kills itself (``CDC_CRASH_AT``) at every fault-injection point of one
micro-batch — ``enrich:batch_start``, ``enrich:after:<table>`` after each table it writes
(enriched, pending, aggregate:<name>, quarantine, manifest) and ``enrich:before_commit`` (all
writes done, Spark's commit log not) — and a rerun without the kill must leave exactly the
tables the independent reference model (``tests/enrich_reference.py``) computes for an
uninterrupted history. The crashed batch is batch 1, not batch 0, so the enriched table already
holds rows whose aggregate contribution the replayed batch has to withdraw exactly once.

- ``test_kill_at_every_point_then_rerun_matches_model``: one process sequence walks the points in
  write order; each killed run replays the same batch (the earlier tables are skipped by their
  transaction ids, one more table is written), then a clean run finishes.
- ``test_aggregate_not_double_counted_on_replay``: killed right after the aggregate write; the
  replay must skip the aggregate (its Delta version does not move) and the counts/sums equal the
  model — the bug the issue names specifically.
All in the slow tier (``CDC_SLOW=1``; 2-4 job processes of ~45 s each): the default tier's
``tests/test_enrich_job.py::test_replayed_batch_changes_nothing_and_crash_between_writes_never_double_counts``
crashes a batch between two table writes in-process and replays it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from enrich_reference import Commit, EnrichModel
from enrich_workload import AGG, MERGE_ON, model_config, random_history, write_commit, write_pipeline
from reference_model import read_delta_rows
from test_enrich_properties import expected_vs_actual, new_seed

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "spark_jobs" / "enrich.py"
POINTS = ["enrich:batch_start", "enrich:after:enriched", "enrich:after:pending",
          f"enrich:after:aggregate:{AGG}", "enrich:after:quarantine", "enrich:after:manifest",
          "enrich:before_commit"]

pytestmark = pytest.mark.skipif(not JOB.exists(), reason=f"{JOB} missing: enrichment kill tests did NOT run")


def _ts(day: int, hour: int = 0) -> Any:
    from datetime import UTC, datetime
    return datetime(2026, 1, day, hour, tzinfo=UTC)


def _c(table: str, upserts=(), deletes=(), create=False) -> Commit:  # type: ignore[no-untyped-def]
    return Commit(table, MERGE_ON[table], tuple(upserts), tuple(deletes), create)


def _item(o: int, n: int, p: int, qty: int, price: int) -> dict[str, int]:
    return {"order_id": o, "line_no": n, "product_id": p, "qty": qty, "unit_price": price}


FIRST = [  # dims + fact version 0: batch 0 enriches two lines and parks two
    _c("orders", [{"id": 1, "status": "new", "customer_id": 7, "created_at": _ts(2, 10)},
                  {"id": 2, "status": "paid", "customer_id": 8, "created_at": _ts(3, 5)}], create=True),
    _c("products", [{"id": 10, "name": "widget"}, {"id": 11, "name": "gadget"}], create=True),
    _c("categories", [{"product_id": 10, "category": "A"}, {"product_id": 11, "category": "B"}], create=True),
    _c("customers", [{"id": 7, "city": "Oslo", "_valid_from": _ts(1), "_valid_to": None, "_is_current": True},
                     {"id": 8, "city": "Kyiv", "_valid_from": _ts(4), "_valid_to": None, "_is_current": True}],
       create=True),
    _c("order_items", [_item(1, 1, 10, 2, 5), _item(1, 2, 11, 1, 7), _item(2, 1, 10, 3, 4),
                       _item(3, 1, 11, 1, 1)], create=True),
]
THEN = [  # batch 1 (the one killed): group move A -> B, a new line, a member arriving late;
    _c("orders", [{"id": 3, "status": "new", "customer_id": 7, "created_at": _ts(1, 12)}]),
    _c("categories", [{"product_id": 10, "category": "C"}]),      # SCD1 change after enrichment
    _c("order_items", [_item(1, 1, 11, 4, 5), _item(1, 3, 10, 1, 1)]),
    _c("order_items", deletes=[_item(1, 2, 11, 1, 7)]),          # batch 2
]


def _run(yaml: Path, crash: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("CDC_CRASH_AT", None)
    if crash:
        env["CDC_CRASH_AT"] = crash
    p = subprocess.run([sys.executable, str(JOB), "--pipeline", str(yaml), "--run-id", f"r{time.time_ns()}"],
                       env=env, capture_output=True, text=True, timeout=900)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("ENRICH_RUN_SUMMARY ")), None)
    return p, (json.loads(line.split(" ", 1)[1]) if line else {})


def _tail(p: subprocess.CompletedProcess) -> str:
    return f"\n--- stdout ---\n{p.stdout[-2000:]}\n--- stderr ---\n{p.stderr[-3000:]}"


def _setup(tmp_path: Path, *, wait_zero: bool = True) -> tuple[Path, Path, EnrichModel]:
    cfg = model_config(wait_zero=wait_zero)
    lake, out = tmp_path / "lake", tmp_path / "out"
    yaml = write_pipeline(tmp_path / "p.yaml", cfg, lake, out, name="enrich_crash")
    model = EnrichModel(cfg)
    for c in FIRST:
        write_commit(lake, c)
        model.apply(c)
    return yaml, out, model


def _first_run_then_more(tmp_path: Path, spark=None) -> tuple[Path, Path, EnrichModel]:  # type: ignore[no-untyped-def]
    """The first run (batch 0): a job process, or in this test process when ``spark`` is given
    (one JVM start less; the checkpoint it leaves is the same)."""
    yaml, out, model = _setup(tmp_path)
    if spark is None:
        p, summary = _run(yaml)
        assert p.returncode == 0, _tail(p)
    else:
        from cdc_lake.config import load_pipeline
        from cdc_lake.enrich.job import run_enrich

        run_enrich(load_pipeline(yaml), spark=spark, run_id="first")
    model.run()
    assert not expected_vs_actual(out, model, model.cfg), expected_vs_actual(out, model, model.cfg)
    for c in THEN:
        write_commit(tmp_path / "lake", c)
        model.apply(c)
    model.run()            # the truth: an uninterrupted run over batches 1 and 2
    return yaml, out, model


def _agg_state(out: Path) -> tuple[int, set]:
    from deltalake import DeltaTable
    rows = read_delta_rows(out / AGG)
    return DeltaTable(str(out / AGG)).version(), {tuple(sorted(r.items())) for r in rows}


def _assert_matches_model(out: Path, model: EnrichModel) -> None:
    problems = expected_vs_actual(out, model, model.cfg)
    assert not problems, "after kill + rerun:\n  " + "\n  ".join(problems)
    agg = read_delta_rows(out / AGG)
    assert sum(r["count"] for r in agg) == len(read_delta_rows(out / "enriched")), \
        "aggregate line count != enriched rows: double counted (or lost) on replay"


def _assert_killed(p: subprocess.CompletedProcess, point: str) -> None:
    assert p.returncode == -signal.SIGKILL, f"expected SIGKILL at {point}, got exit {p.returncode}" + _tail(p)
    assert f"SIGKILL at {point}" in p.stdout, f"killed, but not at {point}" + _tail(p)


@pytest.mark.slow  # 9 job processes (~90 s on an idle 2-core box); see the module docstring
def test_kill_at_every_point_then_rerun_matches_model(tmp_path):
    yaml, out, model = _first_run_then_more(tmp_path)
    agg_after_write = None
    for point in POINTS:
        p, _ = _run(yaml, crash=point)
        _assert_killed(p, point)
        if agg_after_write is not None:  # later replays must not touch the aggregate again
            assert _agg_state(out) == agg_after_write, \
                f"replay of the batch killed at {point} rewrote the aggregate (double count)"
        if point.startswith("enrich:after:aggregate"):
            agg_after_write = _agg_state(out)
    p, summary = _run(yaml)
    assert p.returncode == 0, _tail(p)
    assert summary.get("skipped_writes", 0) >= 3, summary      # batch 1 replayed: its tables skipped
    _assert_matches_model(out, model)


@pytest.mark.slow  # CI budget: the default tier replays a crashed batch in-process
def test_aggregate_not_double_counted_on_replay(spark, tmp_path):  # (test_enrich_job.py)
    yaml, out, model = _first_run_then_more(tmp_path, spark)
    point = f"enrich:after:aggregate:{AGG}"
    p, _ = _run(yaml, crash=point)
    _assert_killed(p, point)
    written = _agg_state(out)
    p, summary = _run(yaml)
    assert p.returncode == 0, _tail(p)
    assert summary.get("skipped_writes", 0) >= 1, summary
    _assert_matches_model(out, model)
    from deltalake import DeltaTable
    hist = DeltaTable(str(out / AGG)).history()
    # batch 1 wrote the aggregate once (before the kill); the rerun wrote only batch 2
    assert DeltaTable(str(out / AGG)).version() <= written[0] + 1, hist


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_kill_at_point_on_random_history(tmp_path, point):
    seed = new_seed()
    rng = random.Random(seed)
    hist = random_history(rng, steps=10, run_prob=0.25, seed=seed)
    cfg = model_config(wait_zero=rng.random() < 0.5)
    lake, out = tmp_path / "lake", tmp_path / "out"
    yaml = write_pipeline(tmp_path / "p.yaml", cfg, lake, out, name="enrich_crash")
    model = EnrichModel(cfg)
    runs = sorted(hist.runs)
    kill_at = runs[rng.randrange(len(runs))]
    for i, c in enumerate(hist.commits):
        write_commit(lake, c)
        model.apply(c)
        if i not in hist.runs:
            continue
        if i == kill_at:
            p, _ = _run(yaml, crash=point)
            assert p.returncode in (-signal.SIGKILL, 0), _tail(p)   # 0: the run had no batch
        p, _ = _run(yaml)
        assert p.returncode == 0, _tail(p)
        model.run()
        problems = expected_vs_actual(out, model, cfg)
        assert not problems, (f"CDC_SEED={seed} kill at {point} in run after #{kill_at}:\n  "
                              + "\n  ".join(problems) + "\n" + hist.describe())


@pytest.mark.slow  # 3 job processes per point; the default tier kills a pass in-process
@pytest.mark.parametrize("point", POINTS)
def test_kill_a_rejoin_pass_at_point_then_rerun_matches_model(tmp_path, point):
    """A run without fact changes whose re-join pass (order 3 arrives: its parked line is
    released) is SIGKILLed at ``point``; the rerun finishes the pass before anything else and
    the tables equal the model's uninterrupted history."""
    yaml, out, model = _setup(tmp_path, wait_zero=False)
    p, _ = _run(yaml)
    assert p.returncode == 0, _tail(p)
    model.run()
    arrives = _c("orders", [{"id": 3, "status": "new", "customer_id": 7, "created_at": _ts(1, 12)}])
    write_commit(tmp_path / "lake", arrives)
    model.apply(arrives)
    assert model.run().released == 1 and len(model.passes) == 1
    p, _ = _run(yaml, crash=point)
    _assert_killed(p, point)
    p, summary = _run(yaml)
    assert p.returncode == 0, _tail(p)
    assert summary["rejoin"] is not None or point == "enrich:before_commit", summary
    _assert_matches_model(out, model)
