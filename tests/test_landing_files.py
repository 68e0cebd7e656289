"""Landing folders as users fill them: files that vanish mid-run, names Spark takes for glob
patterns, sub-folders, a ``glob:`` that matches nothing (testers, 2026-11-29)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
import time

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from job_helpers import event, land, pipeline, rows, run_cli, stream_stage_tasks

import cdc_lake.cdc.batch_writer as bw
from cdc_lake.cdc.job import run_pipeline
from cdc_lake.checkpoint_log import last_committed_batch
from cdc_lake.sources.landing_files import LandedFileMissing


def _moving(real, src, dst):  # type: ignore[no-untyped-def]
    """``real`` (a step of the batch: the CDC survey, the enrichment's fact rows), moving
    ``src`` to ``dst`` on its first call while ``src`` is there: inside a running batch, after
    the run listed the folder, so the timing is the same on every machine."""
    def step(*a, **k):  # type: ignore[no-untyped-def]
        if src.exists():
            shutil.move(src, dst)
        return real(*a, **k)
    return step


def test_a_file_moved_away_after_the_run_listed_it_stops_the_batch_and_comes_back_whole(spark, tmp_path,
                                                                                           monkeypatch):
    """Trigger.AvailableNow lists the folder once; with one file per batch, a file moved away
    while batch 0 runs is skipped by Spark's read of batch 1 with a WARN only, and the batch
    committed as if read: its changes lost for good (tester: exit 0). Now batch 1 stops
    uncommitted (exit 3, the file named) and the printed recovery (put it back, run again)
    gives every row."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "f0.json", event(1), event(2))
    f1 = land(cfg.landing_path, "f1.json", event(3), event(4, typ="update", status="late"))
    mtime = os.stat(f1).st_mtime_ns
    away = tmp_path / "away.json"
    real_survey = bw.survey

    # during batch 0: the run has listed both files already
    monkeypatch.setattr(bw, "survey", _moving(real_survey, f1, away))
    with pytest.raises(LandedFileMissing) as e:
        run_pipeline(cfg, spark=spark, run_id="r1", max_files_per_trigger=1)
    monkeypatch.setattr(bw, "survey", real_survey)
    msg = str(e.value)
    assert "micro-batch 1" in msg and str(f1) in msg and "touch -m -d @" in msg, msg
    assert last_committed_batch(cfg.checkpoint_path) == 0  # batch 1 not recorded as read
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2"}

    r = run_cli(spark, cfg.file, "--max-files-per-trigger", "1")  # the next try, file still away: the same stop, exit 3
    assert r.returncode == 3 and "NEEDS RECOVERY" in r.stderr and str(f1) in r.stderr, r.stderr

    shutil.copy(away, f1)  # put back by a copy with a new time: the printed touch restores it
    touch = re.search(r"a copy with a new time: `(touch -m -d @[^`]+)`", msg).group(1)
    subprocess.run(touch, shell=True, check=True)
    assert abs(os.stat(f1).st_mtime_ns - mtime) < 1_000_000
    s = run_pipeline(cfg, spark=spark, run_id="r3", max_files_per_trigger=1)
    assert s["status"] == "succeeded" and s["batch_ids"] == [1], s
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2", 3: "s3", 4: "late"}
    assert run_pipeline(cfg, spark=spark, run_id="r4")["batches"] == 0  # nothing new, no stop

    # gone after its own batch was planned, before Spark opened it: Spark's read fails
    # (FILE_NOT_EXIST, was exit 1 without the file named); now the same stop, exit 3
    f2 = land(cfg.landing_path, "f2.json", event(5))

    monkeypatch.setattr(bw, "survey", _moving(real_survey, f2, away))
    with pytest.raises(LandedFileMissing) as e:
        run_pipeline(cfg, spark=spark, run_id="r5")
    monkeypatch.setattr(bw, "survey", real_survey)
    assert "micro-batch 2" in str(e.value) and str(f2) in str(e.value), e.value
    shutil.move(away, f2)
    run_pipeline(cfg, spark=spark, run_id="r6")
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2", 3: "s3", 4: "late", 5: "s5"}


def test_an_event_file_moved_away_mid_run_stops_the_enrichment_batch_and_comes_back_whole(
        spark, tmp_path, monkeypatch):
    """The same for an enrichment's events folder: the batch whose file went away stops
    uncommitted (no output row of it), and once the file is back every event is enriched. From
    the third batch on the job reads a batch's files a second time (events Spark's dedup
    dropped as late), which failed first on the missing file (second tester: exit 1,
    PATH_NOT_FOUND); a file compressed in place is not read twice and arrives as a new file."""
    import gzip

    from test_enrich_late_events import _rows, _setup

    import cdc_lake.enrich.writer as ew
    from cdc_lake.enrich.job import run_enrich

    cfg, landing = _setup(tmp_path)
    landing.land("a.json", [("e1", 1, "2026-01-02T10:00:00Z")])
    landing.land("b.json", [("e2", 2, "2026-01-02T10:30:00Z")])
    landing.land("c.json", [("e3", 4, "2026-01-02T10:40:00Z")])
    c, away = landing.dir / "c.json", tmp_path / "c.json"
    real = ew.fact_rows

    # batch 0 (a.json): the run has listed every file
    monkeypatch.setattr(ew, "fact_rows", _moving(real, c, away))
    with pytest.raises(LandedFileMissing) as e:
        run_enrich(cfg, spark=spark, run_id="r1")
    monkeypatch.setattr(ew, "fact_rows", real)
    assert "micro-batch 2" in str(e.value) and str(c) in str(e.value), e.value
    assert {r["event_id"] for r in _rows(tmp_path / "gold/ev")} == {"e1", "e2"}

    shutil.move(away, c)  # put back with its time (mv)
    s = run_enrich(cfg, spark=spark, run_id="r2")
    assert {r["event_id"] for r in _rows(tmp_path / "gold/ev")} == {"e1", "e2", "e3"}, s
    assert [(r["category"], r["units"]) for r in _rows(tmp_path / "gold/per_cat")] == [("fruit", 7)]

    # gone after its own batch was planned, before Spark opened it: Spark's read fails
    # (FILE_NOT_EXIST, was exit 1 without the file named); now the same stop, exit 3
    d = landing.dir / "d.json"
    landing.land("d.json", [("e4", 8, "2026-01-02T10:50:00Z")])

    monkeypatch.setattr(ew, "fact_rows", _moving(real, d, away))
    with pytest.raises(LandedFileMissing) as e:
        run_enrich(cfg, spark=spark, run_id="r3")
    monkeypatch.setattr(ew, "fact_rows", real)
    assert "micro-batch" in str(e.value) and str(d) in str(e.value), e.value  # (ids: no-data batches too)
    shutil.move(away, d)

    # compressed in place while a run is going: not missing; its events come as y.json.gz
    landing.land("x.json", [("e5", 16, "2026-01-02T10:55:00Z")])
    landing.land("y.json", [("e6", 32, "2026-01-02T10:56:00Z")])
    y = landing.dir / "y.json"

    def fact_rows_gzipping_y(*a, **k):  # type: ignore[no-untyped-def]
        if y.exists():  # during an earlier batch of the run: y.json is listed already
            y.with_name("y.json.gz").write_bytes(gzip.compress(y.read_bytes()))
            y.unlink()
        return real(*a, **k)

    monkeypatch.setattr(ew, "fact_rows", fact_rows_gzipping_y)
    run_enrich(cfg, spark=spark, run_id="r4")
    monkeypatch.setattr(ew, "fact_rows", real)
    run_enrich(cfg, spark=spark, run_id="r5")
    assert {r["event_id"] for r in _rows(tmp_path / "gold/ev")} == {f"e{i}" for i in range(1, 7)}
    assert [(r["category"], r["units"]) for r in _rows(tmp_path / "gold/per_cat")] == [("fruit", 63)]


def test_landing_names_spark_would_read_wrongly_stop_before_anything_is_read(spark, tmp_path, capsys):
    """Glob characters in a file name (Spark re-read every other file of the batch per such
    name: counts and the quarantine share wrong, exit 0) and key=value sub-folders next to
    top-level files (every run failed with a Spark exception) stop at once with exit 2 naming
    them; plain sub-folders and a glob that matches nothing get a warning line."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", event(1))
    odd = land(cfg.landing_path, "b[1].json", event(2))
    r = run_cli(spark, cfg.file)
    assert r.returncode == 2 and "'b[1].json'" in r.stderr and "glob pattern" in r.stderr, r.stderr
    assert not cfg.tables["orders"].path.exists()
    odd.rename(cfg.landing_path / "b1.json")

    part = cfg.landing_path / "dt=2026-11-29"
    part.mkdir()
    land(part, "c.json", event(3))
    r = run_cli(spark, cfg.file)
    assert r.returncode == 2 and "'dt=2026-11-29'" in r.stderr and "top level" in r.stderr, r.stderr
    assert not cfg.tables["orders"].path.exists()
    part.rename(cfg.landing_path / "archive")  # a plain sub-folder: not read, said so
    capsys.readouterr()
    s = run_pipeline(cfg, spark=spark, run_id="r1")
    out = capsys.readouterr().out
    assert "1 sub-folder(s)" in out and "archive" in out, out
    assert s["events_read"] == 2 and rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2"}

    (tmp_path / "p.yaml").write_text((tmp_path / "p.yaml").read_text().replace(
        "database: shop}", "database: shop, glob: '*.jsn'}"))
    land(cfg.landing_path, "d.json", event(4))
    r = run_cli(spark, cfg.file)
    assert r.returncode == 0, r.stderr
    assert "3 landing file(s)" in r.stdout and "'*.jsn'" in r.stdout and "d.json" in r.stdout, r.stdout
    assert re.search(r"customers +\+0 ~0 -0 -> no table yet", r.stdout), r.stdout  # not "version None"


def test_a_composite_key_quarantine_reason_names_only_the_missing_columns(spark, tmp_path):
    """Tester: a row with order_id null and line_no present was quarantined as missing
    ['order_id', 'line_no']."""
    from deltalake import DeltaTable

    cfg = pipeline(tmp_path, extra="  lines: {keys: [order_id, line_no]}\n")
    land(cfg.landing_path, "l.json", event(1, table="lines", order_id=None, line_no=3),
         event(2, table="lines", order_id=7), event(3, table="lines", line_no=None),
         event(4, table="lines", order_id=7, line_no=1))
    s = run_pipeline(cfg, spark=spark, run_id="r1")
    assert s["quarantined"] == 3, s
    reasons = sorted(r["reason"] for r in DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().to_pylist())
    key = "of the key ['order_id', 'line_no']"
    assert reasons == [f"missing key column(s) ['line_no'] {key}",  # event 2
                       f"missing key column(s) ['order_id', 'line_no'] {key}",  # event 3: neither
                       f"missing key column(s) ['order_id'] {key}"], reasons  # event 1: null


def test_a_batch_of_many_small_files_is_read_in_one_task_per_core(spark, tmp_path, monkeypatch):
    """Spark's file source counts each file as 4 MiB (``openCostInBytes``) when it packs files
    into read tasks, so a batch of one-line files was read in one task per ~32 files and every
    stage over its rows ran as many (1,000 files: 6.9 s against 2.8 s for the same 1,000 events
    in one file, warm session, 2026-12-01). The batch is now coalesced to one task per 32 MiB of
    its files, at least one per core (``read_partitions``), and its rows are the same."""
    cores = spark.sparkContext.defaultParallelism
    files = 100 * cores
    cfg = pipeline(tmp_path)
    for i in range(files):
        land(cfg.landing_path, f"f{i:05d}.json", event(i, typ="insert"))
    planned = spark.read.text(str(cfg.landing_path)).rdd.getNumPartitions()
    assert planned > 2 * cores, planned  # what Spark plans for them: the test can see a change
    seen: list[int] = []
    real = bw.survey

    def survey(ev, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(ev.rdd.getNumPartitions())  # the batch rows every later step reads
        return real(ev, *a, **k)

    monkeypatch.setattr(bw, "survey", survey)
    s, tasks = stream_stage_tasks(spark, lambda: run_pipeline(cfg, spark=spark, run_id="r1"))
    assert seen == [cores], (seen, planned)
    # and no stage of the run had more tasks than the job's shuffle partitions (max(4, 2 x
    # cores), spark_session): neither a read task per 32 files, nor a listing job of one task
    # per file (Spark lists more than 32 paths with a Spark job: a stream's batch names each)
    assert tasks and max(tasks.values()) <= max(4, 2 * cores) < files, tasks
    assert s["events_read"] == files and rows(cfg.tables["orders"].path) == {
        i: f"s{i}" for i in range(files)}


def test_an_events_batch_of_many_small_files_lists_them_on_the_driver_and_keeps_late_ones(
        spark, tmp_path, monkeypatch):
    """The same for an enrichment's events folder: a micro-batch of more than 32 files made
    Spark list them with a Spark job of one task per file, twice from its third batch on (the
    stream's own read, and the job's second read of the batch's files for the events Spark's
    dedup dropped as late): 1,000 one-line files 14.5 s against 2.6 s in one file (warm session,
    2026-12-01). Now no stage has a task per file, and the truth holds: with the watermark one
    hour behind the newest event of the batches before, every event at or before it is late
    (quarantined, Spark's own drops included), every other one enriched."""
    from test_enrich_late_events import YAML, _rows

    from cdc_lake.config import load_pipeline
    from cdc_lake.enrich.job import run_enrich

    write_deltalake(str(tmp_path / "products"), pa.table({"id": pa.array([1], pa.int64()),
                                                          "cat": ["fruit"]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    f = tmp_path / "p.yaml"
    f.write_text(textwrap.dedent(YAML.replace("TRIGGER", "available_now").replace(
        "ID_TYPE", "string").replace("max_files_per_trigger: 1", "max_files_per_trigger: 100000")))
    cfg = load_pipeline(f)
    folder = tmp_path / "landing"
    folder.mkdir()
    stamp = [time.time() - 100_000]

    def land_events(name: str, *events: tuple[str, str]) -> None:
        (folder / name).write_text("".join(json.dumps(
            {"event_id": i, "product_id": 1, "qty": 1, "event_ts": t}) + "\n" for i, t in events))
        stamp[0] += 10
        os.utime(folder / name, (stamp[0], stamp[0]))

    land_events("a.json", ("a", "2026-01-02T10:00:00Z"))
    run_enrich(cfg, spark=spark, run_id="r1")  # batch 0
    land_events("b.json", ("b", "2026-01-02T12:00:00Z"))
    run_enrich(cfg, spark=spark, run_id="r2")  # batch 1: the watermark is now 11:00
    files = 100 * spark.sparkContext.defaultParallelism
    # batch 2: one event per file; Spark's dedup drops those at or before the watermark the
    # batch before used (09:00), the job finds those after it up to 11:00
    times = ["08:30", "10:30", "13:00"]
    expect: dict[str, set[str]] = {t: set() for t in times}
    for n in range(files):
        t = times[n % 3]
        land_events(f"e{n:05d}.json", (f"e{n}", f"2026-01-02T{t}:00Z"))
        expect[t].add(f"e{n}")
    import cdc_lake.enrich.fact_source as fs

    reread: list[int] = []
    real = fs.dropped_late_events

    def dropped_late_events(*a, **k):  # type: ignore[no-untyped-def]
        found = real(*a, **k)
        reread.append(-1 if found is None else found[0].rdd.getNumPartitions())
        return found

    monkeypatch.setattr(fs, "dropped_late_events", dropped_late_events)
    _, tasks = stream_stage_tasks(spark, lambda: run_enrich(cfg, spark=spark, run_id="r3"))
    assert tasks and max(tasks.values()) < files // 2, tasks  # no listing job of a task per file
    # the second read of the batch's files: one task per core, as a CDC batch's read
    assert reread == [spark.sparkContext.defaultParallelism], reread
    enriched = {r["event_id"] for r in _rows(tmp_path / "gold/ev")}
    assert enriched == {"a", "b"} | expect["13:00"], len(enriched)
    late = {json.loads(r["raw_line"])["event_id"] for r in _rows(tmp_path / "gold/_quarantine")
            if r["reason"].startswith("late event")}
    assert late == expect["08:30"] | expect["10:30"], len(late)
