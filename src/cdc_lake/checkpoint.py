"""The pipeline's checkpoint folder: Spark's offset/commit logs plus two files of ours.

* ``cdc_instance.json`` — a random id minted when the checkpoint is created. Delta transaction
  ids are ``(app_id, batch_id)`` with ``app_id`` derived from it, so rebuilding the checkpoint
  (batch ids restart at 0) never makes new batches look "already written".
* ``cdc.lock`` — an exclusive ``flock`` held for the whole run: two runs of one pipeline (two
  Airflow runs, a backfill, a CLI run) never process the checkpoint at once. The loser fails
  fast with :class:`PipelineLocked`; the OS drops the lock if the holder dies. The run also
  holds a ``flock`` on the checkpoint folder itself, so deleting ``cdc.lock`` by hand while a
  run holds it does not let a second run in (it used to: the second run locked a new file).
* ``cdc_tables.json`` — the Delta tables (and tombstone tables) this checkpoint has written
  (:func:`written_tables` / :func:`record_written_tables`): a table deleted behind the
  checkpoint's back is noticed instead of silently re-created with only new changes.

An empty, truncated or otherwise unreadable file of ours raises :class:`StateFileDamaged` (a
:class:`~cdc_lake.checkpoint_log.PipelineStateError`: the CLI exits 3) naming the file, what it
holds and the recovery, rather than a bare ``JSONDecodeError`` (exit 1, retried for nothing).

* ``cdc_owner.json`` — the pipeline (name, kind, YAML file) the checkpoint belongs to
  (:func:`claim_checkpoint`): a second pipeline configured with the same checkpoint stops before
  it reads or writes anything, instead of mixing its offsets, table records and transaction
  ids with the owner's (tester: the owner's later runs found "nothing new", rows lost, exit 0).

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
from typing import IO, Any, Callable

from cdc_lake.checkpoint_log import PipelineStateError


class PipelineLocked(RuntimeError):
    """Another run holds the pipeline's checkpoint lock."""


@dataclass
class CheckpointLock:
    """Exclusive lock of one checkpoint folder: ``flock`` on the folder and on ``path`` (which
    also records the holder). Example::

        lock = lock_for(Path("/lake/_checkpoints/shop"))
        lock.acquire("manual__2026-11-29")   # PipelineLocked naming the holder if taken
        try:
            ...
        finally:
            lock.release()
    """

    path: Path
    _fh: IO[str] | None = None
    _dir_fd: int | None = None

    def _locked(self, holder: str) -> PipelineLocked:
        return PipelineLocked(
            f"checkpoint {self.path.parent} is locked by another run ({holder}); "
            "this run stops without touching it. Wait for that run to finish. The lock is "
            f"held by a live process (the OS drops it when the holder exits or dies): do not "
            f"delete {self.path.name}, that does not stop the holder")

    def _lock_folder(self) -> int | None:
        """``flock`` the checkpoint folder (held with the file lock): the folder cannot be
        replaced by deleting one file. None where the filesystem cannot lock a folder."""
        try:
            fd = os.open(self.path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise
        except OSError:  # no flock on folders here (some network filesystems): the file lock
            os.close(fd)
            return None
        return fd

    def acquire(self, run_id: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown holder"
            fh.close()
            raise self._locked(holder) from None
        try:
            dir_fd = self._lock_folder()
        except BlockingIOError:
            # the folder is locked but this file was not: the holder's cdc.lock was deleted
            # (or replaced) while it ran; this file is new and names nobody
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            fh.close()
            raise self._locked(f"holder unknown: its {self.path.name} was deleted or replaced "
                               "while it ran") from None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id,
                             # to the microsecond: a run that meets the lock compares landed
                             # files' times with it (airflow.submit.landed_after)
                             "since": datetime.now(timezone.utc).isoformat(timespec="microseconds")}))
        fh.flush()
        self._fh, self._dir_fd = fh, dir_fd

    def release(self) -> None:
        if self._fh is not None:
            self._fh.seek(0)
            self._fh.truncate()
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
        if self._dir_fd is not None:
            fcntl.flock(self._dir_fd, fcntl.LOCK_UN)
            os.close(self._dir_fd)
            self._dir_fd = None

    def __enter__(self) -> CheckpointLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_for(checkpoint: Path) -> CheckpointLock:
    return CheckpointLock(checkpoint / "cdc.lock")


class StateFileDamaged(PipelineStateError):
    """A file of ours in the checkpoint folder cannot be read: ``file``, ``problem``; the message
    also says what the file holds and how to recover."""

    def __init__(self, file: Path, problem: str, holds: str, recovery: str) -> None:
        self.file, self.problem = file, problem
        super().__init__(f"checkpoint file {file} is {problem}; it holds {holds}, so this run stops "
                         f"instead of guessing. Recovery: {recovery}")


def read_state_file(f: Path, holds: str, recovery: str,
                    valid: Any = lambda data: True) -> dict[str, Any] | None:
    """The JSON object stored in ``f`` (None when there is no such file); :class:`StateFileDamaged`
    when it is empty, truncated, not JSON or ``valid(data)`` is false. Other I/O errors propagate
    (the storage, not the file: may be transient)."""
    try:
        text = f.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise StateFileDamaged(f, "not UTF-8 text", holds, recovery) from None
    if not text.strip():
        raise StateFileDamaged(f, "empty", holds, recovery)
    try:
        data = json.loads(text)
    except ValueError:
        raise StateFileDamaged(f, f"truncated or corrupt (not JSON: {text[:60]!r})", holds,
                               recovery) from None
    if not isinstance(data, dict) or not valid(data):
        raise StateFileDamaged(f, f"not in its format ({text[:60]!r})", holds, recovery)
    return data


INSTANCE_FILE = "cdc_instance.json"


def _aside(f: Path) -> str:
    from cdc_lake.paths import mv_aside

    return mv_aside(f)


INSTANCE_HOLDS = ("this checkpoint's id, which names its writes in the Delta transaction ids "
                  "(txn appId) of every table it writes")


def read_instance_id(checkpoint: Path, recovery: str | None = None) -> str | None:
    """The checkpoint's identity, None before it is minted; :class:`StateFileDamaged` (with
    ``recovery``, by default: write the id back) if the file cannot be read."""
    f = checkpoint / INSTANCE_FILE
    data = read_state_file(
        f, INSTANCE_HOLDS,
        recovery or ("restore it from a copy, or write the id back "
                     "(`{\"instance_id\": \"<id>\"}`, <id> as it ends the txn appId in the "
                     "_delta_log of the tables this checkpoint writes)"),
        lambda d: isinstance(d.get("instance_id"), str) and d["instance_id"] != "")
    return None if data is None else str(data["instance_id"])


def instance_id(checkpoint: Path) -> str:
    """The checkpoint's identity; minted on first use, stable across runs."""
    found = read_instance_id(checkpoint)
    if found is not None:
        return found
    f = checkpoint / INSTANCE_FILE
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
    data = read_state_file(
        f, "the Delta tables (and tombstone tables) this checkpoint has written, by which a run "
           "notices a table deleted behind its back",
        f"move it aside (`{_aside(f)}`) and run the pipeline again: that run records the tables "
        "that exist then. Before, make sure none of the pipeline's tables was deleted (that run "
        "would re-create it with only the changes that arrive from then on; rebuild such a table "
        "with --full-refresh --tables <table>)",
        lambda d: all(isinstance(d.get(k, {}), dict) for k in ("tables", "tombstones")))
    if data is None:
        return {"tables": {}, "tombstones": {}}
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


OWNER_FILE = "cdc_owner.json"


class CheckpointOfAnotherPipeline(PipelineStateError):
    """The checkpoint belongs to another pipeline (or this one under an earlier name)."""


def claim_checkpoint(checkpoint: Path, pipeline: str, kind: str, config_file: Path | str,
                     recorded_elsewhere: Callable[[], list[str]] | None = None) -> None:
    """Stop (:class:`CheckpointOfAnotherPipeline`, exit 3) unless ``checkpoint`` is this
    pipeline's; record the owner on first use. Call under the pipeline lock, before anything
    reads the checkpoint.

    A checkpoint from before owners were recorded is adopted, unless ``recorded_elsewhere()``
    (tables of this pipeline's names that the checkpoint recorded at other paths; asked only
    then) says it was another pipeline's. Example::

        claim_checkpoint(cfg.checkpoint_path, cfg.name, "cdc", cfg.file)
    """
    f = checkpoint / OWNER_FILE
    fix = (f"give pipeline {pipeline!r} its own checkpoint folder (`storage.checkpoint` in "
           f"{config_file}; without it, the default under its storage root) and run again")
    data = read_state_file(
        f, "the pipeline this checkpoint belongs to",
        f"write it back: `echo '{json.dumps({'pipeline': pipeline, 'kind': kind})}' > {f}` if the "
        f"checkpoint is pipeline {pipeline!r}'s; else {fix}",
        lambda d: isinstance(d.get("pipeline"), str) and isinstance(d.get("kind"), str))
    if data is not None:
        if (data["pipeline"], data["kind"]) == (pipeline, kind):
            return
        raise CheckpointOfAnotherPipeline(
            f"checkpoint {checkpoint} belongs to the {data['kind']} pipeline {data['pipeline']!r}"
            f"{' (' + str(data['config']) + ')' if data.get('config') else ''}, but the {kind} "
            f"pipeline {pipeline!r} ({config_file}) is configured to use it. Pipelines never share "
            "a checkpoint: its offsets say what the owner has read, and the owner's next runs "
            "would skip what this one read. This run stopped before reading or writing anything. "
            f"Recovery: {fix}. If {pipeline!r} is {data['pipeline']!r} renamed, name it back: "
            "the checkpoint's Delta transaction ids carry the old name")
    elsewhere = recorded_elsewhere() if recorded_elsewhere is not None else []
    if elsewhere:
        raise CheckpointOfAnotherPipeline(
            f"checkpoint {checkpoint} has written tables at other paths than the {kind} pipeline "
            f"{pipeline!r} ({config_file}) writes: {'; '.join(elsewhere[:5])}. It is "
            "probably another pipeline's checkpoint; this run stopped before reading or writing "
            f"anything. Recovery: {fix}. If you moved this pipeline's storage root, move its "
            "tables too, or move the checkpoint aside and rebuild the tables with a full refresh")
    checkpoint.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps({"pipeline": pipeline, "kind": kind, "config": str(config_file),
                               "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}),
                   encoding="utf-8")
    os.replace(tmp, f)
