"""Bench case ``files``: the cost of many small landing files. The same increment of ``events``
changes lands as one file on one pipeline and as ``files`` files (one or a few lines each) on
another of the same kind; their runs alternate in one warm Spark session, for a CDC pipeline
(Maxwell files) and an events enrichment pipeline (JSON event files). The ratio is the
many-files run's median over the one-file run's.

What made many files cost (2026-12-01, 1,000 one-line files against one file of the same 1,000
events, warm session): Spark's file source packs files into read tasks counting each as at
least 4 MiB (``spark.sql.files.openCostInBytes``), so the batch was read in about 32 tasks and
every later stage over its rows ran as many (CDC 6.9 against 2.8 s); and a micro-batch of more
than 32 files was listed by a Spark job of one task per file (events: 14.4 against 2.6 s). Now a
batch is coalesced to one partition per 32 MiB of its files, at least one per core
(``landing_files.read_partitions``), and a local batch's files are listed on the driver
(``landing_files.driver_listing_conf``).

Example::

    python benchmarks/bench.py --cases files --small-files 800
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_enrich as be  # noqa: E402
import bench_ingest as bi  # noqa: E402


def _alternate(run: Callable[[str, str, int], float], files: int, reps: int) -> dict[str, Any]:
    for mode in ("one", "many"):
        run(mode, "base", 4)  # a lake to land on, and the session's warm-up
    one, many = [], []
    for i in range(reps):
        one.append(run("one", f"r{i}", 1))
        many.append(run("many", f"r{i}", files))
    o, m = statistics.median(one), statistics.median(many)
    return {"one_s": one, "many_s": many, "median_one_s": round(o, 3),
            "median_many_s": round(m, 3), "ratio": round(m / o, 2)}


def case_files(work: Path, files: int, events: int, reps: int, landing_cls: Any) -> dict[str, Any]:
    """``landing_cls``: bench.Landing (continuous Maxwell files from one generator). ``files``
    is at most ``events`` (one event per file)."""
    files = min(files, events)
    from cdc_lake.cdc.job import run_pipeline
    from cdc_lake.config import load_pipeline
    from cdc_lake.enrich.job import run_enrich
    from cdc_lake.spark_session import build_session

    spark: Any = None

    def runner(lakes: dict[str, tuple[Any, Any]], land: str, run: Callable[..., Any]):  # type: ignore[no-untyped-def]
        def timed(mode: str, tag: str, n: int) -> float:
            landing, cfg = lakes[mode]
            getattr(landing, land)(events, n)
            t0 = time.perf_counter()
            run(cfg, spark=spark, run_id=tag)
            return round(time.perf_counter() - t0, 3)
        return timed

    cdc = {m: (landing_cls(work / f"files-{m}" / "landing", seed=5),
               load_pipeline(bi.pipeline_yaml(work / f"files-{m}", None))) for m in ("one", "many")}
    spark = build_session(cdc["one"][1], app_name="bench-files")
    out: dict[str, Any] = {"files": files, "events": events, "reps": reps}
    out["cdc"] = _alternate(runner(cdc, "add", run_pipeline), files, reps)
    evs = {}
    for m in ("one", "many"):
        landing, yml = be._events_lake(work / f"files-events-{m}", seed=6)
        evs[m] = (landing, load_pipeline(yml))
    out["events_source"] = _alternate(runner(evs, "land", run_enrich), files, reps)
    for key in ("cdc", "events_source"):
        print(f"[bench] files, {key}: {out[key]['median_many_s']} s in {files} files, "
              f"{out[key]['median_one_s']} s in one", flush=True)
    spark.stop()
    return out
