"""Stored state the checkpoint relies on (issue 6 item 5): a Delta table deleted while its
checkpoint survives, and empty/truncated Spark checkpoint files, stop the run (exit 3) with a
message naming the table or file and the recovery command, and the recovery command works."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from job_helpers import event, land, moved_aside, pipeline, rows, run_cli

from cdc_lake.cdc.job import run_pipeline
from cdc_lake.cdc.state import TableDamaged, TableMissing, TableRolledBack
from cdc_lake.checkpoint_log import last_committed_batch

JOB = Path(__file__).resolve().parents[1] / "spark_jobs" / "cdc_ingest.py"


def _cli(yaml: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(JOB), "--pipeline", str(yaml), "--run-id", "cli"],
                          capture_output=True, text=True, timeout=300)


def test_deleted_table_stops_the_run_and_a_full_refresh_recovers(spark, tmp_path):
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", *(event(i) for i in range(1, 6)), event(9, "customers"))
    run_pipeline(cfg, spark=spark, run_id="r1")
    orders = cfg.tables["orders"].path
    assert len(rows(orders)) == 5
    shutil.rmtree(orders)  # an operator mistake: the table is gone, the checkpoint is not
    land(cfg.landing_path, "b.json", event(6))

    with pytest.raises(TableMissing) as e:
        run_pipeline(cfg, spark=spark, run_id="r2")
    msg = str(e.value)
    assert "'orders'" in msg and str(orders) in msg and "customers" not in msg
    assert f"--pipeline {cfg.file} --full-refresh --tables orders" in msg, msg
    assert not orders.exists(), "nothing may be written before the operator decides"
    # The CLI says the same and exits 3, without starting Spark (fast: before the session).
    r = _cli(cfg.file)
    assert r.returncode == 3 and "NEEDS RECOVERY" in r.stderr and "--tables orders" in r.stderr, r.stderr

    run_pipeline(cfg, spark=spark, run_id="refresh", tables=["orders"], full_refresh=True)
    s = run_pipeline(cfg, spark=spark, run_id="r3")
    assert s["status"] == "succeeded"
    assert rows(orders) == {i: f"s{i}" for i in range(1, 7)}
    assert rows(cfg.tables["customers"].path) == {9: "s9"}


def test_damaged_delta_log_names_the_table_and_the_move_aside_recovery_converges(spark, tmp_path):
    """A truncated Delta log file of a table the checkpoint wrote: the run stops before Spark
    with a message naming the table, the path and the recovery (it used to fail inside the
    micro-batch with a Spark stack trace); the recovery it prints restores every row."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", *(event(i) for i in range(1, 6)), event(9, "customers"))
    run_pipeline(cfg, spark=spark, run_id="r1")
    orders = cfg.tables["orders"].path
    last = sorted((orders / "_delta_log").glob("*.json"))[-1]
    last.write_text(last.read_text()[:25])  # torn write / disk trouble
    land(cfg.landing_path, "b.json", event(6))

    with pytest.raises(TableDamaged) as e:
        run_pipeline(cfg, spark=spark, run_id="r2")
    msg = str(e.value)
    assert "'orders'" in msg and str(orders) in msg and "customers" not in msg, msg
    assert f"mv {orders} {orders}.damaged" in msg and "--full-refresh --tables orders" in msg, msg
    r = run_cli(spark, cfg.file)
    assert r.returncode == 3 and "NEEDS RECOVERY" in r.stderr and str(orders) in r.stderr, r.stderr

    shutil.move(str(orders), f"{orders}.damaged")  # the recovery the message names
    run_pipeline(cfg, spark=spark, run_id="refresh", tables=["orders"], full_refresh=True)
    s = run_pipeline(cfg, spark=spark, run_id="r3")
    assert s["status"] == "succeeded"
    assert rows(orders) == {i: f"s{i}" for i in range(1, 7)}
    assert rows(cfg.tables["customers"].path) == {9: "s9"}


def test_a_table_whose_newest_commit_was_removed_stops_the_run_and_a_full_refresh_recovers(spark, tmp_path):
    """The newest ``_delta_log`` JSON of a table removed behind the checkpoint: the table reads
    fine at the version before, so the last batch's changes were silently gone for good (exit 0).
    The run now stops (exit 3) naming the table and both versions; the full refresh it names
    restores every row, and later runs go on."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", *(event(i) for i in range(1, 4)), event(9, "customers"))
    run_pipeline(cfg, spark=spark, run_id="r1")
    land(cfg.landing_path, "b.json", event(12, typ="update", id=2, status="paid"), event(4))
    run_pipeline(cfg, spark=spark, run_id="r2")
    orders = cfg.tables["orders"].path
    assert rows(orders) == {1: "s1", 2: "paid", 3: "s3", 4: "s4"}
    newest = sorted((orders / "_delta_log").glob("*.json"))[-1]
    newest.unlink()  # lost commit (a restore from an older copy, a cleanup gone wrong)
    assert rows(orders) == {1: "s1", 2: "s2", 3: "s3"}  # silently older
    land(cfg.landing_path, "c.json", event(5))

    with pytest.raises(TableRolledBack) as e:
        run_pipeline(cfg, spark=spark, run_id="r3")
    msg = str(e.value)
    assert "'orders'" in msg and str(orders) in msg and "customers" not in msg, msg
    assert "--full-refresh --tables orders" in msg, msg
    r = run_cli(spark, cfg.file)
    assert r.returncode == 3 and "NEEDS RECOVERY" in r.stderr and str(orders) in r.stderr, r.stderr

    run_pipeline(cfg, spark=spark, run_id="refresh", tables=["orders"], full_refresh=True)
    s = run_pipeline(cfg, spark=spark, run_id="r4")
    assert s["status"] == "succeeded"
    assert rows(orders) == {1: "s1", 2: "paid", 3: "s3", 4: "s4", 5: "s5"}
    assert rows(cfg.tables["customers"].path) == {9: "s9"}


def test_damaged_quarantine_log_names_it_and_moving_it_aside_lets_runs_go_on(spark, tmp_path):
    """The quarantine is appended to by every run with a bad line: an unreadable log is named
    before Spark starts, and the recovery it prints (move it aside) lets the next run go on."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", event(1), "{not json")
    run_pipeline(cfg, spark=spark, run_id="r1")
    q = cfg.quarantine_path
    last = sorted((q / "_delta_log").glob("*.json"))[-1]
    last.write_text(last.read_text()[:25])
    land(cfg.landing_path, "b.json", event(2), "{still not json")

    with pytest.raises(TableDamaged) as e:
        run_pipeline(cfg, spark=spark, run_id="r2")
    msg = str(e.value)
    assert "quarantine table" in msg and str(q) in msg and f"mv {q} {q}.damaged" in msg, msg

    shutil.move(str(q), f"{q}.damaged")
    s = run_pipeline(cfg, spark=spark, run_id="r3")
    assert s["status"] == "succeeded" and s["quarantined"] == 1
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2"}


@pytest.mark.parametrize("damage", ["offsets_empty", "commits_truncated", "metadata_empty",
                                    "source_log_truncated", "offsets_missing_source",
                                    "offsets_conf_key_removed"])
def test_damaged_checkpoint_file_names_the_file_and_the_recovery(spark, tmp_path, damage, request):
    cfg, cp = request.getfixturevalue("ingested")
    victim, new_text = {
        "offsets_empty": (cp / "offsets" / "1", ""),
        "commits_truncated": (cp / "commits" / "1", "v1\n{\"nextBatchWat"),
        "metadata_empty": (cp / "metadata", ""),
        "source_log_truncated": (cp / "sources" / "0" / "1", "v1\n{\"path\":\"file:///x"),
        "offsets_missing_source": (cp / "offsets" / "1",
                                   (cp / "offsets" / "1").read_text().splitlines()[0] + "\n"
                                   + (cp / "offsets" / "1").read_text().splitlines()[1]),
        # a hand edit that drops a setting Spark reads on a restart: Spark's "None.get" before
        "offsets_conf_key_removed": (cp / "offsets" / "1", (cp / "offsets" / "1").read_text().replace(
            '"spark.sql.shuffle.partitions":', '"spark.sql.shuffle_partitions":')),
    }[damage]
    original = victim.read_bytes()
    victim.write_text(new_text)
    crc = victim.with_name(f".{victim.name}.crc")
    crc_bytes = crc.read_bytes() if crc.exists() else None
    crc.unlink(missing_ok=True)
    try:
        r = run_cli(spark, cfg.file)
    finally:
        victim.write_bytes(original)
        if crc_bytes is not None:
            crc.write_bytes(crc_bytes)
    assert r.returncode == 3, r.stderr[-3000:]
    assert f"checkpoint file {victim} is " in r.stderr, r.stderr
    assert re.search(moved_aside(cp, f" && spark-submit spark_jobs/cdc_ingest.py --pipeline {cfg.file}"),
                     r.stderr), r.stderr


def test_a_damaged_newest_commit_record_gets_the_lossless_replay(spark, tmp_path):
    """An empty ``commits/N`` of the newest batch (offsets/N intact): the message leads with
    moving that one file aside, not the whole checkpoint; following it, batch N runs again
    from its logged offsets, skips the writes it made (no new table version, no quarantine or
    DDL-log row twice) and later batches go on as usual."""
    from deltalake import DeltaTable

    cfg = pipeline(tmp_path)
    cp = cfg.checkpoint_path
    land(cfg.landing_path, "a.json", event(1), event(2))
    run_pipeline(cfg, spark=spark, run_id="r1")
    land(cfg.landing_path, "b.json", event(3, "customers"), event(4), "not a json line")
    run_pipeline(cfg, spark=spark, run_id="r2")
    versions = {n: DeltaTable(str(t.path)).version() for n, t in cfg.tables.items()}
    quarantine = DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().num_rows
    assert quarantine == 1
    (cp / "commits" / "1").write_text("")

    r = run_cli(spark, cfg.file)
    assert r.returncode == 3, r.stderr[-3000:]
    assert f"checkpoint file {cp / 'commits' / '1'} is empty" in r.stderr, r.stderr
    assert "offsets/1 is intact" in r.stderr, r.stderr
    [cmd] = re.findall(r"`(mv [^`]+)`", r.stderr.split("Only if that run fails")[0])
    assert re.fullmatch(moved_aside(cp / "commits" / "1"), cmd), cmd
    subprocess.run(cmd, shell=True, check=True)

    r = run_cli(spark, cfg.file, run_id="replay")
    assert r.returncode == 0, r.stderr[-3000:]
    assert {n: DeltaTable(str(t.path)).version() for n, t in cfg.tables.items()} == versions
    assert DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().num_rows == quarantine
    assert last_committed_batch(cp) == 1
    land(cfg.landing_path, "c.json", event(5))
    s = run_pipeline(cfg, spark=spark, run_id="r3")
    assert s["status"] == "succeeded" and s["events_read"] == 1, s
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2", 4: "s4", 5: "s5"}
    assert rows(cfg.tables["customers"].path) == {3: "s3"}


@pytest.mark.parametrize("damage", ["metadata", "sources", "last_source_log", "newest_offsets"])
def test_missing_checkpoint_file_names_the_file_and_the_recovery(spark, damage, request):
    """A checkpoint with batches but without ``metadata`` or (part of) the file source's log:
    exit 3 naming the file and the recovery, before Spark starts (it failed, exit 1, with
    STREAMING_CHECKPOINT_MISSING_METADATA_FILE / "batch 1 doesn't exist" and a page of plan)."""
    cfg, cp = request.getfixturevalue("ingested")
    victim, named = {"metadata": (cp / "metadata", cp / "metadata"),
                     "sources": (cp / "sources", cp / "sources" / "0" / "0"),
                     "last_source_log": (cp / "sources" / "0" / "1", cp / "sources" / "0" / "1"),
                     "newest_offsets": (cp / "offsets" / "1", cp / "offsets" / "1")}[damage]
    kept = cp.parent / f"kept-{damage}"
    shutil.move(str(victim), str(kept))
    try:
        r = run_cli(spark, cfg.file)
    finally:
        shutil.move(str(kept), str(victim))
    assert r.returncode == 3, r.stderr[-3000:]
    assert f"NEEDS RECOVERY: checkpoint file {named} is missing" in r.stderr, r.stderr
    assert re.search(moved_aside(cp, f" && spark-submit spark_jobs/cdc_ingest.py --pipeline {cfg.file}"),
                     r.stderr), r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_which_checkpoints_count_as_complete(tmp_path):
    """No Spark: a new checkpoint (no batches) needs no ``metadata`` nor source log; a compacted
    source log whose entries below the newest ``.compact`` were deleted (as Spark does) is
    complete; a gap above it, or log entries the last offsets reach that are gone, is not."""
    from cdc_lake.checkpoint_log import CheckpointDamaged, validate_checkpoint

    def put(name: str, text: str) -> None:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    validate_checkpoint(tmp_path / "none", recovery="R")
    put("cdc_instance.json", '{"instance_id": "x"}')  # ours only: Spark never started
    validate_checkpoint(tmp_path, recovery="R")
    put("metadata", '{"id":"5c7e3e06-2d2a-4a8e-9d3a-1f2e3d4c5b6a"}\n')  # started, no batch yet
    validate_checkpoint(tmp_path, recovery="R")
    entry = 'v1\n{"path":"file:///l/a.json","timestamp":1,"batchId":%d}\n'
    for n in (10, 11, 12):
        put(f"offsets/{n}", 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"logOffset":%d}\n' % n)
        put(f"commits/{n}", 'v1\n{"nextBatchWatermarkMs":0}\n')
    put("sources/0/9.compact", entry % 9)
    for n in (10, 11, 12):
        put(f"sources/0/{n}", entry % n)
    validate_checkpoint(tmp_path, recovery="R")
    put("offsets/13", 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"logOffset":-1}\n')
    validate_checkpoint(tmp_path, recovery="R")  # (no file source offset: nothing to check)
    (tmp_path / "offsets" / "13").unlink()
    put("offsets/13", 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"logOffset":13}\n')
    with pytest.raises(CheckpointDamaged) as e:  # planned up to entry 13; the entry is gone
        validate_checkpoint(tmp_path, recovery="R")
    assert e.value.file == tmp_path / "sources" / "0" / "13", str(e.value)
    (tmp_path / "offsets" / "13").unlink()
    (tmp_path / "sources" / "0" / "11").unlink()
    with pytest.raises(CheckpointDamaged) as e:
        validate_checkpoint(tmp_path, recovery="R")
    assert e.value.file == tmp_path / "sources" / "0" / "11" and "Recovery: R" in str(e.value)
    put("sources/0/11", entry % 11)
    put("commits/13", 'v1\n{"nextBatchWatermarkMs":0}\n')  # its offsets/13 is gone
    with pytest.raises(CheckpointDamaged) as e:
        validate_checkpoint(tmp_path, recovery="R")
    assert e.value.file == tmp_path / "offsets" / "13" and "commits/13" in str(e.value)
    (tmp_path / "commits" / "13").unlink()
    validate_checkpoint(tmp_path, recovery="R")
    (tmp_path / "offsets" / "11").rename(tmp_path / "o11")  # the one before the newest
    with pytest.raises(CheckpointDamaged) as e:
        validate_checkpoint(tmp_path, recovery="R")
    assert e.value.file == tmp_path / "offsets" / "11" and "offsets/12" in str(e.value)
    (tmp_path / "o11").rename(tmp_path / "offsets" / "11")
    (tmp_path / "offsets" / "10").unlink()  # older ones go by Spark's own purge
    validate_checkpoint(tmp_path, recovery="R")
    (tmp_path / "metadata").unlink()
    with pytest.raises(CheckpointDamaged) as e:
        validate_checkpoint(tmp_path, recovery="R")
    assert e.value.file == tmp_path / "metadata", str(e.value)


@pytest.fixture(scope="module")
def ingested(spark, tmp_path_factory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("damaged")
    cfg = pipeline(tmp)
    land(cfg.landing_path, "a.json", event(1), event(2))
    run_pipeline(cfg, spark=spark, run_id="r1")
    land(cfg.landing_path, "b.json", event(3, "customers"))
    run_pipeline(cfg, spark=spark, run_id="r2")
    assert last_committed_batch(cfg.checkpoint_path) == 1
    return cfg, cfg.checkpoint_path


@pytest.mark.slow  # default tier keeps the stop-and-say-why tests; this one is the follow-up
def test_the_recovery_of_a_damaged_checkpoint_converges(spark, ingested):
    """What the message tells the operator to do: move the checkpoint aside and run again."""
    cfg, cp = ingested
    before = {n: rows(t.path) for n, t in cfg.tables.items()}
    (cp / "offsets" / "1").write_text("")
    shutil.move(str(cp), f"{cp}.damaged")
    land(cfg.landing_path, "c.json", event(4))
    s = run_pipeline(cfg, spark=spark, run_id="after")
    assert s["status"] == "succeeded"
    assert rows(cfg.tables["orders"].path) == {**before["orders"], 4: "s4"}
    assert rows(cfg.tables["customers"].path) == before["customers"]


def test_offset_log_write_killed_before_its_rename_does_not_block_later_runs(spark, tmp_path):
    """Found by the chaos harness (`python -m tests.chaos --kills 150 --seed 22`, workload 10):
    a SIGKILL while Spark wrote the first offset log file left only its temp file and checksum
    (names as found there); every later run then failed, exit 1, with Spark's
    STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY ("offsets should be empty on batch 0")."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", event(1), event(2))
    offsets = cfg.checkpoint_path / "offsets"
    offsets.mkdir(parents=True)
    u = "b19f8c40-409f-41c6-8f55-c1193f6a6f69"
    (offsets / f".0.{u}.tmp").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"logOffset":0}\n')
    (offsets / f"..0.{u}.tmp.crc").write_bytes(b"crc\x00\x01")
    s = run_pipeline(cfg, spark=spark, run_id="r1")
    assert s["status"] == "succeeded"
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2"}
    assert sorted(p.name for p in offsets.iterdir() if not p.name.startswith(".")) == ["0"]
    assert not list(offsets.glob(f"*{u}*"))


def test_a_commit_file_deleted_by_hand_with_its_checksum_left_does_not_block_the_run(spark, tmp_path):
    """Deleting ``commits/N`` (to make Spark redo batch N) leaves ``commits/.N.crc``; Spark's
    rename of the new ``commits/N`` then failed ("Multiple streaming queries are concurrently
    using ...", exit 1). The stale checksum is removed before the start; batch N is redone."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", event(1), event(2))
    run_pipeline(cfg, spark=spark, run_id="r1")
    commits = cfg.checkpoint_path / "commits"
    last = last_committed_batch(cfg.checkpoint_path)
    assert (commits / f".{last}.crc").exists()  # Spark's local file system writes checksums
    (commits / str(last)).unlink()
    land(cfg.landing_path, "b.json", event(3))
    s = run_pipeline(cfg, spark=spark, run_id="r2")
    assert s["status"] == "succeeded"
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2", 3: "s3"}
    assert last_committed_batch(cfg.checkpoint_path) is not None


def test_a_landed_file_appended_to_after_it_was_read_stops_the_run_and_the_recovery_converges(spark, tmp_path):
    """A producer still writing a file when a run took it: the cut-off line is quarantined, the
    rest arrives in the same file later — Spark's file source never reads a taken file again, so
    the run (otherwise a no-op: no new file) must stop and say so (exit 3), naming the file; the
    recovery it prints (new lines into a new file, old mtime back) gives every event."""
    import os
    import re

    from cdc_lake.cdc.backlog import LandedFileChanged

    cfg = pipeline(tmp_path)
    second = event(2)
    a = land(cfg.landing_path, "a.json", event(1), second[:40])  # cut off mid-line, no newline
    a.write_text(a.read_text().rstrip("\n"), encoding="utf-8")
    s = run_pipeline(cfg, spark=spark, run_id="r1")
    assert s["quarantined"] == 1 and rows(cfg.tables["orders"].path) == {1: "s1"}
    taken_mtime = os.stat(a).st_mtime
    with open(a, "a", encoding="utf-8") as f:  # the producer finishes the line, adds another
        f.write(second[40:] + "\n" + event(3) + "\n")
    os.utime(a, (taken_mtime + 5, taken_mtime + 5))

    with pytest.raises(LandedFileChanged) as e:
        run_pipeline(cfg, spark=spark, run_id="r2")
    msg = str(e.value)
    assert str(a) in msg and "touch -m -d @" in msg, msg
    r = run_cli(spark, cfg.file)
    assert r.returncode == 3 and "NEEDS RECOVERY" in r.stderr and str(a) in r.stderr, r.stderr

    land(cfg.landing_path, "a-rest.json", second, event(3))  # the recovery the message names
    touch = re.search(r"`(touch -m -d @[^`]+)`", msg).group(1)
    subprocess.run(touch, shell=True, check=True)
    s = run_pipeline(cfg, spark=spark, run_id="r3")
    assert s["status"] == "succeeded"
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2", 3: "s3"}


def test_remove_unfinished_writes_touches_only_temp_files_of_log_writes(tmp_path):
    """No Spark: which names are unfinished writes (Hadoop's ``.<name>.<uuid>.tmp`` + checksum)."""
    from cdc_lake.checkpoint_log import remove_unfinished_writes

    u = "0123abcd-4567-89ab-cdef-0123456789ab"
    keep = ["offsets/0", "offsets/.0.crc", "commits/0", "commits/.0.crc", "sources/0/0",
            "sources/0/9.compact", "offsets/.0.tmp", f"offsets/.0.{u}", "cdc_instance.json",
            f"state/0/0/.1.delta.{u}.tmp"]  # (state: Spark's own; not a log folder)
    gone = [f"offsets/.1.{u}.tmp", f"offsets/..1.{u}.tmp.crc", f"commits/.3.{u}.tmp",
            f"sources/0/.10.compact.{u}.tmp", f"sources/0/..10.compact.{u}.tmp.crc",
            # checksums of log files that are gone (deleted by hand)
            "commits/.2.crc", "offsets/.7.crc", "sources/0/.3.compact.crc"]
    for name in keep + gone:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    removed = remove_unfinished_writes(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in removed) == sorted(gone)
    assert all((tmp_path / n).exists() for n in keep)
    assert remove_unfinished_writes(tmp_path / "missing") == []


def test_a_deleted_table_is_noticed_with_the_tables_record_gone_too(spark, tmp_path):
    """Tester: with ``cdc_tables.json`` removed as well, a deleted table was re-created with
    only the new changes (exit 0, 60 of 109 rows); the versions record names it too."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", *(event(i) for i in range(1, 4)))
    run_pipeline(cfg, spark=spark, run_id="r1")
    (cfg.checkpoint_path / "cdc_tables.json").unlink()
    shutil.rmtree(cfg.tables["orders"].path)
    land(cfg.landing_path, "b.json", event(4))
    with pytest.raises(TableMissing) as e:
        run_pipeline(cfg, spark=spark, run_id="r2")
    assert "'orders'" in str(e.value) and "--full-refresh --tables orders" in str(e.value), str(e.value)
    assert not cfg.tables["orders"].path.exists()


def test_a_full_refresh_names_landing_files_changed_since_they_were_read(spark, tmp_path, capfd):
    """A full refresh rebuilds from the files as they are: an appended line is included; a file
    cut short would lose lines, and the file source records no sizes to tell the two apart, so
    the run names the changed files (tester: a truncated file, then a full refresh, exit 0)."""
    cfg = pipeline(tmp_path)
    a = land(cfg.landing_path, "a.json", event(1), event(2))
    run_pipeline(cfg, spark=spark, run_id="r1")
    with a.open("a", encoding="utf-8") as f:
        f.write(event(3) + "\n")
    capfd.readouterr()
    run_pipeline(cfg, spark=spark, run_id="refresh", tables=["orders"], full_refresh=True)
    err = capfd.readouterr().err
    assert "WARNING: this full refresh reads 1 landing file(s) that changed" in err and str(a) in err, err
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2", 3: "s3"}


def test_a_damaged_delta_checkpoint_gets_the_lossless_recovery_when_every_commit_is_there(spark, tmp_path):
    """A corrupt checkpoint parquet (or a ``_last_checkpoint`` naming a missing one) while every
    commit file is intact: the only advice was to move the whole table aside and rebuild it
    (tester); moving the checkpoint files aside loses nothing, and the printed command does."""
    from deltalake import DeltaTable

    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", *(event(i) for i in range(1, 4)))
    run_pipeline(cfg, spark=spark, run_id="r1")
    orders = cfg.tables["orders"].path
    DeltaTable(str(orders)).create_checkpoint()
    (cp,) = (orders / "_delta_log").glob("*.checkpoint.parquet")
    cp.write_bytes(b"not parquet")
    land(cfg.landing_path, "b.json", event(4))
    with pytest.raises(TableDamaged) as e:
        run_pipeline(cfg, spark=spark, run_id="r2")
    msg = str(e.value)
    m = re.search(r"move its Delta checkpoint files aside and run again \(`([^`]+)`\)", msg)
    assert m and "--full-refresh --tables orders" in msg, msg
    subprocess.run(m.group(1), shell=True, check=True)
    run_pipeline(cfg, spark=spark, run_id="r3")
    assert rows(orders) == {i: f"s{i}" for i in range(1, 5)}


def test_quarantine_rows_lost_with_removed_commits_stop_the_run_and_the_reset_restores_them(spark, tmp_path):
    """Tester: the quarantine table's newest commit removed (its rows with it): exit 0, the
    quarantine went from 2 rows to 0 for good. Now exit 3; the printed reset re-reads the
    landing history and puts each lost line back once."""
    from deltalake import DeltaTable

    from cdc_lake.cdc.state import TableRolledBack

    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", event(1), "not json 1")
    run_pipeline(cfg, spark=spark, run_id="r1")
    land(cfg.landing_path, "b.json", event(2), "not json 2")
    run_pipeline(cfg, spark=spark, run_id="r2")
    qpath = cfg.quarantine_path
    q = DeltaTable(str(qpath))
    assert sorted(r["raw_line"] for r in q.to_pyarrow_table().to_pylist()) == ["not json 1", "not json 2"]
    (qpath / "_delta_log" / f"{q.version():020d}.json").unlink()
    land(cfg.landing_path, "c.json", event(3))
    with pytest.raises(TableRolledBack) as e:
        run_pipeline(cfg, spark=spark, run_id="r3")
    msg = str(e.value)
    assert "quarantine" in msg and str(qpath) in msg, msg
    m = re.search(r"`(mv [^`]+) && ", msg)
    assert m, msg
    subprocess.run(m.group(1), shell=True, check=True)  # the checkpoint aside, as printed
    run_pipeline(cfg, spark=spark, run_id="r4")
    lines = sorted(r["raw_line"] for r in DeltaTable(str(qpath)).to_pyarrow_table().to_pylist())
    assert lines == ["not json 1", "not json 2"], lines
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2", 3: "s3"}
