"""An older Delta commit file of an output table emptied behind the pipeline (tester:
``: > lake/shop_maxwell/orders/_delta_log/00000000000000000005.json`` with the table and its
record at version 9): delta-rs loaded the table without that commit's actions, the next run
exited 0 and the table then held duplicated keys and stale values (248 rows, 89 keys twice).
``cdc_lake.table_marks.changed_behind`` now requires every commit file a reader replays (after
the last Delta checkpoint) to hold an action; the run stops (exit 3, ``TableChangedBehind``)
naming the file, and the full refresh it prints converges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from job_helpers import event, land, pipeline, rows

from cdc_lake.sources.delta_log import SAME_ROWS
from cdc_lake.table_marks import changed_behind, commit_fingerprint

JOB = Path(__file__).resolve().parents[1] / "spark_jobs" / "cdc_ingest.py"


def _commit(table: Path, v: int) -> Path:
    return table / "_delta_log" / f"{v:020d}.json"


def _why(table: Path, version: int) -> str | None:
    """Both ways of the check (log listed; commits opened by name) must agree."""
    fp = commit_fingerprint(table, version)
    listed = changed_behind(table, version, fp, app_prefix="cdc-shop-")
    by_name = changed_behind(table, version, fp, app_prefix="cdc-shop-",
                             current=DeltaTable(str(table)).version())
    assert listed == by_name, (listed, by_name)
    return listed


def _table(tmp_path: Path, name: str, commits: int = 5) -> Path:
    table = tmp_path / name
    for i in range(commits):
        write_deltalake(str(table), pa.table({"id": [i]}), mode="append")
    assert DeltaTable(str(table)).version() == commits - 1
    return table


def test_an_emptied_older_commit_is_named_and_a_checkpoint_after_it_clears_it(tmp_path):
    table = _table(tmp_path, "plain")
    assert _why(table, 4) is None
    _commit(table, 2).write_bytes(b"")
    assert len(DeltaTable(str(table)).to_pyarrow_table()) == 4  # read without its add: silent
    why = _why(table, 4)
    assert why and str(_commit(table, 2)) in why and "is empty (0 bytes)" in why, why
    assert changed_behind(table, 4, None, app_prefix="cdc-shop-", current=4) == why  # old record

    blank = _table(tmp_path, "blank")
    _commit(blank, 1).write_bytes(b"\n")  # blank space only: no action either
    why = _why(blank, 4)
    assert why and str(_commit(blank, 1)) in why and "is empty (1 bytes, blank)" in why, why

    # a checkpoint written before the damage, the emptied commit after it: replayed, flagged
    late = _table(tmp_path, "late", commits=2)
    DeltaTable(str(late)).create_checkpoint()  # at version 1
    for i in range(3):
        write_deltalake(str(late), pa.table({"id": [10 + i]}), mode="append")
    _commit(late, 3).write_bytes(b"")
    why = _why(late, 4)
    assert why and str(_commit(late, 3)) in why, why

    # a checkpoint after the emptied commit: readers start from it, the commit is not replayed
    cp = _table(tmp_path, "checkpointed")
    DeltaTable(str(cp)).create_checkpoint()  # at version 4
    write_deltalake(str(cp), pa.table({"id": [9]}), mode="append")
    _commit(cp, 2).write_bytes(b"")
    assert _why(cp, 5) is None
    assert len(DeltaTable(str(cp)).to_pyarrow_table()) == 6
    (cp / "_delta_log" / "_last_checkpoint").unlink()  # a hint only: the listing still finds it
    assert _why(cp, 5) is None


def test_only_a_complete_overwrite_after_the_emptied_commit_clears_it(tmp_path):
    """A full refresh (WRITE/Overwrite, no predicate) replaced every row: the emptied commit
    before it no longer matters (the printed recovery converges). A rewrite tagged as keeping
    the same rows copied the damaged rows, and an overwrite with a predicate kept the others."""
    for kind in ("full", "same_rows", "predicate"):
        table = _table(tmp_path, kind)
        _commit(table, 2).write_bytes(b"")
        if kind == "full":
            write_deltalake(str(table), pa.table({"id": [0, 1, 2, 3, 4]}), mode="overwrite",
                            schema_mode="overwrite")
        elif kind == "same_rows":
            write_deltalake(str(table), DeltaTable(str(table)).to_pyarrow_table(), mode="overwrite",
                            commit_properties=CommitProperties(custom_metadata={SAME_ROWS: "true"}))
        else:
            write_deltalake(str(table), pa.table({"id": [1]}), mode="overwrite", predicate="id = 1")
        why = _why(table, 5)
        if kind == "full":
            assert why is None, why
            write_deltalake(str(table), pa.table({"id": [7]}), mode="append")
            _commit(table, 6).write_bytes(b"")  # emptied after the overwrite: flagged again
            why = _why(table, 6)
            assert why and str(_commit(table, 6)) in why, why
        else:
            assert why and str(_commit(table, 2)) in why, (kind, why)


def test_a_commit_of_only_commit_info_is_valid_delta_and_passes(tmp_path):
    table = _table(tmp_path, "info_only", commits=3)
    info = {"commitInfo": {"timestamp": 1795000000000, "operation": "WRITE",
                           "operationParameters": {"mode": "Append"}}}
    _commit(table, 3).write_text(json.dumps(info) + "\n")
    write_deltalake(str(table), pa.table({"id": [3]}), mode="append")
    assert DeltaTable(str(table)).version() == 4
    assert _why(table, 4) is None


def test_an_emptied_older_commit_stops_the_run_and_the_full_refresh_converges(spark, tmp_path):
    from cdc_lake.cdc.job import run_pipeline
    from cdc_lake.cdc.state import TableChangedBehind

    cfg = pipeline(tmp_path)
    orders = cfg.tables["orders"].path
    batches = [[event(i) for i in range(1, 5)] + [event(40, "customers")],
               [event(10, typ="update", id=1, status="b2"), event(11, typ="delete", id=2),
                event(5)],
               [event(20, typ="update", id=3, status="b3"), event(6),
                event(30, typ="update", id=1, status="b4"), event(7)]]
    for n, lines in enumerate(batches):  # taken in landing order: one time each
        os.utime(land(cfg.landing_path, f"{n}.json", *lines), (time.time() - 60 + n,) * 2)
    # one run, one micro-batch (one MERGE commit) per landed file
    assert run_pipeline(cfg, spark=spark, run_id="r0",
                        max_files_per_trigger=1)["status"] == "succeeded"
    truth = {1: "b4", 3: "b3", 4: "s4", 5: "s5", 6: "s6", 7: "s7"}
    assert rows(orders) == truth  # no damage: every batch ran
    current = DeltaTable(str(orders)).version()
    assert current == 3, current  # CREATE TABLE, then one MERGE per batch

    older = _commit(orders, 2)  # the MERGE of the second batch, not the newest
    assert b'"MERGE"' in older.read_bytes() and b'"remove"' in older.read_bytes()
    older.write_bytes(b"")  # `: > .../_delta_log/<v>.json`
    got = [r["id"] for r in DeltaTable(str(orders)).to_pyarrow_table().to_pylist()]
    assert DeltaTable(str(orders)).version() == current  # loads "fine" at the same version,
    assert len(got) > len(set(got)) and 2 in got, got  # but keys twice, a deleted key back
    land(cfg.landing_path, "3.json", event(8))
    with pytest.raises(TableChangedBehind) as e:
        run_pipeline(cfg, spark=spark, run_id="r1")
    msg = str(e.value)
    assert "'orders'" in msg and str(older) in msg and "is empty (0 bytes)" in msg, msg
    assert "customers" not in msg, msg
    assert "--full-refresh --tables orders" in msg, msg
    r = subprocess.run([sys.executable, str(JOB), "--pipeline", str(cfg.file), "--run-id", "cli"],
                       capture_output=True, text=True, timeout=300)  # exit 3, before Spark
    assert r.returncode == 3 and "NEEDS RECOVERY" in r.stderr and str(older) in r.stderr, r.stderr

    run_pipeline(cfg, spark=spark, run_id="refresh", tables=["orders"], full_refresh=True)
    assert older.stat().st_size == 0  # still in the log, before the refresh's overwrite
    assert run_pipeline(cfg, spark=spark, run_id="r2")["status"] == "succeeded"
    truth[8] = "s8"
    assert rows(orders) == truth
    assert rows(cfg.tables["customers"].path) == {40: "s40"}
