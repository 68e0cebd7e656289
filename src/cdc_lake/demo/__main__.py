"""CLI: ``python -m cdc_lake.demo --format maxwell --out DIR --days 3 --seed 7 [--start-day N]``.

Exit codes: 0 success, 2 bad arguments or a landing folder that does not fit them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cdc_lake.demo.generator import GeneratorError, generate
from cdc_lake.demo.pipeline_yaml import write_pipeline_yaml
from cdc_lake.demo.writers import FORMATS


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cdc_lake.demo",
        description="Simulate a MySQL shop database and land its binlog as CDC JSON lines.")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--out", required=True, type=Path, help="landing folder")
    p.add_argument("--days", type=int, default=3, help="days to simulate (default 3)")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (default 7)")
    p.add_argument("--start-day", type=int, default=None,
                   help="append to an existing folder, starting at this day (the next one)")
    p.add_argument("--txns-per-day", type=int, default=None)
    p.add_argument("--lines-per-file", type=int, default=None)
    p.add_argument("--no-debezium-schema", action="store_true",
                   help="debezium: envelope only, without the schema wrapper")
    p.add_argument("--no-debezium-tombstones", action="store_true",
                   help="debezium: no 'null' line after deletes")
    p.add_argument("--no-maxwell-position", action="store_true",
                   help="maxwell: omit 'position' (order falls back to ts, xid, xoffset)")
    p.add_argument("--maxwell-real-xoffset", action="store_true",
                   help="maxwell: omit xoffset on the commit row, as Maxwell itself does")
    p.add_argument("--write-pipeline", type=Path, default=None, metavar="YAML",
                   help="also write a matching pipeline YAML here")
    p.add_argument("--lake-root", type=Path, default=None,
                   help="storage.root for --write-pipeline (default data/lake/<pipeline>)")
    p.add_argument("--pipeline-name", default=None, help="pipeline name (default shop_<format>)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    options: dict[str, Any] = {}
    if args.txns_per_day is not None:
        options["txns_per_day"] = args.txns_per_day
    if args.lines_per_file is not None:
        options["lines_per_file"] = args.lines_per_file
    if args.no_debezium_schema:
        options["debezium_schema"] = False
    if args.no_debezium_tombstones:
        options["debezium_tombstones"] = False
    if args.no_maxwell_position:
        options["maxwell_position"] = False
    if args.maxwell_real_xoffset:
        options["maxwell_commit_xoffset"] = False
    try:
        result = generate(args.out, args.format, days=args.days, seed=args.seed,
                          start_day=args.start_day, **options)
    except GeneratorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(result.files)} files ({result.lines} lines, days {result.first_day}.."
          f"{result.next_day - 1}) to {args.out}; append more with --start-day {result.next_day}")
    if args.write_pipeline is not None:
        name = args.pipeline_name or f"shop_{args.format}"
        lake_root = args.lake_root or Path("data/lake") / name
        path = write_pipeline_yaml(
            args.write_pipeline, args.format, name=name, landing=args.out.resolve(),
            lake_root=lake_root.resolve(), debezium_schema=not args.no_debezium_schema)
        print(f"pipeline written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
