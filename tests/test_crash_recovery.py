"""Exactly once across driver deaths: the job process is really killed (SIGKILL) mid-run.

The job sends itself SIGKILL at a named point (``CDC_CRASH_AT``, see ``cdc_lake.cdc.batch_writer``):
after the offset log is written and before any write (``batch_start``), after the quarantine /
DDL-log appends (``after_side_tables``), between two tables of one micro-batch
(``after_table:<t>``), and after all writes but before Spark's commit log (``before_commit``).

These tests must be able to fail: every input holds bad lines (malformed JSON, a missing key, a
value that does not cast) and DDL, so the only non-idempotent writes — the quarantine and DDL-log
appends — are checked for EXACT row counts after each replay, and the finishing run's summary
must report the replayed batch as ``skipped_batches`` for every table it had already written.
(Disable the transaction-id check — ``Engine.already_committed`` returning False — and the
default-tier chain below goes red: quarantine rows are appended twice and nothing is skipped.)
Tables are compared with the independent reference model (``tests/reference_model.py``).
The random-moment kills live in the chaos harness (``tests/chaos``, ``tests/test_chaos.py``).
"""

from __future__ import annotations

import json
import os
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
TS0 = 1795000000

YAML = """pipeline: crash
source: {{format: maxwell, path: {landing}, database: shop, max_files_per_trigger: 1}}
storage: {{root: {lake}}}
engine: {{name: deltalake}}
tables:
  customers: {{keys: [id], scd: 2}}
  orders: {{keys: [id], types: {{amount: "decimal(10,2)"}}}}
"""


def mx(i: int, table: str, typ: str = "insert", old: dict | None = None, **data: object) -> str:
    """One Maxwell line at binlog offset ``i``."""
    msg = {"database": "shop", "table": table, "type": typ, "ts": TS0 + i, "xid": 500 + i,
           "xoffset": 0, "position": f"mysql-bin.000001:{1000 + i}", "commit": True,
           "primary_key_columns": ["id"], "data": data}
    if old is not None:
        msg["old"] = old
    return json.dumps(msg, ensure_ascii=False)


def ddl(i: int, sql: str) -> str:
    return json.dumps({"database": "shop", "table": "orders", "type": "table-alter",
                       "ts": TS0 + i, "position": f"mysql-bin.000001:{1000 + i}", "sql": sql})


def bad(i: int) -> list[str]:
    """Three lines the job must quarantine: malformed JSON, no key, an uncastable amount."""
    return [mx(i, "orders", id=90 + i, amount="1.00")[:40],
            mx(i + 1, "orders", amount="2.00", status="no key"),
            mx(i + 2, "orders", id=95 + i, amount="not a number")]


FILES = {
    # batch 0: both tables, 3 bad lines, 1 DDL
    "maxwell-000001.json": [
        mx(1, "customers", id=1, name="Zoë", city="Berlin"),
        mx(2, "customers", id=2, name="Bo", city=None),
        mx(3, "orders", id=10, customer_id=1, amount="10.50", status="new"),
        *bad(4),
        ddl(7, "ALTER TABLE orders ADD COLUMN note varchar(20)"),
        mx(8, "orders", id=11, customer_id=2, amount="3.00", status="new", note="東京"),
    ],
    # batch 1: updates, a delete, a primary-key change, 3 bad lines, 1 DDL
    "maxwell-000002.json": [
        mx(20, "customers", "update", old={"city": "Berlin"}, id=1, name="Zoë", city="Köln"),
        mx(21, "orders", "update", old={"status": "new"}, id=10, customer_id=1, amount="10.50",
           status="paid"),
        mx(22, "customers", "delete", id=2, name="Bo", city=None),
        mx(23, "orders", "update", old={"id": 11}, id=12, customer_id=2, amount="3.00",
           status="new", note="東京"),
        *bad(24),
        ddl(27, "ALTER TABLE orders DROP COLUMN note"),
    ],
}
BAD_PER_FILE, DDL_PER_FILE = 3, 1


def _run(yaml: Path, crash: str | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("CDC_CRASH_AT", None)
    if crash:
        env["CDC_CRASH_AT"] = crash
    return subprocess.run([sys.executable, str(JOB), "--pipeline", str(yaml), "--run-id",
                           f"r{time.time_ns()}"], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _summary(cp: subprocess.CompletedProcess) -> dict:
    line = [ln for ln in cp.stdout.splitlines() if ln.startswith("CDC_RUN_SUMMARY ")]
    assert line, cp.stdout[-2000:] + cp.stderr[-3000:]
    return json.loads(line[-1].split(" ", 1)[1])


def _killed(cp: subprocess.CompletedProcess, point: str) -> None:
    assert cp.returncode == -signal.SIGKILL, (
        f"expected SIGKILL at {point}, exit {cp.returncode}\n{cp.stdout[-2000:]}{cp.stderr[-3000:]}")
    assert f"SIGKILL at {point}" in cp.stdout


def _counts(lake: Path) -> tuple[int, int]:
    return (len(read_delta_rows(lake / "_quarantine")), len(read_delta_rows(lake / "_ddl_log")))


def _version(table: Path) -> int:
    from deltalake import DeltaTable

    return DeltaTable(str(table)).version()


def _pending(lake: Path, name: str) -> set[str]:
    cp = lake / "_checkpoints" / name
    offsets = {p.name for p in (cp / "offsets").iterdir() if p.name.isdigit()}
    commits = {p.name for p in (cp / "commits").iterdir() if p.name.isdigit()} \
        if (cp / "commits").is_dir() else set()
    return offsets - commits


def _assert_converged(yaml: Path, landing: Path, lake: Path) -> ReferenceModel:
    cfg = RefConfig.from_yaml(yaml)
    model = ReferenceModel(cfg)
    for f in sorted(landing.glob("*.json")):
        model.add_file(f)
    for name, spec in cfg.tables.items():
        rows = read_delta_rows(lake / name)
        keys = spec.keys or ("id",)
        if spec.scd == 2:
            assert_no_diff(diff_scd2(model.scd2(name), rows, keys, table=name))
        else:
            assert_no_diff(diff_table(model.scd1(name), rows, keys, table=name))
    q = sorted((Path(r["source_file"]).name, r["raw_line"].strip())
               for r in read_delta_rows(lake / "_quarantine"))
    assert q == sorted((Path(x.source_file).name, x.raw_line.strip()) for x in model.quarantine)
    d = sorted((Path(r["source_file"]).name, r["sql"]) for r in read_delta_rows(lake / "_ddl_log"))
    assert d == sorted((Path(x.source_file).name, x.sql) for x in model.ddl)
    return model


def _story(tmp_path: Path) -> tuple[Path, Path, Path]:
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    for name, lines in FILES.items():
        (landing / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    yaml = tmp_path / "p.yaml"
    yaml.write_text(YAML.format(landing=landing, lake=lake), encoding="utf-8")
    return yaml, landing, lake


def test_every_kill_point_replays_exactly_once(tmp_path):
    """Batch 0 is killed at every named point in turn (each run replays it), then a normal run
    finishes: exact quarantine / DDL-log counts after every step, ``skipped_batches`` = 1."""
    yaml, landing, lake = _story(tmp_path)
    _killed(_run(yaml, "batch_start"), "batch_start")
    assert _pending(lake, "crash") == {"0"}
    assert _counts(lake) == (0, 0)

    _killed(_run(yaml, "after_side_tables"), "after_side_tables")
    assert _counts(lake) == (BAD_PER_FILE, DDL_PER_FILE), "batch 0's side rows, once"
    assert not read_delta_rows(lake / "customers") and not read_delta_rows(lake / "orders")

    _killed(_run(yaml, "after_table:customers"), "after_table:customers")   # between tables
    assert _counts(lake) == (BAD_PER_FILE, DDL_PER_FILE), "replay appended side rows again"
    assert read_delta_rows(lake / "customers") and not read_delta_rows(lake / "orders")
    customers_version = _version(lake / "customers")

    _killed(_run(yaml, "before_commit"), "before_commit")   # offset log written, commit not
    assert _counts(lake) == (BAD_PER_FILE, DDL_PER_FILE), "replay appended side rows again"
    assert _version(lake / "customers") == customers_version, "a skipped write must not commit"
    assert _pending(lake, "crash") == {"0"}

    done = _run(yaml)
    assert done.returncode == 0, done.stderr[-3000:]
    s = _summary(done)
    assert s["batch_ids"] == [0, 1], s
    assert {t: v["skipped_batches"] for t, v in s["tables"].items()} == \
        {"customers": 1, "orders": 1}, s["tables"]
    assert s["quarantined"] == BAD_PER_FILE and s["ddl_events"] == DDL_PER_FILE, s
    assert _counts(lake) == (2 * BAD_PER_FILE, 2 * DDL_PER_FILE)
    model = _assert_converged(yaml, landing, lake)
    assert len(model.quarantine) == 2 * BAD_PER_FILE and len(model.ddl) == 2 * DDL_PER_FILE


# ------------------------------------------------------------------------------ slow tier


def _setup_generated(tmp_path: Path, days: int = 1, seed: int = 11) -> Path:
    landing = tmp_path / "landing"
    generate(landing, "maxwell", days=days, seed=seed, lines_per_file=40)
    for i, name in enumerate(sorted(p.name for p in landing.glob("*.json"))[:3]):
        with (landing / name).open("a", encoding="utf-8") as f:   # bad lines in every scenario
            f.write("\n".join(bad(900 + 10 * i)) + "\n")
    return write_pipeline_yaml(tmp_path / "p.yaml", "maxwell", name="crash", landing=landing,
                               lake_root=tmp_path / "lake", max_files_per_trigger=3,
                               scd={"orders": 2})


@pytest.mark.slow
@pytest.mark.parametrize("point", ["batch_start", "after_side_tables", "after_table:customers",
                                   "after_table:order_items", "before_commit"])
def test_kill_at_each_point_generated_shop(tmp_path, point):
    yaml = _setup_generated(tmp_path)
    crashed = _run(yaml, crash=point)
    _killed(crashed, point)
    assert _pending(tmp_path / "lake", "crash")
    done = _run(yaml)
    assert done.returncode == 0, done.stderr[-3000:]
    s = _summary(done)
    written_before_kill = {"batch_start": set(), "after_side_tables": set(),
                           "after_table:customers": {"customers"},
                           "before_commit": set(s["tables"])}.get(point)
    if written_before_kill is not None:
        skipped = {t for t, v in s["tables"].items() if v["skipped_batches"]}
        assert skipped <= written_before_kill, s["tables"]
    _assert_converged(yaml, tmp_path / "landing", tmp_path / "lake")


def test_rebuilt_checkpoint_does_not_skip_new_batches(spark, tmp_path):
    """Delete the checkpoint (batch ids restart at 0), add new files: they must be applied.
    (In-process runs: what is under test is the transaction-id scheme, not the process.)"""
    from cdc_lake.cdc.job import run_pipeline
    from cdc_lake.config import load_pipeline

    landing = tmp_path / "landing"
    generate(landing, "maxwell", days=1, seed=3, lines_per_file=60)
    yaml = write_pipeline_yaml(tmp_path / "p.yaml", "maxwell", name="rebuild", landing=landing,
                               lake_root=tmp_path / "lake")
    run_pipeline(load_pipeline(yaml), spark=spark, run_id="before")
    shutil.rmtree(tmp_path / "lake" / "_checkpoints")
    generate(landing, "maxwell", days=1, seed=3, start_day=1, lines_per_file=60)
    s = run_pipeline(load_pipeline(yaml), spark=spark, run_id="after")
    assert s["batch_ids"][0] == 0, s  # the rebuilt checkpoint starts again at batch 0
    cfg = RefConfig.from_yaml(yaml)
    model = ReferenceModel(cfg)
    for f in sorted(landing.glob("*.json")):
        model.add_file(f)
    for name, spec in cfg.tables.items():
        assert_no_diff(diff_table(model.scd1(name), read_delta_rows(tmp_path / "lake" / name),
                                  spec.keys or ("id",), table=name))
