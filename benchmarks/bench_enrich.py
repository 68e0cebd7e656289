"""Enrichment figures for ``bench.py``: the same two ratios as the CDC job, for ``kind: enrich``.

Workload: the shop star of the enrichment tests (``tests/enrich_workload.py``): fact
``order_items`` joined with ``orders``, ``products``, ``categories`` (SCD1) and ``customers``
(SCD2), one revenue-per-category-per-day aggregate. Upstream tables are real Delta tables with
the change data feed on, written with delta-rs.

* small increment — one MERGE commit of ``events`` fact changes (half updates of existing lines,
  half new lines) on top of an enriched lake; spark-submit wall of ``spark_jobs/enrich.py`` vs. a
  spark-submit that reads and counts the same commit's change files (``spark.read.parquet``);
* large batch — a fact table created with ``events`` rows in one commit, enriched into an empty
  output; spark-submit wall of the job vs. a spark-submit that reads and counts those files.

Both sides are fresh spark-submit processes with the same settings, alternating; median of
``reps``. Not a test; no timing is asserted.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))  # the enrichment tests' workload writer

COUNT_PARQUET = '''
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("bench-count-parquet").getOrCreate()
print("COUNT", spark.read.parquet(*sys.argv[1:]).count())
spark.stop()
'''
ORDERS, PRODUCTS, CUSTOMERS, LINES_PER_ORDER = 5000, 200, 1000, 4


def _commit(table: str, upserts: list[dict[str, Any]], *, create: bool = False) -> Any:
    import enrich_workload as ew
    from enrich_reference import Commit

    return Commit(table, ew.MERGE_ON[table], tuple(upserts), (), create)


def _dimensions(lake: Path, rng: random.Random) -> None:
    import enrich_workload as ew

    t0 = ew.T0
    ew.write_commit(lake, _commit("orders", [
        {"id": i, "status": "paid", "customer_id": rng.randint(1, CUSTOMERS),
         "created_at": t0 + timedelta(minutes=i)} for i in range(1, ORDERS + 1)], create=True))
    ew.write_commit(lake, _commit("products", [
        {"id": p, "name": f"product {p}"} for p in range(1, PRODUCTS + 1)], create=True))
    ew.write_commit(lake, _commit("categories", [
        {"product_id": p, "category": f"cat {p % 12}"} for p in range(1, PRODUCTS + 1)], create=True))
    ew.write_commit(lake, _commit("customers", [
        {"id": c, "city": f"city {c % 30}", "_valid_from": t0 - timedelta(days=30),
         "_valid_to": None, "_is_current": True} for c in range(1, CUSTOMERS + 1)], create=True))


def _line(rng: random.Random, order_id: int, line_no: int) -> dict[str, Any]:
    return {"order_id": order_id, "line_no": line_no, "product_id": rng.randint(1, PRODUCTS),
            "qty": rng.randint(1, 5), "unit_price": rng.randint(100, 9999)}


def _files_of(table: Path, version: int) -> list[str]:
    """The data files one commit wrote: its change files (``cdc``), else its added files."""
    actions = [json.loads(x) for x in (table / "_delta_log" / f"{version:020d}.json")
               .read_text().splitlines() if x.strip()]
    cdc = [a["cdc"]["path"] for a in actions if "cdc" in a]
    paths = cdc or [a["add"]["path"] for a in actions if "add" in a]
    return [str(table / p) for p in paths]


def _lake(root: Path, facts: int, seed: int) -> tuple[Path, Path, random.Random]:
    import enrich_workload as ew

    rng = random.Random(seed)
    lake, out = root / "upstream", root / "out"
    _dimensions(lake, rng)
    rows = [_line(rng, 1 + i // LINES_PER_ORDER % ORDERS, 1 + i // (LINES_PER_ORDER * ORDERS) * 10
                  + i % LINES_PER_ORDER) for i in range(facts)]
    ew.write_commit(lake, _commit(ew.FACT, rows, create=True))
    cfg = ew.model_config(wait_zero=True, max_versions_per_trigger=1000)
    ew.write_pipeline(root / "enrich.yaml", cfg, lake, out, name="bench_enrich")
    return lake, root / "enrich.yaml", rng


def case_enrich(work: Path, small_events: int, large_events: int, reps: int,
                wall: Any, submit: list[str]) -> dict[str, Any]:
    """``wall(cmd, log)`` times one command; ``submit`` is spark-submit with the common confs."""
    import enrich_workload as ew

    job = [*submit, str(REPO / "spark_jobs" / "enrich.py")]
    count_py = work / "count_parquet.py"
    count_py.write_text(COUNT_PARQUET)
    log = work / "enrich.log"

    # small increment on an enriched lake
    base = work / "enrich-small"
    lake, cfg, rng = _lake(base, 4 * small_events, seed=21)
    wall([*job, "--pipeline", str(cfg), "--run-id", "base"], log)
    fact = lake / ew.FACT
    from deltalake import DeltaTable

    job_s, count_s, next_line = [], [], 1000
    for i in range(reps):
        half = small_events // 2
        updates = [_line(rng, 1 + j // LINES_PER_ORDER % ORDERS, 1 + j % LINES_PER_ORDER)
                   for j in rng.sample(range(4 * small_events), half)]
        news = [_line(rng, rng.randint(1, ORDERS), next_line + j) for j in range(small_events - half)]
        next_line += small_events
        ew.write_commit(lake, _commit(ew.FACT, updates + news))
        files = _files_of(fact, DeltaTable(str(fact)).version())
        count_s.append(wall([*submit, str(count_py), *files], log))
        job_s.append(wall([*job, "--pipeline", str(cfg), "--run-id", f"inc{i}"], log))
    small = {"events": small_events, "reps": reps, "job_wall_s": job_s, "count_wall_s": count_s,
             "median_job_s": round(statistics.median(job_s), 2),
             "median_count_s": round(statistics.median(count_s), 2)}
    small["ratio"] = round(small["median_job_s"] / small["median_count_s"], 2)
    # a scheduled run that finds no new fact version: no Spark session (enrich.fast_path)
    noop = [wall([*job, "--pipeline", str(cfg), "--run-id", f"noop{i}"], log) for i in range(reps)]
    small["noop_wall_s"] = noop
    small["median_noop_s"] = round(statistics.median(noop), 2)

    # large batch into an empty output
    big = work / "enrich-large"
    lake, cfg, _ = _lake(big, large_events, seed=22)
    files = _files_of(lake / ew.FACT, 0)
    scans, ingests = [], []
    for i in range(reps):
        shutil.rmtree(big / "out", ignore_errors=True)
        scans.append(wall([*submit, str(count_py), *files], log))
        ingests.append(wall([*job, "--pipeline", str(cfg), "--run-id", f"large{i}"], log))
    s, j = statistics.median(scans), statistics.median(ingests)
    large = {"events": large_events, "reps": reps, "scan_wall_s": scans, "job_wall_s": ingests,
             "median_scan_s": round(s, 2), "median_job_s": round(j, 2), "ratio": round(j / s, 2),
             "events_per_s": round(large_events / j)}
    return {"small": small, "large": large}


# --- events fact source (``fact.events``: an append-only folder of JSON event files) ---------

COUNT_TEXT = '''
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("bench-count-events").getOrCreate()
print("COUNT", spark.read.text(sys.argv[1:]).count())
spark.stop()
'''
EVENTS_SCHEMA = {"event_id": "string", "order_id": "bigint", "product_id": "bigint",
                 "qty": "bigint", "unit_price": "bigint", "event_ts": "timestamp"}


class EventFiles:
    """JSON Lines event files landed in order, event times rising (none late), ids unique."""

    def __init__(self, folder: Path, rng: random.Random) -> None:
        self.folder, self.rng, self.n, self.files = folder, rng, 0, 0
        folder.mkdir(parents=True, exist_ok=True)

    def land(self, events: int, files: int) -> list[Path]:
        import enrich_workload as ew

        per, out = -(-events // files), []
        for _ in range(files):
            lines = []
            for _ in range(per):
                self.n += 1
                lines.append(json.dumps({
                    "event_id": f"e{self.n}", "order_id": self.rng.randint(1, ORDERS),
                    "product_id": self.rng.randint(1, PRODUCTS), "qty": self.rng.randint(1, 5),
                    "unit_price": self.rng.randint(100, 9999),
                    "event_ts": (ew.T0 + timedelta(seconds=self.n)).isoformat()}))
            path = self.folder / f"events-{self.files:06d}.json"
            tmp = path.with_name(f".{path.name}.tmp")  # the file source ignores dot files
            tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
            tmp.replace(path)
            out.append(path)
            self.files += 1
        return out


def _events_lake(root: Path, seed: int) -> tuple[EventFiles, Path]:
    """The shop dimensions as Delta tables, an empty landing folder and the ``fact.events`` YAML."""
    import enrich_workload as ew
    import yaml

    rng = random.Random(seed)
    lake, out = root / "upstream", root / "out"
    _dimensions(lake, rng)
    landing = EventFiles(root / "landing", rng)
    cfg = ew.model_config(wait_zero=True)
    ew.write_pipeline(root / "events.yaml", cfg, lake, out, name="bench_events")
    doc = yaml.safe_load((root / "events.yaml").read_text())
    doc["fact"] = {"events": {"path": str(landing.folder), "format": "json", "id": "event_id",
                              "time": "event_ts", "watermark": "1 hour",
                              "max_files_per_trigger": 1000, "schema": EVENTS_SCHEMA}}
    doc["event_time"] = "event_ts"
    (root / "events.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return landing, root / "events.yaml"


def case_events(work: Path, small_events: int, large_events: int, large_files: int, reps: int,
                wall: Any, submit: list[str]) -> dict[str, Any]:
    """An events pipeline: small increment (one new file onto an enriched lake) and large batch
    (``large_events`` in ``large_files`` files into an empty output), each against a spark-submit
    that reads and counts the same files' lines (``spark.read.text``), as the CDC cases do."""
    job = [*submit, str(REPO / "spark_jobs" / "enrich.py")]
    count_py = work / "count_text.py"
    count_py.write_text(COUNT_TEXT)
    log = work / "events.log"

    base = work / "events-small"
    landing, cfg = _events_lake(base, seed=31)
    landing.land(4 * small_events, 4)
    wall([*job, "--pipeline", str(cfg), "--run-id", "base"], log)
    job_s, count_s = [], []
    for i in range(reps):
        files = [str(p) for p in landing.land(small_events, 1)]
        count_s.append(wall([*submit, str(count_py), *files], log))
        job_s.append(wall([*job, "--pipeline", str(cfg), "--run-id", f"inc{i}"], log))
    small = {"events": small_events, "reps": reps, "job_wall_s": job_s, "count_wall_s": count_s,
             "median_job_s": round(statistics.median(job_s), 2),
             "median_count_s": round(statistics.median(count_s), 2)}
    small["ratio"] = round(small["median_job_s"] / small["median_count_s"], 2)
    # a scheduled run that finds no new file: no Spark session (enrich.fast_path)
    noop = [wall([*job, "--pipeline", str(cfg), "--run-id", f"noop{i}"], log) for i in range(reps)]
    small["noop_wall_s"] = noop
    small["median_noop_s"] = round(statistics.median(noop), 2)

    big = work / "events-large"
    landing, cfg = _events_lake(big, seed=32)
    files = [str(p) for p in landing.land(large_events, large_files)]
    scans, ingests = [], []
    for i in range(reps):
        shutil.rmtree(big / "out", ignore_errors=True)
        scans.append(wall([*submit, str(count_py), *files], log))
        ingests.append(wall([*job, "--pipeline", str(cfg), "--run-id", f"large{i}"], log))
    s, j = statistics.median(scans), statistics.median(ingests)
    large = {"events": large_events, "files": large_files, "reps": reps, "scan_wall_s": scans,
             "job_wall_s": ingests, "median_scan_s": round(s, 2), "median_job_s": round(j, 2),
             "ratio": round(j / s, 2), "events_per_s": round(large_events / j)}
    return {"small": small, "large": large}


def case_events_history(work: Path, history: int, events: int, marks: list[int], big_events: int,
                        maintain_every: int) -> dict[str, Any]:
    """Flat cost of an events pipeline. One warm session runs the same-size increment
    ``history`` times (the pipeline's table maintenance after every ``maintain_every``-th run,
    timed apart, as its maintenance DAG would), then lands ``big_events`` in one run (and
    maintains), then times the same increment 3 more times: run time against the number of
    earlier runs, and against the size of the enriched table."""
    from deltalake import DeltaTable

    from cdc_lake.config import load_pipeline
    from cdc_lake.enrich.job import run_enrich
    from cdc_lake.maintenance import run_maintenance
    from cdc_lake.spark_session import build_session

    landing, yml = _events_lake(work / "events-history", seed=33)
    cfg = load_pipeline(yml)
    spark = build_session(cfg, app_name="bench-events-history")
    maintenance_s: list[float] = []

    def timed(fn: Any) -> float:
        t0 = time.perf_counter()
        fn()
        return round(time.perf_counter() - t0, 3)

    def run(tag: str, n: int = events, files: int = 1) -> float:
        landing.land(n, files)
        return timed(lambda: run_enrich(cfg, spark=spark, run_id=tag))

    times = []
    for i in range(history):
        times.append(run(f"h{i}"))
        if maintain_every and (i + 1) % maintain_every == 0:
            maintenance_s.append(timed(lambda: run_maintenance(cfg, pipelines=[cfg])))
        if (i + 1) % 10 == 0:
            print(f"[bench] events history: {i + 1}/{history} runs, last {times[-1]} s", flush=True)
    first = statistics.median(times[1:4])  # run 1 pays the JVM's warm-up
    at = {m: round(statistics.median(times[max(1, m - 1):m + 2]), 3) for m in marks if m < history}
    big_s = run("big", big_events, max(1, big_events // 10_000))
    maintenance_s.append(timed(lambda: run_maintenance(cfg, pipelines=[cfg])))
    after = [run(f"a{i}") for i in range(3)]
    rows = DeltaTable(str(cfg.outputs.enriched)).to_pyarrow_dataset().count_rows()
    spark.stop()
    last = statistics.median(times[-3:])
    return {"events_per_run": events, "history": history, "run_s": times,
            "maintain_every": maintain_every, "maintenance_s": maintenance_s,
            "first_s": round(first, 3), "at": at, "last_s": round(last, 3),
            "ratio_last_first": round(last / first, 2), "big_events": big_events,
            "big_run_s": big_s, "after_big_s": after, "enriched_rows": rows,
            "after_big_median_s": round(statistics.median(after), 3),
            "ratio_big_first": round(statistics.median(after) / first, 2)}
