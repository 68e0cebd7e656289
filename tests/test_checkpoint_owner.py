"""A checkpoint belongs to one pipeline (tester, 2026-11-28): a second pipeline configured with
another's checkpoint used to stop with "table missing" advice whose full refresh then went on
to read and commit the owner's offsets and overwrite its table records; the owner's later
runs found "nothing new" and its tables lacked the new files for good (exit 0 everywhere).
Now the second pipeline stops before reading or writing anything, naming the owner, and the
owner goes on exactly. Truth: the rows the landed events carry (``job_helpers.rows``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from job_helpers import event, land, pipeline, rows

from cdc_lake.cdc.job import run_pipeline
from cdc_lake.checkpoint import OWNER_FILE, CheckpointOfAnotherPipeline, claim_checkpoint

JOB = Path(__file__).resolve().parents[1] / "spark_jobs" / "cdc_ingest.py"


def _intruder(tmp_path: Path, checkpoint: Path):  # type: ignore[no-untyped-def]
    d = tmp_path / "b"
    d.mkdir()
    return pipeline(d, name="intruder", root=f"lake_b, checkpoint: {checkpoint}")


def test_a_second_pipeline_on_a_checkpoint_stops_before_touching_it_and_the_owner_goes_on(spark, tmp_path):
    owner = pipeline(tmp_path, name="owner")
    land(owner.landing_path, "a.json", *(event(i) for i in range(1, 4)))
    run_pipeline(owner, spark=spark, run_id="r1")
    cp = owner.checkpoint_path
    before = sorted(str(p.relative_to(cp)) + str(p.stat().st_mtime_ns) for p in cp.rglob("*") if p.is_file())

    other = _intruder(tmp_path, cp)
    land(other.landing_path, "x.json", *(event(i) for i in range(50, 53)))
    for full_refresh in (False, True):  # the incremental run and the full refresh alike
        with pytest.raises(CheckpointOfAnotherPipeline) as e:
            run_pipeline(other, spark=spark, run_id="b", full_refresh=full_refresh,
                         tables=["orders"] if full_refresh else None)
        msg = str(e.value)
        assert f"belongs to the cdc pipeline 'owner' ({owner.file})" in msg, msg
        assert "'intruder'" in msg and "storage.checkpoint" in msg, msg
    assert not other.tables["orders"].path.exists(), "nothing written for the intruder"
    after = sorted(str(p.relative_to(cp)) + str(p.stat().st_mtime_ns) for p in cp.rglob("*") if p.is_file()
                   if p.name != "cdc.lock")
    assert [x for x in before if not x.startswith("cdc.lock")] == after, "the checkpoint was touched"
    # the CLI: exit 3, the operator's message
    r = subprocess.run([sys.executable, str(JOB), "--pipeline", str(other.file), "--run-id", "cli"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 3 and "belongs to the cdc pipeline 'owner'" in r.stderr, r.stderr[-2000:]

    land(owner.landing_path, "b.json", *(event(i) for i in range(4, 6)))
    run_pipeline(owner, spark=spark, run_id="r2")
    assert rows(owner.tables["orders"].path) == {i: f"s{i}" for i in range(1, 6)}
    assert json.loads((cp / OWNER_FILE).read_text())["pipeline"] == "owner"


def test_a_checkpoint_from_before_owners_is_adopted_unless_it_recorded_other_tables(spark, tmp_path):
    owner = pipeline(tmp_path, name="owner")
    land(owner.landing_path, "a.json", event(1), event(7, "customers"))
    run_pipeline(owner, spark=spark, run_id="r1")
    cp = owner.checkpoint_path
    (cp / OWNER_FILE).unlink()  # as an earlier release left it

    with pytest.raises(CheckpointOfAnotherPipeline) as e:  # its recorded tables are elsewhere
        run_pipeline(_intruder(tmp_path, cp), spark=spark, run_id="b")
    assert f"'orders' at {owner.tables['orders'].path}" in str(e.value), str(e.value)
    assert not (cp / OWNER_FILE).exists()

    land(owner.landing_path, "b.json", event(2))
    run_pipeline(owner, spark=spark, run_id="r2")  # adopted by the pipeline whose tables it holds
    assert json.loads((cp / OWNER_FILE).read_text())["pipeline"] == "owner"
    assert rows(owner.tables["orders"].path) == {1: "s1", 2: "s2"}


def test_enrichment_and_dimension_jobs_claim_their_checkpoints_too(spark, tmp_path, monkeypatch):
    """The enrichment job stops before its Spark session (none is built); the dimension refresh
    before it reads the state file or the table."""
    from cdc_lake.config import load_pipeline
    from cdc_lake.dimensions.refresh import run_refresh
    from cdc_lake.enrich.job import run_enrich

    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path))  # every path of the example YAMLs in here
    repo = Path(__file__).resolve().parents[1]
    runs = {"shop_order_lines": lambda c: run_enrich(c, run_id="t"),
            "product_categories": lambda c: run_refresh(c, date="2026-01-01", spark=spark, run_id="t")}
    for name, run in runs.items():
        cfg = load_pipeline(repo / "pipelines" / f"{name}.yaml")
        assert str(cfg.checkpoint_path).startswith(str(tmp_path)), cfg.checkpoint_path
        claim_checkpoint(cfg.checkpoint_path, "someone_else", "cdc", "/elsewhere/p.yaml")
        with pytest.raises(CheckpointOfAnotherPipeline) as e:
            run(cfg)
        assert "belongs to the cdc pipeline 'someone_else' (/elsewhere/p.yaml)" in str(e.value)
        assert f"pipeline {name!r} ({cfg.file})" in str(e.value), str(e.value)
