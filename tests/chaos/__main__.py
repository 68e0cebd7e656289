"""CLI: ``python -m tests.chaos --kills N --seed S [--workdir DIR] [--max-seconds T] [--keep]``.

Prints one line per workload, then ``CHAOS_FIGURES {json}``; exit 1 if any comparison failed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import chaos  # noqa: F401  (sets sys.path for tests/ and src/)

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from chaos.harness import run_chaos

    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=24, help="SIGKILLs to deliver (default 24)")
    p.add_argument("--seed", type=int, default=1, help="random seed (reproduces the workloads)")
    p.add_argument("--workdir", type=Path, default=None, help="work folder (default: a temp dir)")
    p.add_argument("--max-seconds", type=float, default=None, help="stop after this long")
    p.add_argument("--keep", action="store_true", help="keep the folders of passing workloads")
    args = p.parse_args(argv)
    # SIGTERM -> SystemExit, so the driver's cleanup kills the job's process group too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cdc-chaos-"))
    fig = run_chaos(args.kills, args.seed, workdir, max_seconds=args.max_seconds, keep=args.keep)
    d = fig.as_dict()
    d["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    d["command"] = f"python -m tests.chaos --kills {args.kills} --seed {args.seed}"
    failures = d.pop("failures")
    known = d.pop("known_bug_failures")
    for f in known:
        print(f"[chaos] {f}", file=sys.stderr)
    for f in failures:
        print(f"[chaos] FAILURE: {f}", file=sys.stderr)
    d["failures"] = len(failures)
    d["known_bug_failures"] = len(known)
    print("CHAOS_FIGURES " + json.dumps(d, sort_keys=True), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
