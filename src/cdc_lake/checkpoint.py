"""The pipeline's checkpoint folder: Spark's offset/commit logs plus two files of ours.

* ``cdc_instance.json`` — a random id minted when the checkpoint is created. Delta transaction
  ids are ``(app_id, batch_id)`` with ``app_id`` derived from it, so rebuilding the checkpoint
  (batch ids restart at 0) never makes new batches look "already written".
* ``cdc.lock`` — an exclusive ``flock`` held for the whole run: two runs of one pipeline (two
  Airflow runs, a backfill, a CLI run) never process the checkpoint at once. The loser fails
  fast with :class:`PipelineLocked`; the OS drops the lock if the holder dies.
* ``cdc_tables.json`` — the Delta tables (and tombstone tables) this checkpoint has written
  (:func:`written_tables` / :func:`record_written_tables`): a table deleted behind the
  checkpoint's back is noticed instead of silently re-created with only new changes.

Spark's own files (offsets, commits, sources, metadata) are read by :mod:`cdc_lake.checkpoint_log`.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO


class PipelineLocked(RuntimeError):
    """Another run holds the pipeline's checkpoint lock."""


@dataclass
class CheckpointLock:
    path: Path
    _fh: IO[str] | None = None

    def acquire(self, run_id: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown holder"
            fh.close()
            raise PipelineLocked(
                f"checkpoint {self.path.parent} is locked by another run ({holder}); "
                "this run stops without touching it. Wait for that run to finish.") from None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id,
                             "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}))
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            self._fh.seek(0)
            self._fh.truncate()
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

    def __enter__(self) -> CheckpointLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_for(checkpoint: Path) -> CheckpointLock:
    return CheckpointLock(checkpoint / "cdc.lock")


def instance_id(checkpoint: Path) -> str:
    """The checkpoint's identity; minted on first use, stable across runs."""
    f = checkpoint / "cdc_instance.json"
    if f.is_file():
        return str(json.loads(f.read_text(encoding="utf-8"))["instance_id"])
    checkpoint.mkdir(parents=True, exist_ok=True)
    new = uuid.uuid4().hex[:16]
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps({"instance_id": new, "created_at": time.time()}), encoding="utf-8")
    os.replace(tmp, f)
    return new


TABLES_FILE = "cdc_tables.json"


def written_tables(checkpoint: Path) -> dict[str, dict[str, str]]:
    """``{"tables": {name: path}, "tombstones": {name: path}}`` this checkpoint has written."""
    f = checkpoint / TABLES_FILE
    if not f.is_file():
        return {"tables": {}, "tombstones": {}}
    data = json.loads(f.read_text(encoding="utf-8"))
    return {"tables": dict(data.get("tables", {})), "tombstones": dict(data.get("tombstones", {}))}


def record_written_tables(checkpoint: Path, tables: dict[str, str], tombstones: dict[str, str]) -> None:
    """Add tables to :data:`TABLES_FILE` (atomically; existing entries are kept)."""
    old = written_tables(checkpoint)
    new = {"tables": {**old["tables"], **tables}, "tombstones": {**old["tombstones"], **tombstones}}
    if new == old:
        return
    checkpoint.mkdir(parents=True, exist_ok=True)
    f = checkpoint / TABLES_FILE
    tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(new, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, f)


def last_committed_batch(checkpoint: Path) -> int | None:
    """Moved to :mod:`cdc_lake.checkpoint_log` (kept here for existing imports)."""
    from cdc_lake.checkpoint_log import last_committed_batch as last

    return last(checkpoint)
