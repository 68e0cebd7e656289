"""An enrichment run with nothing to do starts no Spark session; every run with work does: a new
event file (and, not decided without Spark, a subfolder), a new fact-table version of a change
feed (or a fact table behind the checkpoint), a re-join pass due (a parked fact's member
arrived), a planned batch not committed, an unfinished ``--reprocess``. Real delta-rs tables
and real Spark runs around the skipped ones; ``build_session`` is replaced by a function that
fails the test, so a run that needed Spark and skipped it, or skipped it and needed it, is
seen."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from test_enrich_late_events import _rows, _setup

import cdc_lake.enrich.job as job
from cdc_lake.engines import DeltaRsEngine
from cdc_lake.enrich.fast_path import nothing_to_do
from cdc_lake.enrich.job import run_enrich


def _no_spark(*a, **k):  # type: ignore[no-untyped-def]
    raise AssertionError("Spark was started")


def _ids(tmp_path: Path) -> set:
    return {r["event_id"] for r in _rows(tmp_path / "gold/ev")}


def test_nothing_new_starts_no_spark_and_a_new_file_does(spark, tmp_path: Path, monkeypatch) -> None:
    cfg, landing = _setup(tmp_path)
    landing.land("a.json", [("e1", 1, "2026-01-02T10:00:00Z"), ("e2", 2, "2026-01-02T10:05:00Z")])
    run_enrich(cfg, spark=spark, run_id="r1")
    versions = {p: DeltaRsEngine(None).version(str(tmp_path / p)) for p in ("gold/ev", "gold/per_cat")}
    monkeypatch.setattr(job, "build_session", _no_spark)
    (landing.dir / ".b.json.tmp").write_text("{}\n")  # hidden: Spark's file source skips it
    (landing.dir / "c.json._COPYING_").write_text("{}\n")  # `hdfs dfs -put`'s temp name: skipped too
    s = run_enrich(cfg, run_id="r2")
    assert (s["batches"], s["facts_read"], s["engine"], s["pending_rows"]) == (0, 0, "deltalake", 0), s
    assert s["tables"]["enriched"] == versions["gold/ev"], s
    assert {p: DeltaRsEngine(None).version(str(tmp_path / p)) for p in versions} == versions
    landing.land("b.json", [("e3", 4, "2026-01-02T10:10:00Z")])
    with pytest.raises(AssertionError, match="Spark was started"):
        run_enrich(cfg, run_id="r3")
    run_enrich(cfg, spark=spark, run_id="r4")
    assert _ids(tmp_path) == {"e1", "e2", "e3"}
    assert run_enrich(cfg, run_id="r5")["batches"] == 0  # nothing new again: no Spark
    # a subfolder: Spark reads partition folders (``k=v``) of a file source; not decided here
    # (``_k=v`` too: not hidden for Spark, unlike other ``_`` names)
    for sub in ("_day=2026-01-02", "day=2026-01-02"):
        (landing.dir / sub).mkdir()
        with pytest.raises(AssertionError, match="Spark was started"):
            run_enrich(cfg, run_id="r6")
        (landing.dir / sub).rmdir()


def test_a_re_join_pass_due_goes_through_spark(spark, tmp_path: Path, monkeypatch) -> None:
    cfg, landing = _setup(tmp_path)
    landing.land("a.json", [("e1", 1, "2026-01-02T10:00:00Z")])
    landing.land("b.json", [("e2", 2, "2026-01-02T10:05:00Z")])
    b = landing.dir / "b.json"  # e2's product is not in the dimension yet: parked
    b.write_text(b.read_text().replace('"product_id": 1', '"product_id": 2'))
    os.utime(b, (landing.mtime, landing.mtime))
    s = run_enrich(cfg, spark=spark, run_id="r1")
    assert s["parked"] == 1 and _ids(tmp_path) == {"e1"}, s
    monkeypatch.setattr(job, "build_session", _no_spark)
    assert run_enrich(cfg, run_id="r2")["batches"] == 0  # parked, nothing changed: no Spark
    write_deltalake(str(tmp_path / "products"),
                    pa.table({"id": pa.array([2], pa.int64()), "cat": ["tools"]}), mode="append")
    with pytest.raises(AssertionError, match="Spark was started"):  # the member arrived
        run_enrich(cfg, run_id="r3")
    s = run_enrich(cfg, spark=spark, run_id="r4")
    assert s["rejoin"] and s["rejoin"]["released"] == 1 and _ids(tmp_path) == {"e1", "e2"}, s
    assert run_enrich(cfg, run_id="r5")["batches"] == 0


def test_an_uncommitted_batch_or_an_unfinished_reprocess_needs_spark(spark, tmp_path: Path) -> None:
    cfg, landing = _setup(tmp_path)
    now = datetime.now(timezone.utc)
    assert not nothing_to_do(cfg, DeltaRsEngine(None), now)  # no checkpoint yet
    landing.land("a.json", [("e1", 1, "2026-01-02T10:00:00Z")])
    run_enrich(cfg, spark=spark, run_id="r1")
    cp = cfg.checkpoint_path
    assert nothing_to_do(cfg, DeltaRsEngine(None), now)
    (cp / "enrich_reprocess.json").write_text("{}")
    assert not nothing_to_do(cfg, DeltaRsEngine(None), now)
    (cp / "enrich_reprocess.json").unlink()
    last = max(int(p.name) for p in (cp / "commits").iterdir() if p.name.isdigit())
    (cp / "commits" / str(last)).rename(cp / f"commit-{last}.aside")
    assert not nothing_to_do(cfg, DeltaRsEngine(None), now)  # Spark replays the batch


def test_a_change_feed_run_starts_spark_only_for_a_new_fact_version(spark, tmp_path: Path,
                                                                    monkeypatch) -> None:
    from deltalake import DeltaTable
    from test_enrich_job import Lake, base, lines, products

    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 2, "1.00", "2026-01-02T10:00:00")))
    base(lake, wait="1000h")
    run_enrich(lake.cfg, spark=spark, run_id="r1")
    outputs = ("gold/lines", "gold/rev")
    versions = {p: DeltaTable(lake.path(p)).version() for p in outputs}
    monkeypatch.setattr(job, "build_session", _no_spark)
    s = run_enrich(lake.cfg, run_id="r2")  # the fact table is where batch 0 read it to: no Spark
    assert (s["batches"], s["facts_read"], s["pending_rows"]) == (0, 0, 0), s
    assert {p: DeltaTable(lake.path(p)).version() for p in outputs} == versions
    lake.upsert("products", products((1, "apple", "pome")), "id")  # no fact waits for it
    assert run_enrich(lake.cfg, run_id="r3")["batches"] == 0
    lake.upsert("facts", lines((2, 1, 3, "2.00", "2026-01-02T11:00:00")), "line_id")
    with pytest.raises(AssertionError, match="Spark was started"):
        run_enrich(lake.cfg, run_id="r4")
    assert run_enrich(lake.cfg, spark=spark, run_id="r5")["facts_read"] == 1
    assert lake.rows("gold/lines", "line_id", "category") == [(1, "fruit"), (2, "pome")]
    assert run_enrich(lake.cfg, run_id="r6")["batches"] == 0  # read up to the latest again
    # `engine: auto` (the README's default): delta-rs reads the state, the summary says so
    from test_enrich_job import BASE_YAML
    lake.config(BASE_YAML.replace("WAIT", "1000h").replace("{name: deltalake}", "{name: auto}"))
    s = run_enrich(lake.cfg, run_id="r6b")
    assert (s["batches"], s["engine"]) == (0, "auto (not started: nothing new)"), s
    # a fact table behind the checkpoint (re-created, fewer versions): Spark, which stops it
    import shutil
    shutil.rmtree(lake.path("facts"))
    lake.create("facts", lines((1, 1, 2, "1.00", "2026-01-02T10:00:00")))
    with pytest.raises(AssertionError, match="Spark was started"):
        run_enrich(lake.cfg, run_id="r7")
