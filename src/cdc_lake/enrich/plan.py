"""The batch plan: what a micro-batch read, fixed before its first write, so a replay is identical.

A micro-batch writes several tables one after the other. If the driver dies between two writes,
Spark replays the batch; the tables already written are skipped (their Delta transaction id says
so) and the others must get exactly what the first attempt would have written. So everything
a batch computes from is pinned in ``<checkpoint>/enrich_batches/<batch_id>.json`` before the
first write: the batch start time (parking / wait decisions), the Delta version of each
dimension, the versions of the job's own enriched and pending tables it started from
(the old aggregate contributions come from that enriched version), whether it re-joins the
enriched facts with unknown members (``restate``), and the source offsets the
batch covers (``source``: ``{"start": ..., "end": ...}`` as Spark logged them in
``offsets/<batch_id - 1>`` and ``offsets/<batch_id>``). A replay reads exactly those versions
(Delta time travel). A replay whose offsets differ from the pinned ones (Spark re-planned the
batch id over another range, e.g. after a damaged offsets log file was removed) is refused by
the writer (exit 3; its writes would be skipped by their transaction ids: changes lost).

Example::

    plan = load_or_create_plan(checkpoint, batch_id, lambda: BatchPlan.now(versions))
    df = read_at(engine, "/lake/gold/order_lines", plan.versions["enriched"])
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from cdc_lake.engines import Engine

PLANS_DIR = "enrich_batches"
KEEP_PLANS = 50


@dataclass(frozen=True)
class BatchPlan:
    batch_id: int
    started_at: datetime  # UTC
    versions: dict[str, int | None]  # "dim:<name>", "enriched", "pending" -> version or None
    # {"start": offset | None, "end": offset} of the fact source; None: not known (a plan
    # written before this was recorded, the --reprocess snapshot, offsets not readable)
    source: dict[str, Any] | None = None
    # the same keys -> fingerprint of the table's commit file at that version
    # (cdc_lake.sources.delta_log.fingerprint): a table re-created since and grown back to the
    # version number is another table (a number alone let such a replay through; tester J).
    # Empty: a plan written before this was recorded, or the commit file not readable.
    commits: dict[str, str] = field(default_factory=dict)
    # False: the enriched facts with unknown members are not re-joined in this batch (the last
    # batch joined them to these same dimension versions: enrich.rejoin.restate_needed). Pinned
    # so that a replay decides as its first attempt did. True in a plan written before this.
    restate: bool = True

    def to_json(self) -> str:
        d: dict[str, Any] = {"batch_id": self.batch_id, "started_at": self.started_at.isoformat(),
                             "versions": self.versions}
        if self.source is not None:
            d["source"] = self.source
        if self.commits:
            d["commits"] = self.commits
        if not self.restate:
            d["restate"] = False
        return json.dumps(d, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> BatchPlan:
        d = json.loads(text)
        src = d.get("source")
        commits = d.get("commits") if isinstance(d.get("commits"), dict) else {}
        return BatchPlan(int(d["batch_id"]), datetime.fromisoformat(d["started_at"]),
                         {str(k): (None if v is None else int(v)) for k, v in d["versions"].items()},
                         src if isinstance(src, dict) else None,
                         {str(k): str(v) for k, v in commits.items()},
                         d.get("restate", True) is not False)


def plan_file(checkpoint: Path, batch_id: int) -> Path:
    return checkpoint / PLANS_DIR / f"{batch_id}.json"


def source_mismatch(plan: BatchPlan, source: dict[str, Any] | None) -> bool:
    """Whether a replayed batch covers other source offsets than the ones its plan pinned."""
    if plan.source is None or source is None:
        return False
    return json.dumps(plan.source, sort_keys=True) != json.dumps(source, sort_keys=True)


def load_or_create_plan(checkpoint: Path, batch_id: int,
                        make: Callable[[], BatchPlan]) -> tuple[BatchPlan, bool]:
    """The batch's plan (``replayed=True`` when an earlier attempt already pinned it)."""
    folder = checkpoint / PLANS_DIR
    f = folder / f"{batch_id}.json"
    if f.is_file():
        return BatchPlan.from_json(f.read_text(encoding="utf-8")), True
    plan = make()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{batch_id}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.write_text(plan.to_json(), encoding="utf-8")
    os.replace(tmp, f)
    _prune(folder, batch_id)
    return plan, False


def _prune(folder: Path, batch_id: int) -> None:
    for p in folder.glob("*.json"):
        try:
            if int(p.stem) < batch_id - KEEP_PLANS:
                p.unlink()
        except (ValueError, OSError):
            pass


def commit_fingerprint(path: str, version: int | None) -> str | None:
    """:func:`cdc_lake.sources.delta_log.fingerprint` of ``path``'s commit ``version``; None
    when there is none or it cannot be read (the identity is then not recorded / not checked)."""
    if version is None:
        return None
    from cdc_lake.sources.delta_log import DeltaLog

    try:
        return DeltaLog(path).commit_fingerprint(version)
    except Exception:  # noqa: BLE001 - an identity we cannot read is one we do not check
        return None


def read_at(engine: Engine, path: str, version: int | None, recovery: str = "spark-submit "
            "spark_jobs/enrich.py --pipeline <the pipeline's YAML> --reprocess",
            commit: str | None = None) -> DataFrame | None:
    """The table's snapshot at ``version`` (None: the table did not exist then).

    Raises :class:`~cdc_lake.checkpoint_log.PipelineStateError` (exit 3) when the table is now
    below ``version`` (re-created or rolled back since the batch was planned: a replay cannot
    read what the batch planned; delta-rs failed with "LogSegment end version ..." on every
    retry, exit 1: tester), or when ``commit`` (the fingerprint of the commit at ``version``
    the plan recorded) differs from the commit now at ``version``: the table was re-created and
    has grown back to that version number (tester J: a dimension rebuilt by a backfill)."""
    if version is None:
        return None
    from cdc_lake.checkpoint_log import PipelineStateError

    def refused(now: str) -> PipelineStateError:
        return PipelineStateError(
            f"a batch of this pipeline was planned on {path} at Delta version {version} and is being "
            f"replayed, but that table {now} (re-created or rolled back since): the replay cannot "
            "read what the batch planned. Recovery: put the table back as it was if you can; else "
            f"rebuild the pipeline's outputs with `{recovery}`")
    try:
        df = engine.read(path, version=version)
    except Exception as e:  # noqa: BLE001 - looked at only when the read fails (no cost otherwise)
        try:
            now = engine.version(path) if engine.exists(path) else None
        except Exception:  # noqa: BLE001 - the table itself is damaged: the original error says it
            raise e from None
        if now is not None and now >= version:
            raise
        raise refused("is gone" if now is None else f"is at version {now}") from e
    if commit is not None:
        found = commit_fingerprint(path, version)
        if found is not None and found != commit:
            raise refused(f"holds another commit at version {version} than when the batch was "
                          f"planned (commit fingerprint {found}, planned {commit})")
    return df


def now_utc() -> datetime:
    return datetime.now(timezone.utc)
