"""Read-only pipeline status for the "CDC pipelines" Airflow view.

There is no second source of truth: everything shown is read, on every request, from

* the pipeline YAML files (``load_all`` on ``$CDC_PIPELINES_DIR``, default ``<repo>/pipelines``),
* each target table's Delta log (``deltalake.DeltaTable(path).version()``),
* the pipeline's Spark checkpoint (``<checkpoint>/commits/N`` and ``<checkpoint>/offsets/N``),
* the last run summary ``<storage.runs>/<pipeline>/latest.json`` (see docs/contracts.md).

Nothing here imports pyspark or touches the Airflow metadata database, and nothing writes.
Every reader degrades to a value plus an ``error`` string instead of raising, so one broken
table or file never hides the other pipelines.

Example::

    from cdc_lake.airflow.status import collect_status
    collect_status("pipelines")["pipelines"][0]["tables"][0]["delta_version"]   # 7, or None
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cdc_lake.cdc.config import PipelineConfig
from cdc_lake.config import load_all

from cdc_lake.airflow import PIPELINES_DIR_ENV, pipelines_dir  # noqa: F401  (one definition)


# --------------------------------------------------------------------------- checkpoint


@dataclass(frozen=True)
class CheckpointState:
    """What a Spark streaming checkpoint folder says about progress.

    ``last_batch_id`` is the highest N with a ``commits/N`` file (the last batch Spark finished);
    ``pending_batch_id`` is the highest ``offsets/N`` without a ``commits/N`` (planned, not
    committed: a run died or is running now; the next run replays it).
    """

    path: str
    exists: bool
    last_batch_id: int | None = None
    pending_batch_id: int | None = None
    error: str | None = None


def _batch_ids(folder: Path) -> set[int]:
    """Batch ids in a Spark metadata log folder: plain decimal file names only.

    Spark also leaves ``.N.crc`` checksums and ``.N.<uuid>.tmp`` files while writing; those and
    anything else that is not a regular file named by digits are ignored.
    """
    if not folder.is_dir():
        return set()
    ids = set()
    for entry in os.scandir(folder):
        if entry.name.isdigit() and entry.is_file():
            ids.add(int(entry.name))
    return ids


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointState:
    p = Path(path)
    if not p.exists():
        return CheckpointState(str(p), exists=False)
    try:
        commits = _batch_ids(p / "commits")
        offsets = _batch_ids(p / "offsets")
    except OSError as e:
        return CheckpointState(str(p), exists=True, error=f"cannot read checkpoint: {e}")
    last = max(commits) if commits else None
    uncommitted = [n for n in offsets if n not in commits and (last is None or n > last)]
    return CheckpointState(str(p), exists=True, last_batch_id=last,
                           pending_batch_id=max(uncommitted) if uncommitted else None)


# --------------------------------------------------------------------------- delta


@dataclass(frozen=True)
class DeltaState:
    path: str
    exists: bool
    version: int | None = None
    error: str | None = None


def read_delta_version(path: str | os.PathLike[str]) -> DeltaState:
    """Current version from the Delta log; ``exists=False`` when no table is there yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    p = str(path)
    if not Path(p, "_delta_log").is_dir():
        return DeltaState(p, exists=False)
    try:
        return DeltaState(p, exists=True, version=DeltaTable(p).version())
    except TableNotFoundError:
        # e.g. an empty _delta_log left by a writer that died before its first commit
        return DeltaState(p, exists=False)
    except Exception as e:  # noqa: BLE001 - shown to the user instead of hiding the table
        return DeltaState(p, exists=True, error=f"cannot read Delta log: {type(e).__name__}: {e}")


# --------------------------------------------------------------------------- run summary


def read_run_summary(runs_path: str | os.PathLike[str], pipeline: str) -> tuple[dict | None, str | None]:
    """``(summary, error)`` from ``<runs>/<pipeline>/latest.json``; ``(None, None)`` if no run yet."""
    f = Path(runs_path) / pipeline / "latest.json"
    try:
        text = f.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot read {f}: {e}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"{f} is not valid JSON: {e}"
    if not isinstance(data, dict):
        return None, f"{f}: expected a JSON object, got {type(data).__name__}"
    return data, None


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# --------------------------------------------------------------------------- assembly


def pipeline_status(cfg: PipelineConfig) -> dict[str, Any]:
    """Status of one pipeline as plain JSON-able data (the JSON endpoint returns exactly this)."""
    if getattr(cfg, "kind", "cdc") in ("enrich", "dimension"):  # same shape + a kind block
        from cdc_lake.airflow.kind_status import dimension_status, enrich_status

        return enrich_status(cfg) if cfg.kind == "enrich" else dimension_status(cfg)
    ckpt = read_checkpoint(cfg.checkpoint_path)
    summary, summary_error = read_run_summary(cfg.runs_path, cfg.name)
    summary_tables = (summary or {}).get("tables")
    if not isinstance(summary_tables, dict):
        summary_tables = {}
    tables = []
    for name, t in cfg.tables.items():
        delta = read_delta_version(t.path)
        last = summary_tables.get(name)
        last = last if isinstance(last, dict) else {}
        tables.append({
            "table": name,
            "source": ".".join(x for x in (t.database, t.source_table) if x),
            "scd": t.scd,
            "path": str(t.path),
            "exists": delta.exists,
            "delta_version": delta.version,
            "delta_error": delta.error,
            "last_run": {k: _int_or_none(last.get(k)) for k in
                         ("inserted", "updated", "deleted", "delta_version")} if last else None,
        })
    last_run = None
    if summary is not None:
        last_run = {
            "run_id": summary.get("run_id"),
            "status": summary.get("status"),
            "started_at": summary.get("started_at"),
            "finished_at": summary.get("finished_at"),
            "duration_s": summary.get("duration_s"),
            "batches": _int_or_none(summary.get("batches")),
            "last_batch_id": _int_or_none(summary.get("last_batch_id")),
            "events_read": _int_or_none(summary.get("events_read")),
            "quarantined": _int_or_none(summary.get("quarantined")),
            "engine": summary.get("engine"),
        }
    quarantine = read_delta_version(cfg.quarantine_path)
    return {
        "pipeline": cfg.name,
        "kind": "cdc",
        "description": cfg.description,
        "format": cfg.source_format,
        "config_file": str(cfg.file),
        "landing_path": str(cfg.landing_path),
        "checkpoint": asdict(ckpt),
        "quarantine": {"path": quarantine.path, "exists": quarantine.exists,
                       "delta_version": quarantine.version, "error": quarantine.error},
        "last_run": last_run,
        "last_run_error": summary_error,
        "tables": tables,
    }


def collect_status(directory: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Status of every pipeline in ``directory`` (default :func:`pipelines_dir`)."""
    folder = Path(directory) if directory is not None else pipelines_dir()
    result: dict[str, Any] = {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "pipelines_dir": str(folder),
        "pipelines": [],
        "config_errors": [],
    }
    if not folder.is_dir():
        result["config_errors"].append(f"{folder}: pipelines folder not found "
                                       f"(set {PIPELINES_DIR_ENV})")
        return result
    configs, errors = load_all(folder)
    result["config_errors"] = [str(e) for e in errors]
    for cfg in configs:
        try:
            result["pipelines"].append(pipeline_status(cfg))
        except Exception as e:  # noqa: BLE001 - one broken pipeline must not hide the others
            result["config_errors"].append(f"{cfg.file}: cannot read status: {type(e).__name__}: {e}")
    return result
