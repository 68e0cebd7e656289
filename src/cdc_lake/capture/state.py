"""Capture settings, binlog positions, the resume state file and the capture's errors."""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import re
import socket
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

STATE_VERSION = 1
EXIT_OK, EXIT_FAIL, EXIT_CONFIG, EXIT_LOCKED = 0, 1, 2, 75
EXIT_NEEDS_OPERATOR = 3  # a value every retry would stop at again


class CaptureError(RuntimeError):
    """Capture cannot continue; the message says why and what to do."""

    exit_code = EXIT_FAIL


class CaptureConfigError(CaptureError):
    exit_code = EXIT_CONFIG


class CaptureLocked(CaptureError):
    exit_code = EXIT_LOCKED


class CaptureNeedsOperator(CaptureError):
    """A condition every retry would stop at again (exit 3, not retried): the message names the
    binlog file:position (and table) and says what an operator has to do."""

    exit_code = EXIT_NEEDS_OPERATOR


class CaptureBadValue(CaptureNeedsOperator):
    """A binlog value the capture cannot land (not valid in its column's character set): every
    retry stops at the same event, so an operator has to act (exit 3, not retried)."""


@dataclass(frozen=True)
class CaptureSettings:
    """Everything one capture run needs (the CLI builds this from its flags)."""

    host: str
    port: int
    user: str
    password: str
    out_dir: Path
    state_path: Path | None = None          # default: <out_dir>/.maxwell-capture-state.json
    until_now: bool = True                  # stop when caught up (False: follow forever)
    server_id: int | None = None            # replica id announced to the server
    databases: tuple[str, ...] = ()         # capture only these schemas (default: all non-system)
    tables: tuple[str, ...] = ()            # capture only these tables ("t" or "db.t")
    start: str = "earliest"                 # no state yet: "earliest", "current" or "FILE:POS"
    max_file_rows: int = 100_000            # rotate the landing file after this many lines...
    max_file_bytes: int = 64 * 1024 * 1024  # ...or bytes (checked at transaction ends)
    flush_interval_s: float = 5.0           # follow mode: land an open file after this long
    prefix: str = "maxwell"
    heartbeat_s: float = 1.0                # follow mode: server heartbeat period
    spill_rows: int = 50_000                # buffer bigger transactions on disk

    @property
    def state_file(self) -> Path:
        return self.state_path or (self.out_dir / f".{self.prefix}-capture-state.json")

    @property
    def replica_server_id(self) -> int:
        if self.server_id:
            return self.server_id
        # stable per landing folder, unlikely to clash with real replicas' small ids
        return 1_000_000 + zlib.crc32(str(self.out_dir.resolve()).encode()) % 1_000_000_000


@dataclass(frozen=True, order=True)
class BinlogPos:
    file: str
    pos: int

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}"

    @property
    def index(self) -> int:
        m = re.search(r"\.(\d+)$", self.file)
        return int(m.group(1)) if m else 0

    @classmethod
    def parse(cls, text: str) -> BinlogPos:
        m = re.match(r"^(.+):(\d+)$", text.strip())
        if not m:
            raise CaptureConfigError(f"binlog position {text!r} must look like FILE:POS "
                                     "(e.g. mariadb-bin.000001:4)")
        return cls(m.group(1), int(m.group(2)))


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def default_file_mode() -> int:
    """0644 minus the process umask: the mode ``open()`` would give a new file (``mkstemp``
    creates 0600, which other readers of the landing folder, e.g. Spark, cannot read)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o644 & ~mask


def remove_files(paths: Iterable[Path]) -> list[Path]:
    """Delete each of ``paths`` (leftovers of a killed run); the ones removed."""
    gone = []
    for f in paths:
        try:
            f.unlink()
            gone.append(f)
        except OSError:
            pass
    return gone


def state_tmp_pattern(path: Path) -> re.Pattern[str]:
    """Names of the state file's own temporary files (``_atomic_write_text``)."""
    return re.compile(rf"^\.{re.escape(path.name)}\.[A-Za-z0-9_]{{8}}\.tmp$")


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, default_file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


class StateStore:
    """The resume position, in a small JSON file written atomically, guarded by a lock file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None

    def lock(self, settings: CaptureSettings) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = ""
            try:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            except OSError:
                pass
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise CaptureLocked(f"{lock_path}: another capture is running on this state "
                                    f"({holder or 'holder unknown'}); not starting a second one")
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "started_at": _utcnow_iso(),
                                  "server": f"{settings.host}:{settings.port}"}).encode(), 0)
        self._lock_fd = fd

    def remove_leftovers(self) -> list[Path]:
        """Remove temporary files of a state save that was killed (SIGKILL) before its rename;
        only this state file's own pattern, called under the lock."""
        pattern = state_tmp_pattern(self.path)
        try:
            candidates = list(self.path.parent.iterdir())
        except OSError:
            return []
        return remove_files(f for f in candidates if pattern.match(f.name))

    def unlock(self) -> None:
        if self._lock_fd is not None:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            finally:
                os.close(self._lock_fd)
                self._lock_fd = None

    def load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
            BinlogPos(str(state["log_file"]), int(state["log_pos"]))
        except (ValueError, KeyError, TypeError) as e:
            raise CaptureConfigError(f"{self.path}: unreadable capture state ({e}); fix or "
                                     "remove it (removing re-captures from --start)") from None
        return state

    def save(self, pos: BinlogPos, extra: dict[str, Any]) -> None:
        state = {"version": STATE_VERSION, "log_file": pos.file, "log_pos": pos.pos,
                 "updated_at": _utcnow_iso(), **extra}
        _atomic_write_text(self.path, json.dumps(state, indent=1, sort_keys=True) + "\n")


def _utcnow_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")

