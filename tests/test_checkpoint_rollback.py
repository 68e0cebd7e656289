"""A checkpoint set back behind the tables it wrote, and unreadable files of ours in it, stop the
run (exit 3) naming the checkpoint/file, the table and the recovery; the recovery converges.

Every write carries the Delta transaction id ``(app_id, batch_id)``. A checkpoint whose last
batches were removed (or an older copy restored, or Spark's subfolders deleted while
``cdc_instance.json`` stayed) hands new files batch ids the tables already hold: every write of
theirs was skipped as "already committed" and their rows were lost for good, exit 0. The truth
here is written by hand: every event landed, in binlog order (ids are keys, later lines win).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from job_helpers import event, land, moved_aside, pipeline, rows, run_cli

from cdc_lake.cdc.job import run_pipeline
from cdc_lake.cdc.state import CheckpointRolledBack
from cdc_lake.checkpoint import StateFileDamaged




def _quarantined(cfg) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    from deltalake import DeltaTable

    t = DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table(columns=["source_file", "raw_line"])
    return sorted((Path(f).name, line) for f, line in zip(*t.to_pydict().values()))


def _drop_last_batch(cp: Path, n: int) -> None:
    """What an operator removing the last batch by hand leaves (with the checksums)."""
    for f in (cp / "offsets" / str(n), cp / "commits" / str(n), cp / "sources" / "0" / str(n)):
        f.unlink()
        f.with_name(f".{f.name}.crc").unlink(missing_ok=True)


def test_a_checkpoint_set_back_stops_the_run_and_moving_it_aside_converges(spark, tmp_path):
    cfg = pipeline(tmp_path)
    cp, orders, customers = cfg.checkpoint_path, cfg.tables["orders"].path, cfg.tables["customers"].path
    land(cfg.landing_path, "a.json", event(1), event(2), event(9, "customers"))
    land(cfg.landing_path, "b.json", event(12, typ="update", id=2, status="paid"), "{bad b")
    run_pipeline(cfg, spark=spark, run_id="r1", max_files_per_trigger=1)  # batches 0 and 1
    _drop_last_batch(cp, 1)  # the checkpoint now ends at batch 0; the tables hold batch 1
    land(cfg.landing_path, "c.json", event(3), event(13, typ="delete", id=1), "{bad c")

    with pytest.raises(CheckpointRolledBack) as e:
        run_pipeline(cfg, spark=spark, run_id="r2")
    msg = str(e.value)
    assert f"checkpoint {cp} was set back" in msg and f"ends at batch 0 ({cp}/offsets/0)" in msg, msg
    assert f"table 'orders' at {orders} holds batch 1" in msg and "quarantine table" in msg, msg
    assert re.search(moved_aside(cp, f" && spark-submit spark_jobs/cdc_ingest.py --pipeline {cfg.file}"), msg), msg
    assert rows(orders) == {1: "s1", 2: "paid"}, "nothing may be written before the operator acts"
    r = run_cli(spark, cfg.file)  # the CLI says the same and exits 3 (before Spark starts)
    assert r.returncode == 3 and "NEEDS RECOVERY" in r.stderr and str(orders) in r.stderr, r.stderr

    shutil.move(str(cp), f"{cp}.damaged")  # the recovery the message names
    run_pipeline(cfg, spark=spark, run_id="r3")
    assert rows(orders) == {2: "paid", 3: "s3"} and rows(customers) == {9: "s9"}
    assert _quarantined(cfg) == [("b.json", "{bad b"), ("c.json", "{bad c")]

    # The other way to set it back: Spark's subfolders deleted, our files (the id) kept.
    for sub in ("offsets", "commits", "sources", "metadata", ".metadata.crc"):
        p = cp / sub
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    land(cfg.landing_path, "d.json", event(4, "customers"), event(14, typ="update", id=3, status="x"))
    with pytest.raises(CheckpointRolledBack) as e:
        run_pipeline(cfg, spark=spark, run_id="r4")
    assert f"its offset log holds no batch ({cp}/offsets is missing)" in str(e.value), str(e.value)
    assert f"table 'orders' at {orders} holds batch 0" in str(e.value), str(e.value)
    shutil.rmtree(f"{cp}.damaged")
    shutil.move(str(cp), f"{cp}.damaged")
    s = run_pipeline(cfg, spark=spark, run_id="r5")
    assert s["status"] == "succeeded"
    assert rows(orders) == {2: "paid", 3: "x"} and rows(customers) == {4: "s4", 9: "s9"}
    assert _quarantined(cfg) == [("b.json", "{bad b"), ("c.json", "{bad c")]


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):  # type: ignore[no-untyped-def]
    cfg = pipeline(tmp_path_factory.mktemp("state_files"))
    land(cfg.landing_path, "a.json", event(1), event(9, "customers"))
    run_pipeline(cfg, spark=spark, run_id="r1")
    return cfg


@pytest.mark.parametrize("name", ["cdc_instance.json", "cdc_tables.json", "cdc_table_versions.json"])
def test_a_truncated_state_file_names_the_file_exit_3(spark, lake, name):
    f = lake.checkpoint_path / name
    original = f.read_bytes()
    f.write_bytes(original[:15])
    try:
        r = run_cli(spark, lake.file)
    finally:
        f.write_bytes(original)
    assert r.returncode == 3 and f"NEEDS RECOVERY: checkpoint file {f} is truncated" in r.stderr, r.stderr
    assert f"mv {f} {f}.damaged" in r.stderr and "it holds " in r.stderr, r.stderr


def test_an_empty_state_file_stops_the_run_and_moving_it_aside_converges(spark, lake):
    """The recovery each message prints (move the file aside, run again) gives every event."""
    cfg, n = lake, 1
    for name in ["cdc_instance.json", "cdc_tables.json", "cdc_table_versions.json"]:
        f = cfg.checkpoint_path / name
        f.write_text("")
        n += 1
        land(cfg.landing_path, f"{n}.json", event(n))
        with pytest.raises(StateFileDamaged) as e:
            run_pipeline(cfg, spark=spark, run_id=f"stop{n}")
        assert f"checkpoint file {f} is empty" in str(e.value), str(e.value)
        shutil.move(str(f), f"{f}.damaged")
        assert run_pipeline(cfg, spark=spark, run_id=f"run{n}")["status"] == "succeeded"
        assert rows(cfg.tables["orders"].path) == {i: f"s{i}" for i in range(1, n + 1)}, name
        assert f.exists(), f"{name} is written again by the run"


@pytest.mark.parametrize("damage", ["metadata", "sources"])
def test_a_checkpoint_without_metadata_or_source_log_stops_and_its_recovery_converges(
        spark, tmp_path, damage):
    """``metadata`` or ``sources/`` of a checkpoint with committed batches deleted: the run used
    to fail in Spark (exit 1, STREAMING_CHECKPOINT_MISSING_METADATA_FILE / "batch 1 doesn't
    exist"). It now stops before Spark naming the file and the recovery; following the printed
    command gives every event."""
    import re

    from cdc_lake.checkpoint_log import CheckpointDamaged

    cfg = pipeline(tmp_path)
    cp, orders, customers = cfg.checkpoint_path, cfg.tables["orders"].path, cfg.tables["customers"].path
    land(cfg.landing_path, "a.json", event(1), event(2), event(9, "customers"), "{bad a")
    run_pipeline(cfg, spark=spark, run_id="r1")
    land(cfg.landing_path, "b.json", event(12, typ="update", id=2, status="paid"))
    run_pipeline(cfg, spark=spark, run_id="r2")
    victim = cp / damage
    shutil.rmtree(victim) if victim.is_dir() else victim.unlink()
    land(cfg.landing_path, "c.json", event(3), event(13, typ="delete", id=1), event(4, "customers"))

    with pytest.raises(CheckpointDamaged) as e:
        run_pipeline(cfg, spark=spark, run_id="r3")
    msg = str(e.value)
    named = cp / "metadata" if damage == "metadata" else cp / "sources" / "0" / "0"
    assert f"checkpoint file {named} is missing" in msg, msg
    assert rows(orders) == {1: "s1", 2: "paid"}, "nothing may be written before the operator acts"

    command = re.search(r"`(mv \S+ \S+) && (spark-submit [^`]+)`", msg)
    assert command and command.group(2) == f"spark-submit spark_jobs/cdc_ingest.py --pipeline {cfg.file}"
    subprocess.run(command.group(1), shell=True, check=True)  # the recovery the message names
    assert run_pipeline(cfg, spark=spark, run_id="r4")["status"] == "succeeded"  # (its run)
    assert rows(orders) == {2: "paid", 3: "s3"} and rows(customers) == {4: "s4", 9: "s9"}
    assert _quarantined(cfg) == [("a.json", "{bad a")]
    land(cfg.landing_path, "d.json", event(14, typ="update", id=3, status="later"))
    assert run_pipeline(cfg, spark=spark, run_id="r5")["status"] == "succeeded"
    assert rows(orders) == {2: "paid", 3: "later"}
