"""The parsers alone: a warm Spark session parses N change lines of each format, against a plain
read of the same lines in the same session.

What a large batch's ``survey`` phase spends first is the format parser (``cdc_lake.cdc.formats``):
one JSON parse per line and then the envelope's fields, order keys and checks as Spark
expressions. How those expressions are laid out matters: as one projection, Spark evaluated a
field's read again in every ``CASE`` branch that used it (the Maxwell parser's position regexes
about twenty times per line, 2026-12-01). This script times each parser's output written to
Spark's ``noop`` sink (every column evaluated, nothing stored), ``--reps`` times after one
warm-up, and the read of the same lines (``spark.read.text(...).count()``) in between, so the
ratio of the medians comes from one sitting. ``--src`` points at another checkout's ``src`` to
time an older parser on the same lines (alternate the two trees' runs for a comparison).

The lines come from the demo's shop simulation (``python -m cdc_lake.demo``), generated once
into ``--data`` (minutes for 100k Debezium lines with the schema wrapper; kept for later runs).

Example::

    python benchmarks/bench_parse.py --formats maxwell,debezium,canal --lines 100000
    python benchmarks/bench_parse.py --formats debezium --src /path/to/older/checkout/src
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# demo transactions per day giving about 10k lines a day (measured on the demo's shop model)
TXNS_PER_10K_LINES = {"maxwell": 3300, "debezium": 3100, "canal": 4300}


def landing(data: Path, fmt: str, lines: int) -> Path:
    """``data/<fmt>-<lines>``: the demo's landing files of about ``lines`` lines (made once)."""
    folder = data / f"{fmt}-{lines}"
    if not (folder / ".complete").exists():
        days = max(1, lines // 10_000)
        txns = max(10, TXNS_PER_10K_LINES[fmt] * lines // (days * 10_000))
        subprocess.run([sys.executable, "-m", "cdc_lake.demo", "--format", fmt, "--out", str(folder),
                        "--days", str(days), "--txns-per-day", str(txns)],
                       check=True, stdout=subprocess.DEVNULL)
        (folder / ".complete").write_text("")
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--formats", default="maxwell,debezium,canal")
    p.add_argument("--lines", type=int, default=100_000, help="change lines per format (about)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--data", type=Path, default=Path("/tmp/cdc-bench-parse"),
                   help="where the generated lines are kept between runs")
    p.add_argument("--src", type=Path, default=REPO / "src", help="the cdc_lake sources to time")
    a = p.parse_args(argv)
    sys.path.insert(0, str(a.src.resolve()))
    import cdc_lake
    from cdc_lake.cdc.formats import parser_for
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    assert Path(cdc_lake.__file__).resolve().is_relative_to(a.src.resolve()), cdc_lake.__file__
    folders = {fmt: landing(a.data, fmt, a.lines) for fmt in a.formats.split(",") if fmt}
    spark = (SparkSession.builder.master("local[2]").appName("bench-parse")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "2g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    out = {"src": str(a.src), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "formats": {}}
    for fmt, folder in folders.items():
        def lines():  # type: ignore[no-untyped-def]
            return spark.read.text(str(folder)).select(F.input_file_name().alias("_file"),
                                                        F.col("value").alias("_line"))

        def timed(action) -> float:  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            action()
            return round(time.perf_counter() - t0, 3)

        def parse() -> None:
            parser_for(fmt)(lines()).write.format("noop").mode("overwrite").save()

        n = lines().count()
        parse()  # warm-up: class loading, JIT of this format's code paths
        parse_s, read_s = [], []
        for _ in range(a.reps):
            read_s.append(timed(lambda: lines().count()))
            parse_s.append(timed(parse))
        res = {"lines": n, "parse_s": parse_s, "read_s": read_s,
               "ratio": round(statistics.median(parse_s) / statistics.median(read_s), 2)}
        out["formats"][fmt] = res
        print(f"[bench-parse] {fmt}: {n} lines, parse {statistics.median(parse_s)} s, "
              f"read {statistics.median(read_s)} s (medians of {a.reps}), ratio {res['ratio']}", flush=True)
    spark.stop()
    print("BENCH_PARSE " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
