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
   events/s and peak RSS of the process tree (Python driver + JVM + delta-rs); ``xlarge`` is the
   same with ``--xlarge-events`` (1M) in ``--xlarge-files``, one repetition;
3. flat cost — one process runs the same-size increment ``--history`` times; run time vs. the
   number of earlier runs (first vs. 10th/50th/100th), with the pipeline's table maintenance
   (what its maintenance DAG runs) after every ``--maintain-every`` runs (default 10; 0: never);
4. peer — at the end of (3), a naive full recompute of the same tables (read the whole landing
   history, latest row per key, overwrite) vs. one incremental run, in the same process;
   ``peer_long`` repeats (3)+(4) with ``--long-events`` (10k) per run, so that the 100 runs
   of history hold 1M events (where a recompute has real work to do);
5. enrichment — the same small-increment and large-batch ratios for ``kind: enrich``
   (``bench_enrich.py``: fact change feed joined with four dimensions, one aggregate);
   ``events`` the same for a JSON events source; ``events_history`` the flat cost of that
   pipeline (``--enrich-history`` runs of ``--small-events`` in one process, table maintenance
   every ``--maintain-every`` runs, then ``--enrich-big-events`` in one run and the same
   increment again: run time vs. runs of history and vs. the enriched table's size);
6. landing — the flat cost against ``--landing-files`` files of landing history (one event
   each), without and with ``source.archive_dir`` (``bench_landing.py``).
   ``events_landing`` the same for an events enrichment pipeline, without and with
   ``fact.events.archive_dir`` (the reference gets the history's events in one file);
7. files — the same ``--small-events`` increment as one file and as ``--small-files`` files, CDC
   and events pipelines, runs alternating in one warm session (``bench_files.py``).

``--cases small,enrich`` re-measures a subset; the other cases keep their figures from the last
``benchmarks/results/bench.json`` and the report says when each was measured. The report
itself (table, plots, what bounds the misses) is ``bench_report.py``.

Usage::

    python benchmarks/bench.py                # full size (~30-40 min on 2 cores)
    python benchmarks/bench.py --quick        # CI smoke (~3-5 min)
    python benchmarks/bench.py --cases enrich # re-measure one case, regenerate the report
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

import bench_enrich as be  # noqa: E402  (enrichment case)
import bench_files as bf  # noqa: E402  (many-small-files case)
import bench_landing as bl  # noqa: E402  (landing-history case)
import bench_report as br  # noqa: E402  (docs/benchmarks.md + plots)
import bench_ingest as bi  # noqa: E402  (generator, RSS sampler, phase runner)
from cdc_lake.launch import DRIVER_JAVA_OPTIONS, class_archive, codegen_conf, launch_conf  # noqa: E402
from cdc_lake.jvm_archive import option as jvm_archive_option  # noqa: E402

SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
# Both sides get the product's driver JVM options (what the operator passes to spark-submit for
# a backlog of a few hundred events: C1-only JIT and, when make setup built it, the JVM class
# archive; launch.launch_conf, cdc_lake.jvm_archive).
LAUNCH = launch_conf(None, archive=jvm_archive_option())
COMMON_CONF = ["--master", "local[2]", *(a for k, v in LAUNCH.items() for a in ("--conf", f"{k}={v}")),
               "--conf", "spark.sql.session.timeZone=UTC",
               "--conf", "spark.ui.enabled=false", "--conf", f"spark.pyspark.python={sys.executable}"]
# A small CDC run's session evaluates expressions interpreted (the job sets it for a backlog under
# spark.interpreted_below_mb; launch.codegen_conf): the read+count reference of that case gets it too.
SMALL_CODEGEN = [a for k, v in codegen_conf(0).items() for a in ("--conf", f"{k}={v}")]
# spark-submit's launcher scripts look up python/java on PATH: the venv first
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
CASES = br.CASES
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
        mark = log.stat().st_size
        # the job's settings for this backlog: interpreted expressions (launch.codegen_conf)
        count_s.append(_wall([SPARK_SUBMIT, *COMMON_CONF, *SMALL_CODEGEN, str(count_py), *map(str, new)], log))
        count_profile = _profile(log, mark)
        mark = log.stat().st_size
        job_s.append(_wall([*job, "--run-id", f"inc{i}"], log))
        job_profile = _profile(log, mark)
    j, c = statistics.median(job_s), statistics.median(count_s)
    return {"events": events, "reps": reps, "job_wall_s": job_s, "count_wall_s": count_s,
            "median_job_s": round(j, 2), "median_count_s": round(c, 2), "ratio": round(j / c, 2),
            "profile": {"job": job_profile, "count": count_profile}}


def _profile(log: Path, start: int) -> dict[str, Any]:
    """What one spark-submit (the log from byte ``start``) spent: Spark's own INFO lines."""
    import re

    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode("utf-8", "replace")
    codegen = [float(x) for x in re.findall(r"Code generated in ([0-9.]+) ms", text)]
    out: dict[str, Any] = {"codegen_classes": len(codegen), "codegen_s": round(sum(codegen) / 1000, 2),
                           "spark_jobs": len(set(re.findall(r"Job (\d+) (?:is )?finished", text))),
                           "phases": [ln for ln in text.splitlines() if ln.startswith("[cdc] batch")]}
    for ln in text.splitlines():
        if ln.startswith("CDC_RUN_SUMMARY "):
            summary = json.loads(ln.split(" ", 1)[1])
            out.update({k: summary.get(k) for k in ("spark_startup_s", "stream_s", "batch_seconds")})
    return out


def case_large(work: Path, events: int, files: int, reps: int, name: str = "large") -> dict[str, Any]:
    base = work / name
    info = bi.generate(base / "landing", events, files, seed=7)
    cfg = bi.pipeline_yaml(base, None)
    # The job picks its driver JIT from the backlog (launch.launch_conf); the reference scan runs
    # under both JITs and the faster one counts (C2 compilation slows a 65 MB scan by ~30%).
    scans: dict[str, list[dict[str, Any]]] = {"C1": [], "full": []}
    ingests = []
    for _ in range(reps):
        shutil.rmtree(base / "lake", ignore_errors=True)
        for jit in scans:
            scans[jit].append(bi.spawn_phase(f"scan@{jit}", cfg, 0.2, work))
        ingests.append(bi.spawn_phase("ingest", cfg, 0.2, work))
    by_jit = {jit: statistics.median(r["seconds"] for r in runs) for jit, runs in scans.items()}
    ref = min(by_jit, key=by_jit.__getitem__)
    s = by_jit[ref]
    i = statistics.median(r["seconds"] for r in ingests)
    return {"events": info["events"], "files": info["files"], "bytes": info["bytes"], "reps": reps,
            "scan_s": [r["seconds"] for r in scans[ref]], "ingest_s": [r["seconds"] for r in ingests],
            "scan_s_by_jit": {jit: [r["seconds"] for r in runs] for jit, runs in scans.items()},
            "median_scan_s": round(s, 2), "median_ingest_s": round(i, 2), "ratio": round(i / s, 2),
            "events_per_s": round(info["events"] / i),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in ingests),
            "driver_jit": {"scan": scans[ref][-1].get("driver_jit"), "ingest": ingests[-1].get("driver_jit")},
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


def case_flat_and_peer(work: Path, history: int, events: int, marks: list[int],
                       maintain_every: int = 0, name: str = "flat") -> dict[str, Any]:
    """``maintain_every`` N > 0: run the pipeline's table maintenance (what its maintenance DAG
    runs: compaction, Delta checkpoint, VACUUM) after every N-th run, timed apart from the runs."""
    from cdc_lake.cdc.job import run_pipeline
    from cdc_lake.config import load_pipeline
    from cdc_lake.maintenance import run_maintenance
    from cdc_lake.spark_session import build_session

    base = work / name
    landing = Landing(base / "landing", seed=13)
    cfg = load_pipeline(bi.pipeline_yaml(base, None))
    spark = build_session(cfg, app_name="bench-flat")
    times, maintenance_s = [], []
    for i in range(history):
        landing.add(events, 1)
        t0 = time.perf_counter()
        run_pipeline(cfg, spark=spark, run_id=f"h{i}")
        times.append(round(time.perf_counter() - t0, 3))
        if maintain_every and (i + 1) % maintain_every == 0:
            t0 = time.perf_counter()
            run_maintenance(cfg, pipelines=[cfg])
            maintenance_s.append(round(time.perf_counter() - t0, 3))
        if (i + 1) % 10 == 0:
            print(f"[bench] {name}: {i + 1}/{history} runs, last {times[-1]} s", flush=True)
    # run 1 pays the JVM's warm-up; "after 1 earlier run" (run 2) is the baseline
    first = statistics.median(times[1:4])
    at = {m: round(statistics.median(times[max(1, m - 1):m + 2]), 3) for m in marks if m < history}
    recompute = [_naive_recompute(spark, cfg) for _ in range(2)]
    spark.stop()
    inc = statistics.median(times[-3:])
    return {"events_per_run": events, "history": history, "run_s": times,
            "maintain_every": maintain_every, "maintenance_s": maintenance_s,
            "first_s": round(first, 3), "at": at, "ratio_last_first": round(inc / first, 2),
            "recompute_s": [round(x, 3) for x in recompute],
            "peer_ratio": round(min(recompute) / inc, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI smoke size, one repetition")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--small-events", type=int, default=800)
    p.add_argument("--large-events", type=int, default=200_000)
    p.add_argument("--large-files", type=int, default=40)
    p.add_argument("--xlarge-events", type=int, default=1_000_000)
    p.add_argument("--xlarge-files", type=int, default=200)
    p.add_argument("--history", type=int, default=100)
    p.add_argument("--enrich-history", type=int, default=50,
                   help="events_history: increments run before the large-history point")
    p.add_argument("--enrich-big-events", type=int, default=400_000,
                   help="events_history: events landed in one run to grow the enriched table")
    p.add_argument("--landing-files", type=int, default=15_000,
                   help="landing: one-line files of history before the timed increments")
    p.add_argument("--small-files", type=int, default=800,
                   help="files: the increment's events spread over this many files (at most "
                        "--small-events: one event each)")
    p.add_argument("--long-events", type=int, default=10_000,
                   help="peer_long: events per run (history x this = the recomputed history)")
    p.add_argument("--maintain-every", type=int, default=10,
                   help="flat cost: run the table maintenance after every N runs (0: never)")
    p.add_argument("--out", type=Path, default=None, help="report folder (default: docs/, temp for --quick)")
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated subset of {','.join(CASES)}; the others keep their figures "
                        "from the last bench.json (each case records its own date); "
                        "--cases= regenerates the report only")
    a = p.parse_args(argv)
    cases = [c for c in a.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        p.error(f"unknown case(s) {unknown}; valid: {list(CASES)}")
    if a.quick:
        a.small_events, a.large_events, a.large_files, a.history = 200, 4000, 4, 5
        a.long_events = 400
        a.enrich_history, a.enrich_big_events = 5, 4000
        a.landing_files = 300
        a.small_files = 100
        a.xlarge_events, a.xlarge_files = 8000, 8
        a.maintain_every = min(a.maintain_every, 2)
    reps = a.reps or (1 if a.quick else 3)
    out = a.out or (Path(tempfile.mkdtemp(prefix="cdc-bench-report-")) if a.quick else REPO / "docs")
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp:
        work = Path(tmp)
        t0 = time.time()
        res: dict[str, Any] = {"command": " ".join(["python benchmarks/bench.py", *(argv if argv is not None else sys.argv[1:])]),
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "machine": f"{os.cpu_count()} cores, {bi._mem_total_gb()} GiB",
                               "versions": bi.versions(), "launch_conf": LAUNCH}
        date = res["date"]
        if "small" in cases:
            print("[bench] small increment", flush=True)
            res["small"] = case_small(work, a.small_events, reps, base_events=5 * a.small_events)
            print(f"[bench]   ratio {res['small']['ratio']}", flush=True)
        if "large" in cases:
            print("[bench] large batch", flush=True)
            res["large"] = case_large(work, a.large_events, a.large_files, reps)
            print(f"[bench]   ratio {res['large']['ratio']}", flush=True)
        if "xlarge" in cases:  # one repetition: minutes per run on 2 cores
            print("[bench] large batch, 1M events", flush=True)
            res["xlarge"] = case_large(work, a.xlarge_events, a.xlarge_files, 1, name="xlarge")
            print(f"[bench]   ratio {res['xlarge']['ratio']}", flush=True)
        if "flat" in cases:
            print("[bench] flat cost + peer", flush=True)
            res["flat"] = case_flat_and_peer(work, a.history, a.small_events, [1, 10, 50, 100],
                                             maintain_every=a.maintain_every)
        if "peer_long" in cases:
            print(f"[bench] peer, {a.long_events} events per run", flush=True)
            res["peer_long"] = case_flat_and_peer(work, a.history, a.long_events, [],
                                                  maintain_every=a.maintain_every, name="peer_long")
            print(f"[bench]   peer ratio {res['peer_long']['peer_ratio']}", flush=True)
        if "enrich" in cases:
            print("[bench] enrichment: small increment + large batch", flush=True)
            res["enrich"] = be.case_enrich(work, a.small_events, a.large_events, reps, _wall,
                                           [SPARK_SUBMIT, *COMMON_CONF])
            print(f"[bench]   ratios {res['enrich']['small']['ratio']} / "
                  f"{res['enrich']['large']['ratio']}", flush=True)
        if "events" in cases:
            print("[bench] enrichment, events source: small increment + large batch", flush=True)
            res["events"] = be.case_events(work, a.small_events, a.large_events, a.large_files, reps,
                                           _wall, [SPARK_SUBMIT, *COMMON_CONF])
            print(f"[bench]   ratios {res['events']['small']['ratio']} / "
                  f"{res['events']['large']['ratio']}", flush=True)
        if "events_history" in cases:
            print("[bench] enrichment, events source: flat cost", flush=True)
            res["events_history"] = be.case_events_history(
                work, a.enrich_history, a.small_events, [1, 10, 50], a.enrich_big_events,
                a.maintain_every)
            print(f"[bench]   ratios {res['events_history']['ratio_last_first']} / "
                  f"{res['events_history']['ratio_big_first']}", flush=True)
        if "landing" in cases:
            print(f"[bench] flat cost against {a.landing_files} landing files, with and without "
                  "source.archive_dir", flush=True)
            res["landing"] = bl.case_landing(work, a.landing_files, a.small_events, Landing)
            print(f"[bench]   ratios {res['landing']['plain']['ratio']} / "
                  f"{res['landing']['archive']['ratio']}", flush=True)
        if "events_landing" in cases:
            print(f"[bench] events pipeline: flat cost against {a.landing_files} landing files, "
                  "with and without fact.events.archive_dir", flush=True)
            res["events_landing"] = bl.case_events_landing(work, a.landing_files, a.small_events)
            print(f"[bench]   ratios {res['events_landing']['plain']['ratio']} / "
                  f"{res['events_landing']['archive']['ratio']}", flush=True)
        if "files" in cases:
            print(f"[bench] {a.small_events} events in one file vs {a.small_files} files", flush=True)
            res["files"] = bf.case_files(work, a.small_files, a.small_events, reps, Landing)
            print(f"[bench]   ratios {res['files']['cdc']['ratio']} / "
                  f"{res['files']['events_source']['ratio']}", flush=True)
        for c in cases:
            res[c]["date"] = date
            res[c]["jvm_archive"] = class_archive(LAUNCH.get(DRIVER_JAVA_OPTIONS))  # both sides
        res["loadavg"] = [round(x, 2) for x in os.getloadavg()]
        res["seconds"] = round(time.time() - t0, 1)
    results = (HERE / "results") if not a.quick else out
    previous = results / "bench.json"
    if set(cases) != set(CASES) and previous.exists():  # keep the other cases' last figures
        last = json.loads(previous.read_text())
        kept = {c: {"date": last.get("date"), **v} for c, v in last.items() if c in CASES}
        res = {**kept, **res}
        if not cases:  # report only: the load of the last measuring run
            res["loadavg"] = last.get("loadavg")
    missing = [c for c in CASES if c not in res]
    if missing:
        raise SystemExit(f"no figures for {missing}: run them (--cases) before a report")
    out.mkdir(parents=True, exist_ok=True)
    pngs = br.plots(res, out / "img")
    (out / "benchmarks.md").write_text(br.report(res, pngs), encoding="utf-8")
    results.mkdir(parents=True, exist_ok=True)
    (results / "bench.json").write_text(json.dumps(res, indent=2), encoding="utf-8")
    print(f"[bench] done in {res['seconds']} s: {out / 'benchmarks.md'}", flush=True)
    print("BENCH_SUMMARY " + json.dumps({k: res[k].get("ratio", res[k].get("ratio_last_first"))
                                         for k in ("small", "large", "flat")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
