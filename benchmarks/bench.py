"""cdc-lake benchmark: every figure of the performance targets, side by side in one run.

Not a test (no timing assertions anywhere). ``make bench`` runs the full size and rewrites
``docs/benchmarks.md`` + ``docs/img/bench-*.png`` + ``benchmarks/results/bench.json``;
``--quick`` is the CI smoke size (tiny data, one repetition; it writes to a temp folder unless
``--out`` is given, so CI never overwrites the committed report).

Cases (Maxwell files of a 4-table shop, engine deltalake, same Spark settings everywhere):

1. small increment — spark-submit wall time of the job on ``--small-events`` new events (2
   files) on top of an existing lake, vs. spark-submit of a script that only reads and counts
   the same new files (``spark.read.text(files).count()``), alternating, median of ``--reps``;
2. large batch — ``--large-events`` events in ``--large-files`` files into an empty lake vs. a
   plain ``spark.read.json(files).count()``, each in a fresh process, median of ``--reps``;
   events/s and peak RSS of the process tree (Python driver + JVM + delta-rs);
3. flat cost — one process runs the same-size increment ``--history`` times; run time vs. the
   number of earlier runs (first vs. 10th/50th/100th);
4. peer — at the end of (3), a naive full recompute of the same tables (read the whole landing
   history, latest row per key, overwrite) vs. one incremental run, in the same process.

Usage::

    python benchmarks/bench.py                # full size (~15-25 min on 2 cores)
    python benchmarks/bench.py --quick        # CI smoke (~1-2 min)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(HERE))

import bench_ingest as bi  # noqa: E402  (generator, RSS sampler, phase runner)

SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
COMMON_CONF = ["--master", "local[2]", "--conf", "spark.sql.session.timeZone=UTC",
               "--conf", "spark.ui.enabled=false", "--conf", f"spark.pyspark.python={sys.executable}"]
# spark-submit's launcher scripts look up python/java on PATH: the venv first
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
TARGETS = {"small": 1.3, "large": 1.5, "flat": 1.2, "peer": 10.0}
COUNT_SCRIPT = '''
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("bench-count").getOrCreate()
print("COUNT", spark.read.text(sys.argv[1:]).count())
spark.stop()
'''


class Landing:
    """Maxwell files from one continuous generator, so increments follow the history."""

    def __init__(self, folder: Path, seed: int) -> None:
        self.folder, self.gen, self.n = folder, bi.Generator(seed), 0
        folder.mkdir(parents=True, exist_ok=True)

    def add(self, events: int, files: int) -> list[Path]:
        lines, out = self.gen.lines(events), []
        per = -(-len(lines) // files)
        for i in range(files):
            chunk = lines[i * per:(i + 1) * per]
            if chunk:
                path = self.folder / f"maxwell-{self.n:06d}.json"
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text("\n".join(chunk) + "\n", encoding="utf-8")
                os.replace(tmp, path)
                out.append(path)
                self.n += 1
        return out


def _wall(cmd: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    with open(log, "a") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=1800, env=ENV)
    if r.returncode != 0:
        raise SystemExit(f"failed (exit {r.returncode}): {' '.join(cmd)}\n{log.read_text()[-3000:]}")
    return time.perf_counter() - t0


def case_small(work: Path, events: int, reps: int, base_events: int) -> dict[str, Any]:
    base = work / "small"
    landing = Landing(base / "landing", seed=11)
    landing.add(base_events, 4)
    cfg = bi.pipeline_yaml(base, None)
    job = [SPARK_SUBMIT, *COMMON_CONF, str(REPO / "spark_jobs" / "cdc_ingest.py"), "--pipeline", str(cfg)]
    log = work / "small.log"
    _wall([*job, "--run-id", "base"], log)  # the existing lake the increments land on
    count_py = work / "count.py"
    count_py.write_text(COUNT_SCRIPT)
    job_s, count_s = [], []
    for i in range(reps):
        new = landing.add(events, 2)
        count_s.append(_wall([SPARK_SUBMIT, *COMMON_CONF, str(count_py), *map(str, new)], log))
        job_s.append(_wall([*job, "--run-id", f"inc{i}"], log))
    j, c = statistics.median(job_s), statistics.median(count_s)
    return {"events": events, "reps": reps, "job_wall_s": job_s, "count_wall_s": count_s,
            "median_job_s": round(j, 2), "median_count_s": round(c, 2), "ratio": round(j / c, 2)}


def case_large(work: Path, events: int, files: int, reps: int) -> dict[str, Any]:
    base = work / "large"
    info = bi.generate(base / "landing", events, files, seed=7)
    cfg = bi.pipeline_yaml(base, None)
    scans, ingests = [], []
    for _ in range(reps):
        shutil.rmtree(base / "lake", ignore_errors=True)
        scans.append(bi.spawn_phase("scan", cfg, 0.2, work))
        ingests.append(bi.spawn_phase("ingest", cfg, 0.2, work))
    s = statistics.median(r["seconds"] for r in scans)
    i = statistics.median(r["seconds"] for r in ingests)
    return {"events": info["events"], "files": info["files"], "bytes": info["bytes"], "reps": reps,
            "scan_s": [r["seconds"] for r in scans], "ingest_s": [r["seconds"] for r in ingests],
            "median_scan_s": round(s, 2), "median_ingest_s": round(i, 2), "ratio": round(i / s, 2),
            "events_per_s": round(info["events"] / i),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in ingests),
            "batch_log": ingests[-1].get("job_batch_log", [])}


def _naive_recompute(spark: Any, cfg: Any) -> float:
    """The peer: whole landing history -> latest row per key -> overwrite (no checkpoint)."""
    from deltalake import write_deltalake
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    raw = spark.read.json(str(cfg.landing_path / "maxwell-*.json"))
    pos = F.split("position", ":")
    seq = F.struct(F.split(pos[0], r"\.")[1].cast("int").alias("f"), pos[1].cast("long").alias("p"),
                   F.col("xoffset").alias("x"))
    for name, t in cfg.tables.items():
        cols = [F.col(f"data.{c}").alias(c) for c in raw.schema["data"].dataType.fieldNames()
                if c in _columns(name)]
        keys = list(t.keys)
        w = Window.partitionBy(*[F.col(f"data.{k}") for k in keys]).orderBy(seq.desc())
        latest = (raw.where(F.col("table") == name).withColumn("_rn", F.row_number().over(w))
                  .where("_rn = 1").where(F.col("type") != "delete").select(*cols))
        write_deltalake(str(cfg.lake_root / "_peer" / name), latest.toArrow(), mode="overwrite",
                        schema_mode="overwrite")
    return time.perf_counter() - t0


def _columns(table: str) -> set[str]:
    g = bi.Generator(0)
    return set(g._row(table).keys()) | set(bi.TABLES[table])


def case_flat_and_peer(work: Path, history: int, events: int, marks: list[int]) -> dict[str, Any]:
    from cdc_lake.cdc.job import run_pipeline
    from cdc_lake.config import load_pipeline
    from cdc_lake.spark_session import build_session

    base = work / "flat"
    landing = Landing(base / "landing", seed=13)
    cfg = load_pipeline(bi.pipeline_yaml(base, None))
    spark = build_session(cfg, app_name="bench-flat")
    times = []
    for i in range(history):
        landing.add(events, 1)
        t0 = time.perf_counter()
        run_pipeline(cfg, spark=spark, run_id=f"h{i}")
        times.append(round(time.perf_counter() - t0, 3))
        if (i + 1) % 10 == 0:
            print(f"[bench] flat: {i + 1}/{history} runs, last {times[-1]} s", flush=True)
    # run 1 pays the JVM's warm-up; "after 1 earlier run" (run 2) is the baseline
    first = statistics.median(times[1:4])
    at = {m: round(statistics.median(times[max(1, m - 1):m + 2]), 3) for m in marks if m < history}
    recompute = [_naive_recompute(spark, cfg) for _ in range(2)]
    spark.stop()
    inc = statistics.median(times[-3:])
    return {"events_per_run": events, "history": history, "run_s": times,
            "first_s": round(first, 3), "at": at, "ratio_last_first": round(inc / first, 2),
            "recompute_s": [round(x, 3) for x in recompute],
            "peer_ratio": round(min(recompute) / inc, 2)}


def plots(res: dict[str, Any], img: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    out = []
    f = res["flat"]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(range(1, len(f["run_s"]) + 1), f["run_s"], ".", label="incremental run")
    ax.axhline(min(f["recompute_s"]), color="C3", label="naive full recompute")
    ax.set_xlabel("runs of history"), ax.set_ylabel("seconds"), ax.legend(), ax.grid(alpha=.3)
    ax.set_title(f"Run time vs. history ({f['events_per_run']} events per run)")
    fig.tight_layout(), fig.savefig(img / "bench-history.png", dpi=110), plt.close(fig)
    out.append("bench-history.png")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    cases = [("small increment\n(spark-submit wall)", res["small"]["median_count_s"], res["small"]["median_job_s"]),
             ("large batch\n(Spark time)", res["large"]["median_scan_s"], res["large"]["median_ingest_s"])]
    xs = range(len(cases))
    ax.bar([x - .2 for x in xs], [c[1] for c in cases], .4, label="reference (read + count / scan)")
    ax.bar([x + .2 for x in xs], [c[2] for c in cases], .4, label="cdc-lake job")
    ax.set_xticks(list(xs), [c[0] for c in cases]), ax.set_ylabel("seconds"), ax.legend()
    fig.tight_layout(), fig.savefig(img / "bench-ratios.png", dpi=110), plt.close(fig)
    out.append("bench-ratios.png")
    return out


def report(res: dict[str, Any], pngs: list[str]) -> str:
    s, lg, f = res["small"], res["large"], res["flat"]

    def verdict(ratio: float, target: float, higher_better: bool = False) -> str:
        ok = ratio >= target if higher_better else ratio <= target
        return "met" if ok else f"**missed** by {abs(ratio - target) / target:.0%}"

    rows = [
        ("small increment", f"{s['events']} events, 2 files, spark-submit wall", f"{s['median_job_s']} s",
         f"{s['median_count_s']} s (read+count)", s["ratio"], f"≤ {TARGETS['small']}×", verdict(s["ratio"], TARGETS["small"])),
        ("large batch", f"{lg['events']} events, {lg['files']} files, {lg['events_per_s']} events/s, "
         f"peak RSS {lg['peak_rss_mb']} MB", f"{lg['median_ingest_s']} s", f"{lg['median_scan_s']} s (scan)",
         lg["ratio"], f"≤ {TARGETS['large']}×", verdict(lg["ratio"], TARGETS["large"])),
        ("flat cost", f"run {f['history']} vs run 2 ({f['events_per_run']} events each)",
         f"{statistics.median(f['run_s'][-3:]):.2f} s", f"{f['first_s']} s", f["ratio_last_first"],
         f"≤ {TARGETS['flat']}×", verdict(f["ratio_last_first"], TARGETS["flat"])),
        ("peer", f"naive full recompute at {f['history']} runs of history", f"{min(f['recompute_s']):.2f} s",
         f"{statistics.median(f['run_s'][-3:]):.2f} s (incremental)", f["peer_ratio"],
         f"≥ {TARGETS['peer']}×", verdict(f["peer_ratio"], TARGETS["peer"], True)),
    ]
    table = "\n".join(f"| {a} | {b} | {c} | {d} | **{e}×** | {g} | {h} |" for a, b, c, d, e, g, h in rows)
    marks = ", ".join(f"after {k}: {v} s" for k, v in f["at"].items())
    return f"""# Benchmarks

Generated by `{res['command']}` on {res['date']} ({res['machine']}); regenerate with `make bench`.
Median of {s['reps']} repetitions where repeated; no timing is asserted anywhere.
Load average during the run: {res['loadavg']}.

| case | workload | cdc-lake | reference | ratio | target | |
|---|---|---:|---:|---:|---:|---|
{table}

Flat cost, median of 3 runs around the run after N earlier runs: {marks}.

![run time vs history](img/{pngs[0]})

![job vs reference](img/{pngs[1]})

## What bounds the misses

Per-batch phases of the large run (printed by the job):

```
{chr(10).join(lg['batch_log'][-6:])}
```

Versions: {json.dumps(res['versions'])}
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI smoke size, one repetition")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--small-events", type=int, default=800)
    p.add_argument("--large-events", type=int, default=200_000)
    p.add_argument("--large-files", type=int, default=40)
    p.add_argument("--history", type=int, default=100)
    p.add_argument("--out", type=Path, default=None, help="report folder (default: docs/, temp for --quick)")
    a = p.parse_args(argv)
    if a.quick:
        a.small_events, a.large_events, a.large_files, a.history = 200, 4000, 4, 5
    reps = a.reps or (1 if a.quick else 3)
    out = a.out or (Path(tempfile.mkdtemp(prefix="cdc-bench-report-")) if a.quick else REPO / "docs")
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp:
        work = Path(tmp)
        t0 = time.time()
        res: dict[str, Any] = {"command": " ".join(["python benchmarks/bench.py", *(argv if argv is not None else sys.argv[1:])]),
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "machine": f"{os.cpu_count()} cores, {bi._mem_total_gb()} GiB",
                               "versions": bi.versions()}
        print("[bench] 1/3 small increment", flush=True)
        res["small"] = case_small(work, a.small_events, reps, base_events=5 * a.small_events)
        print(f"[bench]   ratio {res['small']['ratio']}", flush=True)
        print("[bench] 2/3 large batch", flush=True)
        res["large"] = case_large(work, a.large_events, a.large_files, reps)
        print(f"[bench]   ratio {res['large']['ratio']}", flush=True)
        print("[bench] 3/3 flat cost + peer", flush=True)
        res["flat"] = case_flat_and_peer(work, a.history, a.small_events, [1, 10, 50, 100])
        res["loadavg"] = [round(x, 2) for x in os.getloadavg()]
        res["seconds"] = round(time.time() - t0, 1)
    out.mkdir(parents=True, exist_ok=True)
    pngs = plots(res, out / "img")
    (out / "benchmarks.md").write_text(report(res, pngs), encoding="utf-8")
    results = (HERE / "results") if not a.quick else out
    results.mkdir(parents=True, exist_ok=True)
    (results / "bench.json").write_text(json.dumps(res, indent=2), encoding="utf-8")
    print(f"[bench] done in {res['seconds']} s: {out / 'benchmarks.md'}", flush=True)
    print("BENCH_SUMMARY " + json.dumps({k: res[k].get("ratio", res[k].get("ratio_last_first"))
                                         for k in ("small", "large", "flat")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
