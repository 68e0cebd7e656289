"""Run the real CDC job as a subprocess and SIGKILL its process group at chosen moments.

Example::

    out = run_job(yaml, kill=Kill("named", point="before_commit"))
    out.killed, out.returncode, out.seconds
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from chaos import REPO

JOB = REPO / "spark_jobs" / "cdc_ingest.py"
CRASH_ENV = "CDC_CRASH_AT"
NAMED_POINTS = ("batch_start", "after_side_tables", "after_table:kv", "after_table:pair",
                "before_commit")


@dataclass(frozen=True)
class Kill:
    """How to kill one run.

    ``mode``: ``named`` (the job SIGKILLs itself at ``point``), ``delay`` (SIGKILL ``delay`` s
    after start), ``data_file`` (SIGKILL as soon as a new data file appears in a table folder:
    inside a Delta commit, before its log entry), ``log_commit`` (SIGKILL as soon as a new
    ``_delta_log`` commit appears: between writes).
    """

    mode: str
    point: str | None = None
    delay: float = 0.0

    def __str__(self) -> str:
        return {"named": f"named:{self.point}", "delay": f"delay:{self.delay:.2f}s"}.get(
            self.mode, self.mode)


@dataclass
class Outcome:
    returncode: int
    killed: bool          # the process group was really SIGKILLed (by itself or by us)
    seconds: float
    stdout: str
    stderr: str

    def tail(self, n: int = 3000) -> str:
        return f"--- stdout\n{self.stdout[-n:]}\n--- stderr\n{self.stderr[-n:]}"


def _snapshot(lake: Path) -> set[str]:
    """Data files and commit files under the lake (tables, side tables, tombstones)."""
    out = set()
    if not lake.is_dir():
        return out
    for root, dirs, files in os.walk(lake):
        dirs[:] = [d for d in dirs if d not in ("_checkpoints", "_runs")]
        for f in files:
            if f.endswith(".parquet") or (f.endswith(".json") and root.endswith("_delta_log")):
                out.add(os.path.join(root, f))
    return out


def _kill_group(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_job(yaml: Path, kill: Kill | None = None, *, lake: Path | None = None,
            timeout: float = 600, run_id: str | None = None) -> Outcome:
    """One run of ``spark_jobs/cdc_ingest.py``; with ``kill``, try to SIGKILL it as described.

    The whole process group dies (the JVM too), like a lost driver host; the lock file's
    advisory lock dies with the process.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(CRASH_ENV, None)
    if kill is not None and kill.mode == "named":
        env[CRASH_ENV] = str(kill.point)
    cmd = [sys.executable, str(JOB), "--pipeline", str(yaml), "--run-id",
           run_id or f"chaos{time.time_ns()}"]
    t0 = time.monotonic()
    out_f = (yaml.parent / "job.out").open("w+")
    err_f = (yaml.parent / "job.err").open("w+")
    proc = subprocess.Popen(cmd, env=env, stdout=out_f, stderr=err_f, start_new_session=True)
    we_killed = False
    try:
        if kill is not None and kill.mode == "delay":
            try:
                proc.wait(timeout=kill.delay)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                we_killed = True
        elif kill is not None and kill.mode in ("data_file", "log_commit") and lake is not None:
            before = _snapshot(lake)
            want = ".parquet" if kill.mode == "data_file" else ".json"
            while proc.poll() is None and time.monotonic() - t0 < timeout:
                new = _snapshot(lake) - before
                if any(f.endswith(want) for f in new):
                    _kill_group(proc)
                    we_killed = True
                    break
                time.sleep(0.005)
        proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
        raise
    finally:
        _kill_group(proc)  # the JVM of a self-killed driver: gone before the next run starts
        _wait_group_gone(proc.pid)
    out_f.seek(0)
    err_f.seek(0)
    stdout, stderr = out_f.read(), err_f.read()
    out_f.close()
    err_f.close()
    # counted as a kill only if the driver really died of SIGKILL (not if it had just finished)
    killed = proc.returncode == -signal.SIGKILL
    return Outcome(proc.returncode, killed, round(time.monotonic() - t0, 2),
                   stdout, stderr)


def _wait_group_gone(pgid: int, limit: float = 10.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            return
        time.sleep(0.02)


def summary_line(stdout: str) -> dict | None:  # type: ignore[type-arg]
    import json

    for ln in reversed(stdout.splitlines()):
        if ln.startswith("CDC_RUN_SUMMARY "):
            return json.loads(ln.split(" ", 1)[1])
    return None
