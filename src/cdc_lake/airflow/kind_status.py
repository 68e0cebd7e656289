"""Plugin-view status of the ``enrich`` and ``dimension`` pipeline kinds (no pyspark, read-only).

:func:`cdc_lake.airflow.status.pipeline_status` dispatches here by ``cfg.kind``. Both return the
CDC status shape (``pipeline``, ``format``, ``checkpoint``, ``last_run``, ``tables``, ...) so the
page renders them the same way, plus one kind block:

* ``enrichment``: ``pending_rows`` and ``oldest_parked_at`` of the pending table (from the Delta
  log's per-file statistics — ``numRecords`` and ``minValues._parked_at`` — falling back to a
  scan of that one column), ``dimension_versions`` used by the last run (its summary).
* ``dimension``: ``last_applied_date`` (the table's Delta transaction version of
  ``dimension-<pipeline>``, i.e. the date as yyyymmdd, or the state file if later), SCD type, keys,
  snapshot folder.

Example::

    enrich_status(load_pipeline("pipelines/shop_order_lines.yaml"))["enrichment"]["pending_rows"]
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cdc_lake.airflow.status import (CheckpointState, _int_or_none, read_checkpoint, read_delta_version,
                                     read_run_summary)


def _last_run(summary: dict[str, Any] | None, events_key: str) -> dict[str, Any] | None:
    if summary is None:
        return None
    return {
        "run_id": summary.get("run_id"), "status": summary.get("status"),
        "started_at": summary.get("started_at"), "finished_at": summary.get("finished_at"),
        "duration_s": summary.get("duration_s"), "batches": _int_or_none(summary.get("batches")),
        "last_batch_id": _int_or_none((summary.get("batch_ids") or [None])[-1]
                                      if isinstance(summary.get("batch_ids"), list) else None),
        "events_read": _int_or_none(summary.get(events_key)),
        "quarantined": _int_or_none(summary.get("quarantined")), "engine": summary.get("engine"),
    }


def _enrich_last_run(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """An enrichment run reads facts; a ``--reprocess`` snapshot batch is counted apart
    (tester: a reprocess that rebuilt 210 facts showed "0 events read")."""
    run = _last_run(summary, "facts_read")
    if run is not None and summary is not None:
        snap = summary.get("reprocess_snapshot")
        run["read_label"] = "facts read"
        run["reprocess_snapshot"] = ({k: _int_or_none(snap.get(k)) for k in
                                      ("facts_read", "enriched_upserted", "parked")}
                                     if isinstance(snap, dict) else None)
    return run


def _table_row(name: str, path: Path, last: Any, scd: int | None = None) -> dict[str, Any]:
    delta = read_delta_version(path)
    metrics = last if isinstance(last, dict) else ({"delta_version": last} if isinstance(last, int) else {})
    return {"table": name, "source": None, "scd": scd, "path": str(path), "exists": delta.exists,
            "delta_version": delta.version, "delta_error": delta.error,
            "last_run": {k: _int_or_none(metrics.get(k)) for k in
                         ("inserted", "updated", "deleted", "delta_version")} if metrics else None}


def pending_stats(path: Path) -> dict[str, Any]:
    """``{rows, oldest_parked_at, error}`` of a pending table (None values when there is none)."""
    out: dict[str, Any] = {"rows": None, "oldest_parked_at": None, "error": None}
    if not (path / "_delta_log").is_dir():
        return out
    try:
        import pyarrow as pa
        from deltalake import DeltaTable

        dt = DeltaTable(str(path))
        adds = pa.table(dt.get_add_actions(flatten=True)).to_pydict()  # arro3 -> pyarrow
        counts = adds.get("num_records") or []
        mins = adds.get("min._parked_at")
        if counts and all(c is not None for c in counts) and (mins is None or all(m is not None for m in mins)):
            out["rows"] = int(sum(counts))
            oldest = min(mins) if mins else None
        else:  # no statistics written: read the one column
            col = dt.to_pyarrow_dataset().to_table(columns=["_parked_at"]).column("_parked_at").to_pylist()
            out["rows"] = len(col)
            oldest = min((v for v in col if v is not None), default=None)
        if isinstance(oldest, datetime):
            oldest = (oldest if oldest.tzinfo else oldest.replace(tzinfo=timezone.utc)).isoformat(timespec="seconds")
        out["oldest_parked_at"] = oldest if out["rows"] else None
    except Exception as e:  # noqa: BLE001 - shown in the view instead of hiding the pipeline
        out["error"] = f"cannot read pending table: {type(e).__name__}: {e}"
    return out


def enrich_status(cfg: Any) -> dict[str, Any]:
    ckpt = read_checkpoint(cfg.checkpoint_path)
    summary, summary_error = read_run_summary(cfg.runs_path, cfg.name)
    summary_tables = (summary or {}).get("tables")
    summary_tables = summary_tables if isinstance(summary_tables, dict) else {}
    outputs = dict(cfg.output_tables)
    quarantine = read_delta_version(outputs.pop("quarantine"))
    pending = pending_stats(cfg.outputs.pending)
    dims = (summary or {}).get("dimension_versions")
    return {
        "pipeline": cfg.name, "kind": "enrich", "description": cfg.description, "format": "enrich",
        "config_file": str(cfg.file), "landing_path": None,
        "checkpoint": asdict(ckpt),
        "quarantine": {"path": quarantine.path, "exists": quarantine.exists,
                       "delta_version": quarantine.version, "error": quarantine.error},
        "last_run": _enrich_last_run(summary), "last_run_error": summary_error,
        "tables": [_table_row(n, p, summary_tables.get(n)) for n, p in outputs.items()],
        "enrichment": {
            "pending_rows": pending["rows"], "oldest_parked_at": pending["oldest_parked_at"],
            "pending_error": pending["error"], "pending_path": str(cfg.outputs.pending),
            "dimension_versions": {str(k): _int_or_none(v) for k, v in dims.items()}
            if isinstance(dims, dict) else None,
            "upstream": [str(p) for p in cfg.upstream_tables],
        },
    }


def last_applied_date(cfg: Any) -> tuple[str | None, str | None]:
    """``(date, error)``: the later of the Delta txn version and the state file."""
    found: list[int] = []
    error = None
    try:
        data = json.loads((cfg.checkpoint_path / "last_applied.json").read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("version"), int):
            found.append(data["version"])
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        error = f"cannot read state file: {e}"
    if (cfg.table / "_delta_log").is_dir():
        try:
            from deltalake import DeltaTable

            v = DeltaTable(str(cfg.table)).transaction_version(cfg.app_id)
            if isinstance(v, int):
                found.append(v)
        except Exception as e:  # noqa: BLE001
            error = f"cannot read Delta log: {type(e).__name__}: {e}"
    if not found:
        return None, error
    s = f"{max(found):08d}"
    return f"{s[:4]}-{s[4:6]}-{s[6:]}", error


def dimension_status(cfg: Any) -> dict[str, Any]:
    summary, summary_error = read_run_summary(cfg.runs_path, cfg.name)
    applied, applied_error = last_applied_date(cfg)
    last = None
    if summary is not None:
        last = _last_run(summary, "snapshot_rows")
        last["date"] = summary.get("date")
    table = _table_row("table", cfg.table, (summary or {}).get("tables", {}).get("table")
                       if isinstance((summary or {}).get("tables"), dict) else None, cfg.scd)
    return {
        "pipeline": cfg.name, "kind": "dimension", "description": cfg.description, "format": "dimension",
        "config_file": str(cfg.file), "landing_path": str(cfg.snapshots.path),
        "checkpoint": asdict(CheckpointState(str(cfg.checkpoint_path), exists=False)),
        "quarantine": {"path": None, "exists": False, "delta_version": None, "error": None},
        "last_run": last, "last_run_error": summary_error,
        "tables": [table],
        "dimension": {"last_applied_date": applied, "error": applied_error, "scd": cfg.scd,
                      "keys": list(cfg.keys), "snapshots": str(cfg.snapshots.path / cfg.snapshots.pattern),
                      "last_run_date": (summary or {}).get("date"),
                      "last_run_status": (summary or {}).get("status")},
    }


def render_kind_block(p: dict[str, Any], e: Any, num: Any) -> str:
    """HTML lines of the kind block (``e`` escapes, ``num`` renders a number or a dash)."""
    name = e(p["pipeline"])
    if p.get("kind") == "dimension":
        d = p["dimension"]
        err = f" <span class='err'>{e(d['error'])}</span>" if d.get("error") else ""
        return (f"<p class='meta'>Dimension (SCD{e(d['scd'])}, keys {e(', '.join(d['keys']))}): last applied "
                f"date <b data-testid='last-applied-{name}'>{e(d.get('last_applied_date'))}</b>{err}"
                f" &middot; last run date {e(d.get('last_run_date'))} ({e(d.get('last_run_status'))})"
                f" &middot; snapshots <code class='muted'>{e(d['snapshots'])}</code></p>")
    en = p["enrichment"]
    dims = en.get("dimension_versions")
    dims_text = ", ".join(f"{e(k)} v{num(v)}" for k, v in sorted(dims.items())) if dims else e(None)
    err = f" <span class='err'>{e(en['pending_error'])}</span>" if en.get("pending_error") else ""
    parked = en.get("pending_rows")
    cls = "pending" if parked else "ok"
    return (f"<p class='meta'>Pending (parked facts): <b class='{cls}' data-testid='pending-rows-{name}'>"
            f"{num(parked)}</b> &middot; oldest parked at <span data-testid='oldest-parked-{name}'>"
            f"{e(en.get('oldest_parked_at'))}</span>{err}</p>"
            f"<p class='meta'>Dimension versions used by the last run: "
            f"<span data-testid='dim-versions-{name}'>{dims_text}</span></p>")
