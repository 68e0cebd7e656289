"""Bench case ``landing``: the flat cost against a long landing-file history, with and without
``source.archive_dir`` (issue 9: "the landing folder listed on every run").

One warm session serves two pipelines on the same kind of data, one per mode. For each: the
same increment a few times onto an empty lake (the baseline: the median of runs 2-4), then
``files`` one-line files landed and ingested in one run (the file history a pipeline gathers
over months of scheduled runs), then one increment (with the archive on, Spark moves the
history's files when it plans that run's batch: timed apart as ``archive_move_s``), then the
same increment 3 more times (the median against the baseline: the flat-cost ratio).

Example::

    python benchmarks/bench.py --cases landing --landing-files 15000
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_ingest as bi  # noqa: E402


def _yaml(base: Path, archive: bool) -> Path:
    path = bi.pipeline_yaml(base, None)
    if archive:
        import yaml

        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        raw["pipeline"] = "bench_landing_archive"
        raw["source"]["archive_dir"] = str(base / "archive")
        path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def case_landing(work: Path, files: int, events: int, landing_cls: Any) -> dict[str, Any]:
    """``landing_cls``: bench.Landing (continuous Maxwell files from one generator)."""
    from cdc_lake.cdc.job import run_pipeline
    from cdc_lake.config import load_pipeline
    from cdc_lake.spark_session import build_session

    out: dict[str, Any] = {"history_files": files, "events_per_run": events}
    spark = None
    for mode in ("plain", "archive"):
        base = work / f"landing-{mode}"
        landing = landing_cls(base / "landing", seed=17)
        cfg = load_pipeline(_yaml(base, mode == "archive"))
        if spark is None:
            spark = build_session(cfg, app_name="bench-landing")

        def run(tag: str, n: int = events, k: int = 1) -> float:
            landing.add(n, k)
            t0 = time.perf_counter()
            run_pipeline(cfg, spark=spark, run_id=tag)
            return round(time.perf_counter() - t0, 3)

        before = [run(f"b{i}") for i in range(4)]
        history_s = run("history", files, files)  # one event per file
        move_s = run("move")
        after = [run(f"a{i}") for i in range(3)]
        first = statistics.median(before[1:])  # run 1 pays the warm-up
        last = statistics.median(after)
        out[mode] = {"before_s": before, "history_run_s": history_s, "archive_move_s": move_s,
                     "after_s": after, "first_s": round(first, 3), "last_s": round(last, 3),
                     "ratio": round(last / first, 2),
                     "landing_files_now": sum(1 for _ in os.scandir(cfg.landing_path))}
        print(f"[bench] landing {mode}: {files} files of history, {first:.2f} -> {last:.2f} s",
              flush=True)
    assert spark is not None
    spark.stop()
    out["archive_vs_plain"] = round(out["archive"]["last_s"] / out["plain"]["last_s"], 2)
    return out
