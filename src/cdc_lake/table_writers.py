"""Who writes a Delta table, read from its log: the owner mark every cdc-lake write carries.

Every write of a cdc-lake job records a Delta transaction (``txn`` action) whose app id names
the job kind and pipeline: ``cdc-<pipeline>-<instance>`` (cdc.job), ``enrich-<pipeline>-<instance>
-<table>`` (enrich.writer), ``dimension-<pipeline>`` (dimensions). Pipeline names match NAME_RE
(no ``-``), so the second field is the pipeline. Read from the files (the Delta protocol), the
same for delta-rs and delta-spark tables. Used for the owner checks of CDC tables
(:mod:`cdc_lake.cdc.owners`) and enrichment outputs, and for naming how to rebuild an upstream
table that lost a data file.

Example::

    table_app_ids(Path("/lake/shop/orders"))   # {'cdc-shop-3f2a...'}
    describe_writer("cdc-shop-3f2a")            # "pipeline 'shop' (kind: cdc)"
    holds_rows(Path("/lake/shop/orders"))       # True
    foreign_writers(Path("/lake/shop/orders"), "cdc", "shop")  # ([], True): only its own
    rebuild_hint(Path("/lake/shop/orders"))     # "rebuild it from its landing history with ..."
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from cdc_lake.paths import mv_aside

APP_ID_RE = re.compile(r"^(cdc|enrich|dimension)-([A-Za-z_][A-Za-z0-9_]*)(?:-|$)")
_COMMIT_RE = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_RE = re.compile(r"^(\d{20})\.checkpoint(\..+)?\.(parquet|json)$")




def _txn_ids_in_json(f: Path, found: set[str]) -> None:
    try:
        text = f.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        if '"txn"' not in line:
            continue
        try:
            app = json.loads(line).get("txn", {}).get("appId")
        except (ValueError, AttributeError):
            continue  # a damaged line: the table's own checks report the log
        if isinstance(app, str):
            found.add(app)


def table_app_ids(table: Path) -> set[str]:
    """Every Delta transaction app id recorded in the table's log: the newest checkpoint's
    ``txn`` actions plus those of the JSON commits after it (all commits when there is no
    readable checkpoint). Read from the files (the Delta protocol), for tables of either engine."""
    log = table / "_delta_log"
    try:
        names = os.listdir(log)
    except OSError:
        return set()
    found: set[str] = set()
    checkpoints: dict[int, list[str]] = {}
    for n in names:
        m = _CHECKPOINT_RE.match(n)
        if m:
            checkpoints.setdefault(int(m.group(1)), []).append(n)
    after = -1
    if checkpoints:
        newest = max(checkpoints)
        try:
            import pyarrow.parquet as pq

            for n in checkpoints[newest]:
                if n.endswith(".json"):
                    _txn_ids_in_json(log / n, found)
                    continue
                pf = pq.ParquetFile(log / n)
                if "txn" not in pf.schema_arrow.names:
                    continue
                for row in pf.read(columns=["txn"]).column("txn").to_pylist():
                    if row and isinstance(row.get("appId"), str):
                        found.add(row["appId"])
            after = newest
        except Exception:  # noqa: BLE001 - an unreadable checkpoint: read every commit instead
            found.clear()
            after = -1
    for n in names:
        m = _COMMIT_RE.match(n)
        if m and int(m.group(1)) > after:
            _txn_ids_in_json(log / n, found)
    return found


def foreign_writers(table: Path, kind: str, pipeline: str) -> tuple[list[str], bool]:
    """``(app ids of other writers, whether the pipeline's own mark is there too)`` in the log
    of ``table``, for the owner checks: ``kind``/``pipeline`` name the writer asking."""
    ids = table_app_ids(table)
    foreign = sorted(a for a in ids if (m := APP_ID_RE.match(a)) is None
                     or (m.group(1), m.group(2)) != (kind, pipeline))
    return foreign, len(foreign) < len(ids)


def describe_writers(app_ids: list[str]) -> str:
    """The writers behind ``app_ids`` for a message: ``pipeline 'shop' (kind: cdc) (Delta app
    ids 'cdc-shop-3f2a')`` (at most four ids shown)."""
    owners = " and ".join(sorted({describe_writer(a) for a in app_ids}))
    return f"{owners} (Delta app ids {', '.join(repr(a) for a in app_ids[:4])})"


def holds_rows(table: Path) -> bool:
    """Whether the Delta table at ``table`` references any data file (unreadable: assume so)."""
    from deltalake import DeltaTable

    try:
        return bool(DeltaTable(str(table)).file_uris())
    except Exception:  # noqa: BLE001 - unreadable: assume it holds data
        return True


def describe_writer(app_id: str) -> str:
    m = APP_ID_RE.match(app_id)
    return (f"pipeline {m.group(2)!r} (kind: {m.group(1)})" if m
            else f"a writer with Delta app id {app_id!r}")


def rebuild_hint(table: Path) -> str:
    """How to rebuild an upstream ``table`` from its own source (a clause to follow "else"),
    naming the writers its log records: a cdc-lake CDC table by its pipeline and the full refresh
    command, a dimension by its refresh, another enrichment by ``--reprocess``."""
    kinds: dict[str, set[str]] = {}
    unknown: list[str] = []
    for a in sorted(table_app_ids(table)):
        m = APP_ID_RE.match(a)
        if m:
            kinds.setdefault(m.group(1), set()).add(m.group(2))
        else:
            unknown.append(a)
    hints: list[str] = []
    for name in sorted(kinds.get("cdc", ())):
        hints.append(
            f"it is written by the CDC pipeline {name!r}: rebuild it from that pipeline's "
            f"landing history with `{mv_aside(table)} && spark-submit spark_jobs/cdc_ingest.py "
            f"--pipeline <{name}'s YAML> --full-refresh --tables {table.name}` (the table's name "
            f"in that YAML, if it is not {table.name!r})")
    for name in sorted(kinds.get("dimension", ())):
        hints.append(f"it is written by the dimension pipeline {name!r}: move it aside and its "
                     "state folder too, then backfill that pipeline's dimension refresh from "
                     "its first snapshot date")
    for name in sorted(kinds.get("enrich", ())):
        hints.append(f"it is an output of the enrichment pipeline {name!r}: run that pipeline "
                     "with --reprocess")
    if unknown:
        hints.append("rebuild it with its writer (Delta app id "
                     + ", ".join(repr(a) for a in unknown) + ")")
    return "; or ".join(hints) if hints else "rebuild that table with its writer"
