"""Bench case ``landing``: the flat cost against a long landing-file history, with and without
``source.archive_dir`` (issue 9: "the landing folder listed on every run").

Three pipelines on the same kind of data get the same increments, their runs alternating:
``none`` (the reference), ``plain`` and ``archive`` (with ``source.archive_dir``). After two
increments, ``plain`` and ``archive`` get ``files`` one-line files landed and ingested in one
run (the file history a pipeline gathers over months of scheduled runs); then one increment
(with the archive on, Spark moves the history's files when it plans that run's batch: timed
apart as ``archive_move_s``); then, in a new Spark session (a scheduled run is a new driver),
one warm-up increment and 3 timed ones: each mode's median against ``none``'s is the flat-cost
ratio of 15,000 files of history.

The history's events are changes of a table the pipeline ignores (``ignore_tables``), so the
Delta tables do not grow with it: what is left to grow is what the file history costs (the
landing folder Spark and the job's checks list, the file source's metadata log). At 15,000
files Spark's ``load()`` of the folder alone took 0.4-0.5 s warm (it lists the folder for
partition columns, even with a schema given; 0.02 s on the archived folder), and the stream's
time outside its micro-batch was 1.9-2.2 s against 0.7-1.3 s with the archive and 0.6 s with
no history (2026-12-01, query progress vs. wall time, 3 runs each). Grown tables
are the ``flat`` case's subject (measured with maintenance there); here, with 15,000 events
merged and no maintenance, they made both modes 1.5x slower (2026-12-01).

Example::

    python benchmarks/bench.py --cases landing --landing-files 15000
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_ingest as bi  # noqa: E402


IGNORED = "audit_log"


def _yaml(base: Path, archive: bool) -> Path:
    import yaml

    path = bi.pipeline_yaml(base, None)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["ignore_tables"] = [f"shop.{IGNORED}"]
    if archive:
        raw["pipeline"] = "bench_landing_archive"
        raw["source"]["archive_dir"] = str(base / "archive")
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def _land_history(folder: Path, files: int) -> None:
    """``files`` files of one Maxwell insert each into the ignored table, older than any
    increment's (file times one second apart, in the past: the stream takes them in order)."""
    now = time.time() - files - 10
    for i in range(files):
        line = json.dumps({"database": "shop", "table": IGNORED, "type": "insert",
                           "ts": int(now) + i, "xid": 9_000_000 + i, "xoffset": 0,
                           "position": f"mysql-bin.000009:{4 + i}",
                           "data": {"id": i, "action": "login", "actor": f"user{i % 97}"}})
        path = folder / f"audit-{i:06d}.json"
        path.write_text(line + "\n", encoding="utf-8")
        os.utime(path, (now + i, now + i))


def _against_history(lakes: dict[str, tuple[Any, Any]], run: Callable[..., Any],
                     increment: Callable[[str], None], history: Callable[[str], None],
                     folder: Callable[[Any], Path], files: int, events: int) -> dict[str, Any]:
    """The runs of ``lakes`` (mode -> (landing, cfg); ``none``, ``plain``, ``archive``)
    alternating: two increments, the history (``history(mode)``), one increment (the archive
    moves the history's files in it), then in a new session one warm-up and 3 timed increments.
    ``none``'s median is the reference of ``plain``'s and ``archive``'s."""
    from cdc_lake.spark_session import build_session

    modes = tuple(lakes)
    spark = build_session(lakes["plain"][1], app_name="bench-landing")

    def timed(mode: str, tag: str, with_history: bool = False) -> float:
        (history if with_history else increment)(mode)
        t0 = time.perf_counter()
        run(lakes[mode][1], spark=spark, run_id=tag)
        return round(time.perf_counter() - t0, 3)

    def each(tag: str) -> dict[str, float]:
        return {m: timed(m, tag) for m in modes}

    for i in range(2):
        each(f"b{i}")
    history_s = {m: timed(m, "history", with_history=True) for m in modes}
    move_s = each("move")  # with the archive on, Spark moves the history's files in this run
    # A scheduled run is a new driver: the timed runs get a new Spark session (in this JVM),
    # warmed by one run of each. (In the session that had just ingested the 15,000 files every
    # run was ~3 s slower, with or without the archive: the C1 driver's full code cache,
    # fixed since; 2026-12-01.)
    spark.stop()
    spark = build_session(lakes["plain"][1], app_name="bench-landing-timed")
    each("warm")
    after = [each(f"a{i}") for i in range(3)]
    spark.stop()
    out: dict[str, Any] = {"history_files": files, "events_per_run": events,
                           "none_history_run_s": history_s["none"]}
    ref = statistics.median(r["none"] for r in after)
    out["none_s"] = round(ref, 3)
    for mode in ("plain", "archive"):
        last = statistics.median(r[mode] for r in after)
        out[mode] = {"history_run_s": history_s[mode], "archive_move_s": move_s[mode],
                     "after_s": [r[mode] for r in after], "none_s": [r["none"] for r in after],
                     "first_s": round(ref, 3), "last_s": round(last, 3),
                     "ratio": round(last / ref, 2),
                     "landing_files_now": sum(1 for _ in os.scandir(folder(lakes[mode][1])))}
        print(f"[bench] landing {mode}: {files} files of history {last:.2f} s, none {ref:.2f} s",
              flush=True)
    out["archive_vs_plain"] = round(out["archive"]["last_s"] / out["plain"]["last_s"], 2)
    return out


def case_landing(work: Path, files: int, events: int, landing_cls: Any) -> dict[str, Any]:
    """``landing_cls``: bench.Landing (continuous Maxwell files from one generator). Three
    pipelines get the same increments, their runs alternating so that a sitting's drift touches
    them alike: ``none`` never gets the file history (the reference; its history run lands
    nothing), ``plain`` gets it, and ``archive`` gets it with ``source.archive_dir``."""
    from cdc_lake.cdc.job import run_pipeline
    from cdc_lake.config import load_pipeline

    lakes = {}
    for mode in ("none", "plain", "archive"):
        base = work / f"landing-{mode}"
        lakes[mode] = (landing_cls(base / "landing", seed=17),
                       load_pipeline(_yaml(base, mode == "archive")))

    def history(mode: str) -> None:
        if mode != "none":
            _land_history(lakes[mode][1].landing_path, files)

    return _against_history(lakes, run_pipeline, lambda m: lakes[m][0].add(events, 1), history,
                            lambda cfg: cfg.landing_path, files, events)


def case_events_landing(work: Path, files: int, events: int) -> dict[str, Any]:
    """The same for an events enrichment pipeline, with ``fact.events.archive_dir``. Here the
    history's events are enriched (an events pipeline has no table to ignore), so ``none`` gets
    the same events too, in one file: the three pipelines' tables are alike, the file count is
    what differs."""
    import yaml
    from bench_enrich import _events_lake

    from cdc_lake.config import load_pipeline
    from cdc_lake.enrich.job import run_enrich

    lakes = {}
    for mode in ("none", "plain", "archive"):
        landing, yml = _events_lake(work / f"events-landing-{mode}", seed=19)
        if mode == "archive":
            doc = yaml.safe_load(yml.read_text(encoding="utf-8"))
            doc["fact"]["events"]["archive_dir"] = str(yml.parent / "archive")
            yml.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        lakes[mode] = (landing, load_pipeline(yml))

    def history(mode: str) -> None:
        lakes[mode][0].land(files, 1 if mode == "none" else files)

    return _against_history(lakes, run_enrich, lambda m: lakes[m][0].land(events, 1), history,
                            lambda cfg: cfg.fact.events.path, files, events)
