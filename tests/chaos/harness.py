"""The chaos loop: random workloads, landing steps, kills, a finishing run, an exact comparison.

Example::

    figures = run_chaos(kills=12, seed=7, workdir=Path("/tmp/chaos"))
    assert figures.failures == []
    print(figures.as_dict())
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from reference_model import RefConfig

from chaos.compare import compare_lake
from chaos.driver import NAMED_POINTS, Kill, run_job, summary_line
from chaos.workload import VARIANTS, make_workload

KILL_MODES = ("named", "named", "delay", "delay", "data_file", "log_commit")
# Kills that land after a batch wrote something (the default tier's one kill): the replay has
# committed writes to skip or deduplicate. A kill before the first write (JVM start,
# ``batch_start``, the first data file) is one whose replay any job survives.
AFTER_WRITE_POINTS = tuple(p for p in NAMED_POINTS if p != "batch_start")
AFTER_WRITE_MODES = ("named", "named", "log_commit")
# Named points reached only after a table's MERGE committed: the replay must skip that table's
# write by its transaction id (``skipped_batches`` in the replaying run's summary). Not
# ``before_commit``: a batch of only quarantined or DDL lines reaches it with no table written.
AFTER_TABLE_POINTS = tuple(p for p in NAMED_POINTS if p.startswith("after_table"))
# Product bugs the harness has found and reported (signature in the job's stderr -> bug). A
# failure with one of these signatures is counted in ``known_bug_failures``; any other failure
# is new. Remove an entry once the bug is fixed.
# Product bugs found by the harness and not fixed yet: {signature in the failure text: report}.
# A failure matching one is reported as "known" (xfail) instead of new. Bug A ("rows failed
# validation check", workload 144272509/maxwell) is fixed; tests/test_chaos.py keeps its
# regression test.
KNOWN_BUGS: dict[str, str] = {}


def known_bug(text: str) -> str | None:
    return next((bug for sig, bug in KNOWN_BUGS.items() if sig in text), None)


@dataclass
class Figures:
    seed: int
    kills: int = 0
    kill_attempts: int = 0            # attempts whose run finished before the kill fired
    kills_by_mode: Counter = field(default_factory=Counter)  # type: ignore[type-arg]
    runs: int = 0                     # job processes started (killed or not)
    completed_runs: int = 0           # runs that finished (exit 0) and were compared
    workloads: int = 0
    formats: Counter = field(default_factory=Counter)  # type: ignore[type-arg]
    rows_compared: int = 0
    rows_lost: int = 0
    rows_duplicated: int = 0
    quarantine_rows_checked: int = 0
    ddl_rows_checked: int = 0
    skipped_batch_writes: int = 0     # table writes the txn-id check skipped on a replay
    kills_after_table_commit: int = 0  # kills at after_table:* (a MERGE had committed)
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    known_bug_failures: list[str] = field(default_factory=list)

    def fail(self, text: str, evidence: str = "") -> None:
        bug = known_bug(text + evidence)
        if bug:
            self.known_bug_failures.append(f"KNOWN BUG: {bug}\n{text[:1500]}")
        else:
            self.failures.append(text)

    def as_dict(self) -> dict:  # type: ignore[type-arg]
        d = asdict(self)
        d["kills_by_mode"] = dict(self.kills_by_mode)
        d["formats"] = dict(self.formats)
        return d


def _land(landing: Path, name: str, lines: list[str]) -> None:
    tmp = landing / f".{name}.tmp"
    tmp.write_text("".join(f"{ln}\n" for ln in lines), encoding="utf-8")
    os.replace(tmp, landing / name)


def _skipped(stdout: str) -> int:
    """Table writes a finished run skipped by their transaction id (its summary)."""
    s = summary_line(stdout) or {}
    return sum(t.get("skipped_batches", 0) for t in (s.get("tables") or {}).values())


def _uncommitted_write(lake: Path, table: str) -> bool:
    """Whether ``table`` holds a write (its Delta transaction) of a batch the checkpoint has not
    committed: what a replay must skip by transaction id."""
    commits = [int(p.name) for p in lake.glob("_checkpoints/*/commits/*") if p.name.isdigit()]
    last = max(commits, default=-1)
    for f in (lake / table / "_delta_log").glob("*.json"):
        for line in f.read_text(encoding="utf-8").splitlines():
            txn = json.loads(line).get("txn") if line.strip() else None
            if txn and int(txn.get("version", -1)) > last:
                return True
    return False


def _choose_kill(rng: random.Random, est_run_s: float, after_write: bool) -> Kill:
    mode = rng.choice(AFTER_WRITE_MODES if after_write else KILL_MODES)
    if mode == "named":
        return Kill("named", point=rng.choice(AFTER_WRITE_POINTS if after_write else NAMED_POINTS))
    if mode == "delay":
        return Kill("delay", delay=rng.uniform(0.5, est_run_s))
    return Kill(mode)


def run_chaos(kills: int, seed: int, workdir: Path, *, max_seconds: float | None = None,
              log: Callable[[str], None] | None = None, keep: bool = False,
              attempts_per_step: tuple[int, ...] = (1, 1, 2), after_write: bool = False) -> Figures:
    """Kill the job at least ``kills`` times over random workloads (or until ``max_seconds``).

    Every landing step: a number of kill attempts drawn from ``attempts_per_step`` (each run
    replays what the killed one left), then a normal run that must exit 0, then the whole lake
    is compared with the reference model. The run ends with the first step by which ``kills``
    were delivered and the comparisons covered quarantine and DDL-log rows. A failure is
    recorded with everything needed to reproduce it (workload seed and format, the kills so far)
    and ends that workload. ``after_write``: only kills that land after the batch's first write
    (named points from ``after_side_tables`` on, the first new Delta commit).
    """
    log = log or (lambda m: print(m, flush=True))
    rng = random.Random(seed)
    fig = Figures(seed=seed)
    t0 = time.monotonic()
    est_run = 12.0
    n = 0
    while fig.kills < kills and (max_seconds is None or time.monotonic() - t0 < max_seconds):
        fmt, opts = VARIANTS[n % len(VARIANTS)]   # rotate: every format (and Debezium plain)
        wl = make_workload(rng.randrange(10**9), fmt, opts)
        n += 1
        fig.workloads += 1
        fig.formats[wl.label.split(" ")[0]] += 1
        root = workdir / f"w{n:04d}"
        shutil.rmtree(root, ignore_errors=True)
        landing, lake = root / "landing", root / "lake"
        root.mkdir(parents=True)
        yaml = wl.write_yaml(root / "pipeline.yaml", landing, lake)
        history: list[str] = []
        ok = True
        for step_no, step in enumerate(wl.steps):
            for name, lines in step:
                _land(landing, name, lines)
            for _ in range(rng.choice(attempts_per_step)):
                if fig.kills >= kills:
                    break
                kill = _choose_kill(rng, est_run, after_write)
                out = run_job(yaml, kill, lake=lake)
                fig.runs += 1
                history.append(f"step{step_no}:{kill}->{'KILLED' if out.killed else out.returncode}")
                if out.killed:
                    fig.kills += 1
                    fig.kills_by_mode[kill.mode if kill.mode != "named" else kill.point] += 1
                    # a MERGE committed for the batch the kill cut short (the crash point also
                    # fires after a table the batch had nothing for: no write to skip then)
                    fig.kills_after_table_commit += kill.point in AFTER_TABLE_POINTS and \
                        _uncommitted_write(lake, kill.point.split(":", 1)[1])
                elif out.returncode != 0:
                    fig.fail(f"{wl.label}: run with {kill} exited {out.returncode}; "
                                        f"history {history}\n{out.tail()}", out.stderr)
                    ok = False
                    break
                else:  # the kill did not fire and the run finished: it may be the replay
                    fig.kill_attempts += 1
                    fig.skipped_batch_writes += _skipped(out.stdout)
            if not ok:
                break
            out = run_job(yaml, None, lake=lake)
            fig.runs += 1
            history.append(f"step{step_no}:finish->{out.returncode}")
            if out.returncode != 0:
                fig.fail(f"{wl.label}: finishing run exited {out.returncode}; "
                                    f"history {history}\n{out.tail()}", out.stderr)
                ok = False
                break
            est_run = 0.7 * est_run + 0.3 * out.seconds
            fig.completed_runs += 1
            fig.skipped_batch_writes += _skipped(out.stdout)
            res = compare_lake(RefConfig.from_yaml(yaml), landing, lake)
            fig.rows_compared += res.rows_compared
            fig.rows_lost += res.rows_lost
            fig.rows_duplicated += res.rows_duplicated
            fig.quarantine_rows_checked += res.quarantine_checked
            fig.ddl_rows_checked += res.ddl_checked
            if res.problems:
                fig.fail(f"{wl.label}: after step {step_no}, history {history}:\n"
                                    + "\n".join(res.problems[:30]))
                ok = False
                break
            if fig.kills >= kills and fig.quarantine_rows_checked and fig.ddl_rows_checked:
                break  # target met, and the comparisons so far covered quarantine and DDL-log
                # rows: later steps would only be runs without kills (~15 s job processes each)
        log(f"[chaos] workload {n} {wl.label}: {'ok' if ok else 'FAILED'}; {' '.join(history)}; "
            f"kills so far {fig.kills}, {time.monotonic() - t0:.0f}s")
        if ok and not keep:
            shutil.rmtree(root, ignore_errors=True)
    fig.seconds = round(time.monotonic() - t0, 1)
    return fig
