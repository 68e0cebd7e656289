"""Run ids travel from Airflow (``manual__2026-11-21T12:00:00+00:00``) into file names and CLI args.

The DAG passes the raw Airflow run id (``--run-id {{ run_id }}``, one argv element, no shell);
the job and the Airflow operator both derive file names from it with :func:`safe_run_id`, so they
agree on where a run's summary lives (:func:`run_summary_path`, see docs/contracts.md).

Example::

    safe_run_id("manual__2026-11-21T12:00:00+00:00")   # 'manual__2026-11-21T12_00_00_00_00'
    run_summary_path("/lake/_runs", "shop_maxwell", "manual__2026-11-21T12:00:00+00:00")
    # PosixPath('/lake/_runs/shop_maxwell/manual__2026-11-21T12_00_00_00_00.json')
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_run_id(run_id: str) -> str:
    """Keep ``[A-Za-z0-9._-]``, replace everything else with ``_`` (stable, file-name safe)."""
    return _UNSAFE.sub("_", run_id)


def run_summary_path(runs_path: str | os.PathLike[str], pipeline: str, run_id: str) -> Path:
    """``<storage.runs>/<pipeline>/<safe_run_id(run_id)>.json``: where the job writes a run's summary."""
    return Path(runs_path) / pipeline / f"{safe_run_id(run_id)}.json"
