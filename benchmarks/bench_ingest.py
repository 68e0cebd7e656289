"""Ingest benchmark: Maxwell landing files -> run_pipeline (engine deltalake) vs. a plain JSON scan.

Not a test. One invocation measures, on the same generated data and with the same SparkSession
configuration (``cdc_lake.spark_session.build_session``):

  (a) scan    ``spark.read.json(files).count()`` — the floor any file-based job pays;
  (b) ingest  ``run_pipeline(cfg)`` on an empty lake: time, events/s, ratio (b)/(a) (target <= 1.5x);
  (c) noop    a second ``run_pipeline(cfg)`` with nothing new (target <= 6 s).

Each phase runs in its own fresh Python subprocess (so each pays the same cold JVM start and
JIT warm-up, none benefits from another's warm caches); timings are taken inside the
subprocess *after* the SparkSession exists, so they cover the Spark work, not JVM start-up
(which is reported separately). The parent samples the RSS of the subprocess tree (Python driver
+ JVM) with psutil every ``--sample-interval`` seconds and reports the peak per phase.

Usage::

    python benchmarks/bench_ingest.py                        # 200k events, 40 files
    python benchmarks/bench_ingest.py --events 20000 --files 8

Results: a table on stdout and JSON in ``benchmarks/results/latest.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))

TABLES = {  # name -> primary key columns
    "customers": ["id"],
    "products": ["sku"],
    "orders": ["id"],
    "order_lines": ["order_id", "line_no"],
}
TYPES = {
    "customers": {"balance": "decimal(12,2)"},
    "products": {"price": "decimal(10,2)"},
    "orders": {"amount": "decimal(12,2)"},
    "order_lines": {"price": "decimal(10,2)"},
}
TARGET_RATIO = 1.5
TARGET_NOOP_S = 6.0


# --------------------------------------------------------------------------------------------
# Data generation (deterministic, Maxwell JSON lines like cdc_lake.capture.mariadb_maxwell)
# --------------------------------------------------------------------------------------------

class Generator:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.live: dict[str, dict[tuple, dict[str, Any]]] = {t: {} for t in TABLES}
        self.keys: dict[str, list[tuple]] = {t: [] for t in TABLES}
        self.index: dict[str, dict[tuple, int]] = {t: {} for t in TABLES}
        self.next_id = {"customers": 1, "products": 1, "orders": 10_000_000}
        self.binlog = 1
        self.pos = 157
        self.xid = 1000
        self.ts = 1_795_000_000
        self.counts = {"insert": 0, "update": 0, "delete": 0}

    def _row(self, table: str, key: tuple | None = None) -> dict[str, Any]:
        r = self.r
        if table == "customers":
            cid = key[0] if key else self._new("customers")
            return {"id": cid, "email": f"user{cid}@example.com", "name": f"Name {r.randint(0, 10**6)}",
                    "balance": round(r.uniform(-1000, 100000), 2),
                    "created_at": f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} "
                                  f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}",
                    "birthday": f"19{r.randint(50, 99)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"}
        if table == "products":
            sku = key[0] if key else f"SKU-{self._new('products'):07d}"
            return {"sku": sku, "title": f"Product {r.randint(0, 10**6)} ✓", "price": round(r.uniform(1, 500), 2),
                    "stock": r.randint(0, 1000)}
        if table == "orders":
            oid = key[0] if key else self._new("orders")
            return {"id": oid, "customer_id": r.randint(1, 50_000), "status": r.choice(["new", "paid", "shipped"]),
                    "amount": round(r.uniform(1, 5000), 2),
                    "ordered_at": f"2026-11-{r.randint(1, 28):02d} {r.randint(0, 23):02d}:{r.randint(0, 59):02d}:00"}
        oid, no = key if key else (r.randint(10_000_000, 10_000_000 + 100_000), r.randint(1, 1_000_000))
        return {"order_id": oid, "line_no": no, "sku": f"SKU-{r.randint(1, 5000):07d}",
                "qty": r.randint(1, 9), "price": round(r.uniform(1, 500), 2)}

    def _new(self, table: str) -> int:
        self.next_id[table] += 1
        return self.next_id[table]

    def _add(self, table: str, key: tuple, row: dict[str, Any]) -> None:
        self.live[table][key] = row
        self.index[table][key] = len(self.keys[table])
        self.keys[table].append(key)

    def _remove(self, table: str, key: tuple) -> dict[str, Any]:
        i = self.index[table].pop(key)
        last = self.keys[table].pop()
        if last != key:
            self.keys[table][i] = last
            self.index[table][last] = i
        return self.live[table].pop(key)

    def event(self) -> tuple[str, str, dict[str, Any], dict[str, Any] | None]:
        r = self.r
        while True:
            table = r.choices(list(TABLES), weights=[2, 1, 3, 4])[0]
            live = self.live[table]
            pk = TABLES[table]
            k = r.random()
            if k < 0.5 or len(live) < 50:
                row = self._row(table)
                key = tuple(row[c] for c in pk)
                if key in live:
                    continue
                self._add(table, key, row)
                return table, "insert", row, None
            key = r.choice(self.keys[table])
            if k < 0.88:
                old_row = live[key]
                new = self._row(table, key)
                changed = r.sample([c for c in new if c not in pk], r.randint(1, 2))
                row = dict(old_row)
                for c in changed:
                    row[c] = new[c]
                old = {c: old_row[c] for c in changed if old_row[c] != row[c]}
                if r.random() < 0.03 and table in ("customers", "orders"):  # primary-key change
                    self._remove(table, key)
                    row["id"] = self._new(table)
                    old["id"] = key[0]
                    self._add(table, (row["id"],), row)
                else:
                    live[key] = row
                return table, "update", row, old
            return table, "delete", self._remove(table, key), None

    def lines(self, n_events: int) -> list[str]:
        out: list[str] = []
        while len(out) < n_events:
            n = min(self.r.choice([1, 1, 2, 3, 5]), n_events - len(out))
            self.xid += 1
            self.ts += self.r.randint(0, 2)
            for i in range(n):
                table, typ, data, old = self.event()
                self.counts[typ] += 1
                self.pos += self.r.randint(60, 400)
                if self.pos > 1_000_000_000:
                    self.binlog += 1
                    self.pos = 157
                rec: dict[str, Any] = {"database": "shop", "table": table, "type": typ, "ts": self.ts,
                                       "xid": self.xid, "xoffset": i}
                if i == n - 1:
                    rec["commit"] = True
                rec["position"] = f"mysql-bin.{self.binlog:06d}:{self.pos}"
                rec["primary_key"] = [data[c] for c in TABLES[table]]
                rec["primary_key_columns"] = TABLES[table]
                rec["data"] = data
                if old:
                    rec["old"] = old
                out.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
        return out


def generate(landing: Path, n_events: int, n_files: int, seed: int) -> dict[str, Any]:
    g = Generator(seed)
    lines = g.lines(n_events)
    landing.mkdir(parents=True, exist_ok=True)
    per = -(-len(lines) // n_files)
    total_bytes = 0
    for i in range(n_files):
        chunk = lines[i * per:(i + 1) * per]
        if not chunk:
            break
        text = "\n".join(chunk) + "\n"
        total_bytes += len(text.encode())
        tmp = landing / f".bench-{i:05d}.json.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, landing / f"maxwell-{i:05d}.json")
    return {"events": len(lines), "files": min(n_files, -(-len(lines) // per)), "bytes": total_bytes,
            "ops": g.counts, "expected_rows": {t: len(v) for t, v in g.live.items()}}


def pipeline_yaml(work: Path, mfpt: int | None) -> Path:
    import yaml

    cfg = {
        "pipeline": "bench_ingest",
        "source": {"format": "maxwell", "path": str(work / "landing"), "database": "shop",
                   **({"max_files_per_trigger": mfpt} if mfpt else {})},
        "storage": {"root": str(work / "lake")},
        "engine": {"name": "deltalake"},
        "tables": {t: {"keys": TABLES[t], "types": TYPES[t]} for t in TABLES},
    }
    path = work / "bench_ingest.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# Phases (each in a fresh subprocess)
# --------------------------------------------------------------------------------------------

def run_phase(phase: str, cfg_path: Path) -> dict[str, Any]:
    from cdc_lake.cdc.backlog import backlog
    from cdc_lake.config import load_pipeline
    from cdc_lake.launch import driver_jit
    from cdc_lake.spark_session import build_session, driver_java_options

    t0 = time.perf_counter()
    cfg = load_pipeline(cfg_path)
    # Driver JIT: the product's launch rule (launch.launch_conf: C1 only below the backlog
    # threshold, the full JIT above) sized on the run's input (the scan reads every landed
    # file); "scan@C1" / "scan@full" force one JIT for the reference.
    phase, _, jit = phase.partition("@")
    if jit:
        size: int | None = 0 if jit == "C1" else 2**62
    else:
        pending = backlog(cfg, full_refresh=phase == "scan")
        size = pending.bytes if pending else None
    spark = build_session(cfg, app_name=f"bench-{phase}", backlog_bytes=size)
    session_s = time.perf_counter() - t0
    out: dict[str, Any] = {"phase": phase, "session_start_s": round(session_s, 3),
                           "driver_jit": driver_jit(driver_java_options(spark))}
    if phase == "scan":
        files = sorted(str(p) for p in cfg.landing_path.glob("maxwell-*.json"))
        t1 = time.perf_counter()
        n = spark.read.json(files).count()
        out["seconds"] = round(time.perf_counter() - t1, 3)
        out["rows"] = n
    else:
        from cdc_lake.cdc.job import run_pipeline

        t1 = time.perf_counter()
        summary = run_pipeline(cfg, spark=spark, run_id=f"bench-{phase}")
        out["seconds"] = round(time.perf_counter() - t1, 3)
        out["summary"] = {k: summary.get(k) for k in ("status", "events_read", "batches",
                                                       "quarantined", "duration_s", "engine")}
        if phase == "ingest":
            from deltalake import DeltaTable

            out["delta_rows"] = {t: DeltaTable(str(cfg.table_path(t))).to_pyarrow_table().num_rows
                                 for t in cfg.tables}
    spark.stop()
    return out


class TreeRssSampler(threading.Thread):
    """Peak summed RSS of a process and all its descendants (Python driver + JVM)."""

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak = 0
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._halt.is_set():
            total = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in procs:
                try:
                    total += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self.peak = max(self.peak, total)
            self.samples += 1
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def spawn_phase(phase: str, cfg_path: Path, interval: float, log_dir: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    log_path = log_dir / f"{phase}.log"
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--_phase", phase,
                                 "--_cfg", str(cfg_path)], stdout=subprocess.PIPE, stderr=log,
                                text=True, env=env)
        sampler = TreeRssSampler(proc.pid, interval)
        sampler.start()
        stdout, _ = proc.communicate()
        sampler.stop()
    wall = time.perf_counter() - t0
    with open(log_path, "a") as log:
        log.write("\n--- stdout ---\n" + stdout)
    result = next((json.loads(ln.split(" ", 1)[1]) for ln in stdout.splitlines()
                   if ln.startswith("BENCH_RESULT ")), None)
    if result is not None:  # the job's own per-batch phase timings, when it prints them
        result["job_batch_log"] = [ln for ln in stdout.splitlines() if ln.startswith("[cdc] batch")]
    if proc.returncode != 0 or result is None:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise SystemExit(f"phase {phase} failed (exit {proc.returncode}); log {log_path}:\n{tail}")
    result["process_wall_s"] = round(wall, 3)
    # the machine is shared: record how busy it was (1-minute load average)
    result["loadavg_1m_before_after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    result["peak_rss_mb"] = round(sampler.peak / 2**20, 1)
    result["rss_samples"] = sampler.samples
    return result


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("pyspark", "deltalake", "pyarrow"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "-"
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        out["java"] = (java.stderr or java.stdout).splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        out["java"] = "-"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--files", type=int, default=40)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--max-files-per-trigger", type=int, default=None,
                   help="source.max_files_per_trigger (default: the config default, 1000)")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temp dir, removed after")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    p.add_argument("--sample-interval", type=float, default=0.1)
    p.add_argument("--out", type=Path, default=HERE / "results" / "latest.json")
    p.add_argument("--_phase", help=argparse.SUPPRESS)
    p.add_argument("--_cfg", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args._phase:
        print("BENCH_RESULT " + json.dumps(run_phase(args._phase, args._cfg)), flush=True)
        return 0

    work = args.workdir or Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    if work.exists() and any(work.iterdir()):
        if args.workdir:
            raise SystemExit(f"--workdir {work} is not empty; pass an empty or new folder")
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        data = generate(work / "landing", args.events, args.files, args.seed)
        gen_s = time.perf_counter() - t0
        cfg_path = pipeline_yaml(work, args.max_files_per_trigger)
        print(f"generated {data['events']} events ({data['ops']}) in {data['files']} files, "
              f"{data['bytes'] / 2**20:.1f} MiB, in {gen_s:.1f}s; work dir {work}", flush=True)
        phases = {}
        for phase in ("scan", "ingest", "noop"):
            print(f"phase {phase} ...", flush=True)
            phases[phase] = spawn_phase(phase, cfg_path, args.sample_interval, work)
        scan, ingest, noop = phases["scan"], phases["ingest"], phases["noop"]
        ratio = ingest["seconds"] / scan["seconds"] if scan["seconds"] else float("inf")
        checks = {
            "scan_counted_all_lines": scan["rows"] == data["events"],
            "ingest_read_all_events": ingest["summary"].get("events_read") == data["events"],
            "ingest_rows_match_generator": ingest.get("delta_rows") == data["expected_rows"],
            "noop_read_nothing": noop["summary"].get("events_read") == 0,
        }
        result = {
            "benchmark": "bench_ingest",
            "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "mem_total_gb": _mem_total_gb(), **versions()},
            "params": {"events": data["events"], "files": data["files"], "bytes": data["bytes"],
                       "ops": data["ops"], "seed": args.seed,
                       "max_files_per_trigger": args.max_files_per_trigger or "config default",
                       "engine": "deltalake"},
            "method": "each phase in a fresh Python subprocess with the same build_session() conf; "
                      "seconds = the Spark work only, measured in the subprocess after the session "
                      "exists; peak_rss = max over samples of RSS summed over the subprocess tree "
                      "(Python driver + JVM)",
            "phases": phases,
            "ratio_ingest_over_scan": round(ratio, 3),
            "ingest_events_per_s": round(data["events"] / ingest["seconds"], 1),
            "targets": {"ratio_max": TARGET_RATIO, "noop_max_s": TARGET_NOOP_S,
                        "ratio_ok": ratio <= TARGET_RATIO, "noop_ok": noop["seconds"] <= TARGET_NOOP_S},
            "checks": checks,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print_table(result)
        print(f"\nJSON: {args.out}")
        return 0 if all(checks.values()) else 1
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def _mem_total_gb() -> float:
    import psutil

    return round(psutil.virtual_memory().total / 2**30, 1)


def print_table(res: dict[str, Any]) -> None:
    ph = res["phases"]
    n = res["params"]["events"]
    rows = [
        ("(a) scan: spark.read.json + count", ph["scan"]),
        ("(b) ingest: run_pipeline (deltalake)", ph["ingest"]),
        ("(c) noop: run_pipeline, nothing new", ph["noop"]),
    ]
    print(f"\n{n} events, {res['params']['files']} files, {res['params']['bytes'] / 2**20:.1f} MiB; "
          f"{res['machine']['cpus']} CPUs")
    print(f"{'phase':40} {'spark s':>8} {'session s':>10} {'process s':>10} {'peak RSS MB':>12} "
          f"{'load 1m':>12}")
    for name, r in rows:
        la = r.get("loadavg_1m_before_after", ["-", "-"])
        print(f"{name:40} {r['seconds']:8.2f} {r['session_start_s']:10.2f} {r['process_wall_s']:10.2f} "
              f"{r['peak_rss_mb']:12.0f} {la[0]:>5}->{la[1]:<5}")
    t = res["targets"]
    for ln in ph["ingest"].get("job_batch_log", [])[:10]:
        print(f"  ingest {ln}")
    print(f"\ningest throughput: {res['ingest_events_per_s']:.0f} events/s")
    print(f"ratio (b)/(a): {res['ratio_ingest_over_scan']:.2f}x (target <= {t['ratio_max']}x: "
          f"{'OK' if t['ratio_ok'] else 'MISSED'})")
    print(f"noop run: {ph['noop']['seconds']:.2f}s (target <= {t['noop_max_s']}s: "
          f"{'OK' if t['noop_ok'] else 'MISSED'})")
    bad = [k for k, v in res["checks"].items() if not v]
    print("checks: " + ("all OK" if not bad else "FAILED " + ", ".join(bad)))


if __name__ == "__main__":
    sys.exit(main())
