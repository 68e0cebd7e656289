"""Run summaries shared by every job kind (cdc, enrich, dimension).

A job builds one JSON-able dict per run (``pipeline``, ``run_id``, ``status``, ``started_at``,
``finished_at`` are required; the rest is the kind's own), then, **while it still holds the
pipeline lock**:

* :func:`record_summary` writes ``<runs>/<pipeline>/<run_id>.json`` and, unless a newer run's
  summary is already there, ``<runs>/<pipeline>/latest.json`` (both written atomically:
  temp file + rename, so a reader never sees half a file);
* :func:`print_summary` prints the human lines and one machine line ``CDC_RUN_SUMMARY {json}``
  (the Airflow operator and the task log read it).

Example::

    from cdc_lake.summary import print_summary, record_summary
    summary = {"pipeline": "shop", "run_id": "r1", "status": "succeeded",
               "started_at": "2026-11-23T08:00:00+00:00", "finished_at": "2026-11-23T08:00:09+00:00"}
    record_summary("/lake/_runs", "shop", summary)   # -> /lake/_runs/shop/r1.json (+ latest.json)
    print_summary(summary, human=["[enrich] shop r1: 3 rows"])
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from cdc_lake.runids import run_summary_path

SUMMARY_PREFIX = "CDC_RUN_SUMMARY "
LATEST = "latest.json"


def _when(summary: dict[str, Any]) -> tuple[datetime, datetime] | None:
    """``(started_at, finished_at)`` of a summary, or None if unreadable."""
    try:
        started = datetime.fromisoformat(str(summary["started_at"]))
        finished = datetime.fromisoformat(str(summary.get("finished_at") or summary["started_at"]))
        return started, finished
    except (KeyError, TypeError, ValueError):
        return None


def is_older(candidate: dict[str, Any], existing: dict[str, Any]) -> bool:
    """True if ``candidate`` is a run that started (then finished) before ``existing``.

    Equal times are not older: runs of one pipeline are serialized by its lock, so of two
    summaries with the same second the one written last is the later run.
    """
    a, b = _when(candidate), _when(existing)
    if a is None or b is None:
        return False  # an unreadable existing summary is replaced
    try:  # a summary from the future (a host with a fast clock) is not a newer run (tester)
        if b[0].timestamp() > datetime.now().timestamp() + 300:
            return False
    except (OverflowError, ValueError, OSError):
        return False
    return a < b


def _atomic_write(target: Path, text: str) -> None:
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)


def record_summary(runs_path: str | os.PathLike[str], pipeline: str,
                   summary: dict[str, Any]) -> Path:
    """Write the run's summary JSON and update ``latest.json`` unless a newer run is there.

    Call it before releasing the pipeline lock, so no later run can record first.
    Returns the path of ``<run_id>.json``.
    """
    path = run_summary_path(runs_path, pipeline, str(summary["run_id"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(summary, indent=2, default=str)
    _atomic_write(path, text)
    latest = path.with_name(LATEST)
    try:
        existing = json.loads(latest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        existing = None
    if isinstance(existing, dict) and existing.get("run_id") != summary["run_id"] \
            and is_older(summary, existing):
        return path  # a newer run already recorded its summary: keep it as the latest
    _atomic_write(latest, text)
    return path


def record_failure(runs_path: str | os.PathLike[str], pipeline: str, summary: dict[str, Any]) -> None:
    """:func:`record_summary` of a failed run: a summary that cannot be written (an unwritable
    runs folder) is a warning here, so the run's own error stays the one reported (tester: a
    PermissionError replaced a damaged checkpoint's exit 3 by exit 1)."""
    try:
        record_summary(runs_path, pipeline, summary)
    except OSError as e:
        print(f"[cdc-lake] WARNING: could not write the failed run's summary under {runs_path}: "
              f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)


def print_summary(summary: dict[str, Any], human: Iterable[str] = (),
                  out: IO[str] | None = None) -> None:
    """Print the human lines, then ``CDC_RUN_SUMMARY {json}`` on one line."""
    stream = out or sys.stdout
    for line in human:
        print(line, file=stream)
    print(SUMMARY_PREFIX + json.dumps(summary, default=str), file=stream, flush=True)
