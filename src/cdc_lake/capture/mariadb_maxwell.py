"""Capture a MariaDB/MySQL row binlog into Maxwell-format JSON lines files.

A small, single-process stand-in for Maxwell's Daemon: it reads the binlog with
``mysql-replication`` (``pymysqlreplication``) and lands one JSON document per row change::

    {"database":"shop","table":"orders","type":"update","ts":1795263365,"xid":16,"xoffset":0,
     "position":"mariadb-bin.000001:2005","primary_key":[3],"primary_key_columns":["id"],
     "data":{"id":3,"status":"paid","amount":19.90},"old":{"status":"new"}}

and one per DDL statement (``table-create``, ``table-alter``, ``table-drop``, ``table-truncate``,
``database-create``/``-alter``/``-drop``) with the statement in ``sql``.

Guarantees (see ``docs/capture.md``):

* Resume position is saved only at transaction ends (Xid, ``COMMIT`` query, standalone DDL) and
  only *after* the landing file holding everything up to it was renamed into place; resuming
  uses ``resume_stream=True`` with ``is_mariadb=False`` (field notes). A crash can therefore
  re-land a transaction (identical lines, same ``position``/``xoffset``) but never loses one.
* Files are written as hidden ``.*.tmp`` files and renamed when complete; a file always ends at
  a transaction boundary; names sort lexically in capture order:
  ``<prefix>-<start binlog index>-<start pos>-<end binlog index>-<end pos>.json``.

CLI::

    python -m cdc_lake.capture.mariadb_maxwell --host 127.0.0.1 --port 3306 --user cdc \\
        --password-env CDC_CAPTURE_PASSWORD --out data/landing/shop [--state FILE] [--until-now]

Exit codes: 0 success, 2 bad arguments or unsuitable server settings, 75 another capture holds
the state lock, 1 anything else. On success one ``CAPTURE_SUMMARY {json}`` line goes to stdout.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import decimal
import errno
import fcntl
import json
import logging
import os
import re
import signal
import socket
import struct
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

log = logging.getLogger("cdc_lake.capture")

SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})
STATE_VERSION = 1
EXIT_OK, EXIT_FAIL, EXIT_CONFIG, EXIT_LOCKED = 0, 1, 2, 75

# MariaDB GTID event flags (sql/log_event.h)
_FL_STANDALONE = 1
_FL_PREPARED_XA = 64
_FL_COMPLETED_XA = 128


class CaptureError(RuntimeError):
    """Capture cannot continue; the message says why and what to do."""

    exit_code = EXIT_FAIL


class CaptureConfigError(CaptureError):
    exit_code = EXIT_CONFIG


class CaptureLocked(CaptureError):
    exit_code = EXIT_LOCKED


# --------------------------------------------------------------------------------------------
# Settings, positions, state
# --------------------------------------------------------------------------------------------

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


def _fsync_dir(path: Path) -> None:
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


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
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
    _fsync_dir(path.parent)


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


# --------------------------------------------------------------------------------------------
# JSON encoding of MySQL values (Maxwell conventions)
# --------------------------------------------------------------------------------------------

class _Raw(str):
    """Pre-encoded JSON number text (exact DECIMAL)."""


def _j(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _enc(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, _Raw):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_enc(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{_j(str(k))}:{_enc(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v), ensure_ascii=False)


def _fmt_datetime(v: dt.datetime, fsp: int) -> str:
    s = f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:{v.second:02d}"
    if fsp > 0:
        s += "." + f"{v.microsecond:06d}"[:fsp]
    return s


def _fmt_time(v: dt.timedelta, fsp: int) -> str:
    us = v.days * 86_400_000_000 + v.seconds * 1_000_000 + v.microseconds
    sign = "-" if us < 0 else ""
    us = abs(us)
    secs, frac = divmod(us, 1_000_000)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    out = f"{sign}{h:02d}:{m:02d}:{s:02d}"
    if fsp > 0:
        out += "." + f"{frac:06d}"[:fsp]
    return out


def _float32_text(v: float) -> float:
    for digits in range(6, 10):
        candidate = float(f"{v:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", candidate))[0] == v:
            return candidate
    return v


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, dict):
        return {_jsonable(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, decimal.Decimal):
        return float(v)
    return v


def _converter(col: Any) -> Callable[[Any], Any]:
    """How one binlog column value becomes a JSON value (Maxwell conventions)."""
    from pymysqlreplication.constants import FIELD_TYPE as T

    t = col.type
    fsp = int(getattr(col, "fsp", 0) or 0)
    if t in (T.NEWDECIMAL, T.DECIMAL):
        return lambda v: _Raw(format(v, "f"))
    if t == T.FLOAT:
        return _float32_text
    if t in (T.DATETIME, T.DATETIME2, T.TIMESTAMP, T.TIMESTAMP2):
        # TIMESTAMP arrives as naive UTC, DATETIME naive as stored (field notes)
        return lambda v: _fmt_datetime(v, fsp)
    if t in (T.DATE, T.NEWDATE):
        return lambda v: v.isoformat()
    if t in (T.TIME, T.TIME2):
        return lambda v: _fmt_time(v, fsp)
    if t == T.BIT:
        return lambda v: int(v, 2) if isinstance(v, str) else v
    if t == T.SET:
        order = {name: i for i, name in enumerate(col.set_values or ())}
        return lambda v: ",".join(sorted(v, key=lambda x: order.get(x, len(order))))
    if t == T.JSON:  # MySQL binary JSON; MariaDB JSON is LONGTEXT and arrives as str
        return lambda v: v if isinstance(v, str) else json.dumps(_jsonable(v), ensure_ascii=False)
    pad = int(getattr(col, "max_length", 0) or 0) if (
        t == T.STRING and getattr(col, "character_set_name", None) == "binary") else 0

    def generic(v: Any) -> Any:
        if isinstance(v, bytes):
            if pad and len(v) < pad:  # BINARY(n) loses its trailing zero bytes in the binlog
                v = v + b"\x00" * (pad - len(v))
            return base64.b64encode(v).decode("ascii")
        if isinstance(v, decimal.Decimal):
            return _Raw(format(v, "f"))
        if isinstance(v, (dt.datetime,)):
            return _fmt_datetime(v, fsp)
        if isinstance(v, dt.date):
            return v.isoformat()
        if isinstance(v, dt.timedelta):
            return _fmt_time(v, fsp)
        if isinstance(v, (set, frozenset)):
            return ",".join(sorted(v))
        if isinstance(v, float):
            return v
        return v

    return generic


# --------------------------------------------------------------------------------------------
# DDL classification
# --------------------------------------------------------------------------------------------

_IDENT = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$\u0080-\uffff]+)"
_QNAME = rf"({_IDENT})(?:\s*\.\s*({_IDENT}))?"
_DDL_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"^CREATE\s+(?:OR\s+REPLACE\s+)?(TEMPORARY\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?"
                rf"{_QNAME}", re.I | re.S), "table-create"),
    (re.compile(rf"^ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+(?:IF\s+EXISTS\s+)?{_QNAME}",
                re.I | re.S), "table-alter"),
    (re.compile(rf"^TRUNCATE\s+(?:TABLE\s+)?{_QNAME}", re.I | re.S), "table-truncate"),
    (re.compile(rf"^CREATE\s+(?:OR\s+REPLACE\s+)?(?:ONLINE\s+|OFFLINE\s+)?"
                rf"(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?"
                rf"{_IDENT}\s+(?:USING\s+\w+\s+)?ON\s+{_QNAME}", re.I | re.S), "table-alter"),
    (re.compile(rf"^DROP\s+(?:ONLINE\s+|OFFLINE\s+)?INDEX\s+(?:IF\s+EXISTS\s+)?{_IDENT}\s+ON\s+"
                rf"{_QNAME}", re.I | re.S), "table-alter"),
]
_DROP_TABLE = re.compile(r"^DROP\s+(TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(.*)$", re.I | re.S)
_RENAME_TABLE = re.compile(r"^RENAME\s+TABLES?\s+(.*)$", re.I | re.S)
_DATABASE = re.compile(rf"^(CREATE|ALTER|DROP)\s+(?:OR\s+REPLACE\s+)?(?:DATABASE|SCHEMA)\b\s*"
                       rf"(?:IF\s+(?:NOT\s+)?EXISTS\s+)?({_IDENT})?", re.I | re.S)
_COMMENT = re.compile(r"/\*!\d*\s?(.*?)\*/|/\*.*?\*/|--[ \t][^\n]*|#[^\n]*", re.S)


def _strip_comments(sql: str) -> str:
    return _COMMENT.sub(lambda m: m.group(1) if m.group(1) is not None else " ", sql).strip()


def _unquote(ident: str | None) -> str | None:
    if ident is None:
        return None
    if ident.startswith("`") and ident.endswith("`"):
        return ident[1:-1].replace("``", "`")
    return ident


def _qualified(a: str, b: str | None, schema: str) -> tuple[str, str]:
    return (_unquote(a), _unquote(b)) if b is not None else (schema, _unquote(a))  # type: ignore[return-value]


def classify_ddl(sql: str, schema: str) -> list[dict[str, Any]]:
    """Maxwell-style DDL records for one statement: ``[{"type", "database", "table"}]``.

    Returns ``[]`` for statements that are not schema changes of interest (GRANT, CREATE USER,
    views, routines, temporary tables...).
    """
    text = _strip_comments(sql)
    for pattern, kind in _DDL_PATTERNS:
        m = pattern.match(text)
        if m:
            groups = m.groups()
            if kind == "table-create" and groups[0]:
                return []  # temporary tables are not replicated data
            a, b = groups[-2], groups[-1]
            db, table = _qualified(a, b, schema)
            return [{"type": kind, "database": db, "table": table}]
    m = _DROP_TABLE.match(text)
    if m:
        if m.group(1):
            return []
        names = re.findall(_QNAME, m.group(2).split(" RESTRICT")[0].split(" CASCADE")[0])
        out = []
        for a, b in names:
            if a.upper() in ("WAIT", "NOWAIT", "RESTRICT", "CASCADE") and not b:
                continue
            db, table = _qualified(a, b or None, schema)
            out.append({"type": "table-drop", "database": db, "table": table})
        return out
    m = _RENAME_TABLE.match(text)
    if m:
        out = []
        for pair in re.finditer(rf"{_QNAME}\s+TO\s+{_QNAME}", m.group(1), re.I):
            a, b, c, d = pair.groups()
            db, table = _qualified(a, b, schema)
            ndb, ntable = _qualified(c, d, schema)
            out.append({"type": "table-alter", "database": db, "table": table,
                        "new_database": ndb, "new_table": ntable})
        return out
    m = _DATABASE.match(text)
    if m:
        verb = m.group(1).lower()
        db = _unquote(m.group(2)) if m.group(2) else schema
        return [{"type": f"database-{verb}", "database": db, "table": None}]
    return []


# --------------------------------------------------------------------------------------------
# Landing files and transaction buffer
# --------------------------------------------------------------------------------------------

class LandingWriter:
    """One open landing file at a time: hidden tmp name while written, renamed when complete."""

    def __init__(self, out_dir: Path, prefix: str) -> None:
        self.out_dir = out_dir
        self.prefix = prefix
        self._f: Any = None
        self._tmp: Path | None = None
        self.start: BinlogPos | None = None
        self.lines = 0
        self.bytes = 0
        self.opened_at = 0.0

    @property
    def is_open(self) -> bool:
        return self._f is not None

    def open(self, start: BinlogPos) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.prefix}-inflight-", suffix=".json.tmp",
                                   dir=self.out_dir)
        self._f = os.fdopen(fd, "w", encoding="utf-8", newline="\n", buffering=1 << 20)
        self._tmp = Path(tmp)
        self.start = start
        self.lines = self.bytes = 0
        self.opened_at = time.monotonic()

    def write(self, lines: Iterable[str]) -> None:
        for line in lines:
            self._f.write(line)
            self._f.write("\n")
            self.lines += 1
            self.bytes += len(line) + 1

    def final_name(self, end: BinlogPos) -> str:
        assert self.start is not None
        return (f"{self.prefix}-{self.start.index:010d}-{self.start.pos:012d}"
                f"-{end.index:010d}-{end.pos:012d}.json")

    def commit(self, end: BinlogPos) -> Path:
        assert self._f is not None and self._tmp is not None
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        final = self.out_dir / self.final_name(end)
        os.replace(self._tmp, final)  # same content if a crash made us re-capture this range
        _fsync_dir(self.out_dir)
        self._f = self._tmp = None
        return final

    def abort(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            finally:
                if self._tmp is not None:
                    try:
                        self._tmp.unlink()
                    except OSError:
                        pass
                self._f = self._tmp = None


class TxnBuffer:
    """Rows of the open transaction; ``xid`` and ``commit`` are only known at its end."""

    def __init__(self, spill_dir: Path, spill_rows: int) -> None:
        self.spill_dir = spill_dir
        self.spill_rows = spill_rows
        self.items: list[tuple[str, str, str]] = []
        self.count = 0
        self.rows = 0
        self._spill: Any = None

    def add(self, kind: str, head: str, tail: str) -> None:
        self.items.append((kind, head, tail))
        self.count += 1
        if kind == "r":
            self.rows += 1
        if len(self.items) >= self.spill_rows:
            if self._spill is None:
                self._spill = tempfile.TemporaryFile("w+", encoding="utf-8", dir=self.spill_dir,
                                                     prefix=".capture-spill-")
            for k, h, t in self.items:  # JSON text never holds a raw tab or newline
                self._spill.write(f"{k}\t{h}\t{t}\n")
            self.items.clear()

    def _iter(self) -> Iterator[tuple[str, str, str]]:
        if self._spill is not None:
            self._spill.seek(0)
            for line in self._spill:
                k, h, t = line.rstrip("\n").split("\t")
                yield k, h, t
        yield from self.items

    def render(self, ts: int, xid: int | None) -> Iterator[str]:
        last_row = self.rows
        n_row = 0
        for i, (kind, head, tail) in enumerate(self._iter()):
            if kind == "r":
                n_row += 1
                x = f',"xid":{xid}' if xid is not None else ""
                c = ',"commit":true' if n_row == last_row else ""
                yield f'{head},"ts":{ts}{x},"xoffset":{i}{c}{tail}'
            else:
                yield f'{head},"xoffset":{i}{tail}'

    def clear(self) -> None:
        self.items.clear()
        self.count = self.rows = 0
        if self._spill is not None:
            self._spill.close()
            self._spill = None


# --------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------

@dataclass
class CaptureResult:
    start: str
    end: str
    files: list[str] = field(default_factory=list)
    rows: int = 0
    ddl: int = 0
    transactions: int = 0
    duration_s: float = 0.0
    stopped_by: str = "caught_up"

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "files": self.files, "rows": self.rows,
                "ddl": self.ddl, "transactions": self.transactions,
                "duration_s": round(self.duration_s, 3), "stopped_by": self.stopped_by}


class _Stop(Exception):
    pass


class MaxwellCapture:
    """Read the binlog from the saved position and land Maxwell JSON lines files."""

    def __init__(self, settings: CaptureSettings) -> None:
        self.s = settings
        self.state = StateStore(settings.state_file)
        self.writer = LandingWriter(settings.out_dir, settings.prefix)
        self.txn = TxnBuffer(settings.out_dir, settings.spill_rows)
        self._pk_cache: dict[tuple[str, str], list[str] | None] = {}
        self._conv_cache: dict[int, tuple[Any, list[tuple[str, Callable[[Any], Any]]]]] = {}
        self._ctl: Any = None
        self._stop_requested = False
        self._tables = {t.lower() for t in settings.tables}
        self._dbs = {d.lower() for d in settings.databases}

    # ---- connections and server checks ----
    def _conn_kwargs(self) -> dict[str, Any]:
        return {"host": self.s.host, "port": self.s.port, "user": self.s.user,
                "password": self.s.password, "charset": "utf8mb4"}

    def _ctl_conn(self) -> Any:
        import pymysql

        if self._ctl is None:
            kw = self._conn_kwargs()
            self._ctl = pymysql.connect(**kw, autocommit=True, connect_timeout=10)
        return self._ctl

    def _query(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        with self._ctl_conn().cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    def check_server(self) -> dict[str, Any]:
        row = self._query("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, "
                          "@@binlog_row_metadata, @@server_id, @@version")[0]
        info = dict(zip(("log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata",
                         "server_id", "version"), row))
        problems = []
        if str(info["log_bin"]) not in ("1", "ON"):
            problems.append("binary logging is off (start the server with --log-bin)")
        if str(info["binlog_format"]).upper() != "ROW":
            problems.append(f"binlog_format={info['binlog_format']} (need ROW)")
        if str(info["binlog_row_image"]).upper() != "FULL":
            problems.append(f"binlog_row_image={info['binlog_row_image']} (need FULL: 'data' must "
                            "be the whole row and 'old' the previous values)")
        if str(info["binlog_row_metadata"]).upper() != "FULL":
            problems.append(f"binlog_row_metadata={info['binlog_row_metadata']} (need FULL: "
                            "column names must come from the binlog, not today's schema)")
        if problems:
            raise CaptureConfigError(f"{self.s.host}:{self.s.port}: server not suitable for row "
                                     "capture: " + "; ".join(problems))
        return info

    def _binary_logs(self) -> list[str] | None:
        import pymysql

        try:
            return [r[0] for r in self._query("SHOW BINARY LOGS")]
        except pymysql.err.MySQLError as e:
            log.warning("cannot list binary logs (%s); grant BINLOG MONITOR to check positions", e)
            return None

    def _start_position(self, saved: dict[str, Any] | None) -> BinlogPos:
        logs = self._binary_logs()
        if saved is not None:
            pos = BinlogPos(str(saved["log_file"]), int(saved["log_pos"]))
            if logs is not None and pos.file not in logs:
                raise CaptureError(
                    f"saved position {pos} is gone from the server (binary logs now: "
                    f"{logs[0] if logs else '-'} .. {logs[-1] if logs else '-'}); changes were "
                    "purged before capture: re-snapshot the tables, then remove the state file "
                    f"{self.state.path} and start with --start current")
            return pos
        start = self.s.start.strip()
        if start == "earliest":
            if not logs:
                raise CaptureConfigError("cannot find the earliest binary log (SHOW BINARY LOGS "
                                         "needs BINLOG MONITOR); pass --start FILE:POS")
            return BinlogPos(logs[0], 4)
        if start == "current":
            import pymysql

            try:
                row = self._query("SHOW MASTER STATUS")
            except pymysql.err.MySQLError as e:
                raise CaptureConfigError(f"SHOW MASTER STATUS failed ({e}); grant BINLOG MONITOR "
                                         "or pass --start FILE:POS") from None
            if not row:
                raise CaptureConfigError("binary logging is off")
            return BinlogPos(str(row[0][0]), int(row[0][1]))
        return BinlogPos.parse(start)

    # ---- filters and metadata ----
    def _wanted(self, db: str | None, table: str | None) -> bool:
        if db is None:
            return False
        dbl = db.lower()
        if self._dbs:
            if dbl not in self._dbs:
                return False
        elif dbl in SYSTEM_SCHEMAS:
            return False
        if self._tables and table is not None:
            tl = table.lower()
            return tl in self._tables or f"{dbl}.{tl}" in self._tables
        return True

    def primary_key_columns(self, db: str, table: str, fallback: Any) -> list[str]:
        key = (db, table)
        if key not in self._pk_cache:
            rows = self._query(
                "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA=%s "
                "AND TABLE_NAME=%s AND CONSTRAINT_NAME='PRIMARY' ORDER BY ORDINAL_POSITION",
                (db, table))
            self._pk_cache[key] = [r[0] for r in rows] or None
        pk = self._pk_cache[key]
        if pk is None:
            # table gone (or no PK) today: use the binlog's own metadata of that moment
            if isinstance(fallback, str):
                return [fallback] if fallback else []
            return list(fallback or ())
        return pk

    def _converters(self, event: Any) -> list[tuple[str, Callable[[Any], Any]]]:
        tm = event.table_map[event.table_id]
        hit = self._conv_cache.get(event.table_id)
        if hit is not None and hit[0] is tm:
            return hit[1]
        convs = [(c.name, _converter(c)) for c in event.columns]
        self._conv_cache[event.table_id] = (tm, convs)
        return convs

    # ---- event handling ----
    def _rows(self, event: Any, kind: str, pos: BinlogPos) -> None:
        if not self._wanted(event.schema, event.table):
            return
        convs = self._converters(event)
        if any(name is None or str(name).startswith("UNKNOWN_COL") for name, _ in convs):
            raise CaptureConfigError(f"{event.schema}.{event.table}: the binlog has no column names "
                                     "(binlog_row_metadata was not FULL when it was written)")
        pk_cols = self.primary_key_columns(event.schema, event.table, event.primary_key)
        head = f'{{"database":{_j(event.schema)},"table":{_j(event.table)},"type":"{kind}"'
        pk_cols_json = "[" + ",".join(_j(c) for c in pk_cols) + "]"

        def conv(values: dict[str, Any], nones: dict[str, Any]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name, fn in convs:
                v = values.get(name)
                if v is None:
                    out[name] = "" if nones.get(name) == "empty set" else None
                else:
                    out[name] = fn(v)
            return out

        for row in event.rows:
            if kind == "update":
                before = conv(row["before_values"], row["before_none_sources"])
                data = conv(row["after_values"], row["after_none_sources"])
                old = {k: v for k, v in before.items() if data.get(k) != v
                       or type(data.get(k)) is not type(v)}
            else:
                data = conv(row["values"], row["none_sources"])
                old = None
            tail = (f',"position":"{pos}","primary_key":{_enc([data.get(c) for c in pk_cols])}'
                    f',"primary_key_columns":{pk_cols_json},"data":{_enc(data)}')
            if old:
                tail += f',"old":{_enc(old)}'
            self.txn.add("r", head, tail + "}")

    def _ddl(self, event: Any, pos: BinlogPos, sql: str) -> int:
        schema = event.schema.decode("utf-8", "replace") if isinstance(event.schema, bytes) \
            else str(event.schema or "")
        n = 0
        for rec in classify_ddl(sql, schema):
            if not self._wanted(rec["database"], rec["table"]):
                continue
            self._pk_cache.clear()
            head = (f'{{"database":{_enc(rec["database"])},"table":{_enc(rec["table"])},'
                    f'"type":"{rec["type"]}","ts":{int(event.timestamp)}')
            extra = "".join(f',"{k}":{_enc(rec[k])}' for k in ("new_database", "new_table")
                            if k in rec)
            tail = f',"position":"{pos}","sql":{_j(sql)}{extra}}}'
            self.txn.add("d", head, tail)
            n += 1
        return n

    def _end_txn(self, ts: int, xid: int | None, pos: BinlogPos, result: CaptureResult) -> None:
        if self.txn.count:
            if not self.writer.is_open:
                self.writer.open(self._file_start)
            self.writer.write(self.txn.render(ts, xid))
            result.rows += self.txn.rows
            result.ddl += self.txn.count - self.txn.rows
            result.transactions += 1
        self.txn.clear()
        self._safe = pos
        if self.writer.is_open and (self.writer.lines >= self.s.max_file_rows
                                    or self.writer.bytes >= self.s.max_file_bytes):
            self._land(result)

    def _land(self, result: CaptureResult) -> None:
        """Rename the open file into place, then record the position it ends at."""
        if self.writer.is_open:
            path = self.writer.commit(self._safe)
            result.files.append(str(path))
            log.info("landed %s (%d lines)", path.name, self.writer.lines)
        if self._safe != self._saved:
            self.state.save(self._safe, {"server": f"{self.s.host}:{self.s.port}",
                                         "last_gtid": self._last_gtid,
                                         "last_file": result.files[-1] if result.files else None})
            self._saved = self._safe
        self._saved_at = time.monotonic()
        self._file_start = self._safe

    def request_stop(self, *_: Any) -> None:
        self._stop_requested = True

    def run(self) -> CaptureResult:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import (FormatDescriptionEvent, GtidEvent,
                                              HeartbeatLogEvent, MariadbGtidEvent, QueryEvent,
                                              RotateEvent, XAPrepareEvent, XidEvent)
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        t0 = time.monotonic()
        self.state.lock(self.s)
        try:
            self.check_server()
            saved = self.state.load()
            start = self._start_position(saved)
            self._safe = self._saved = self._file_start = start
            self._saved_at = time.monotonic()
            self._last_gtid: str | None = saved.get("last_gtid") if saved else None
            result = CaptureResult(start=str(start), end=str(start))
            only_schemas = sorted(self.s.databases) or None
            stream = BinLogStreamReader(
                connection_settings=self._conn_kwargs(),
                server_id=self.s.replica_server_id,
                resume_stream=True, log_file=start.file, log_pos=start.pos,
                blocking=not self.s.until_now,
                only_events=[RotateEvent, FormatDescriptionEvent, MariadbGtidEvent, GtidEvent,
                             QueryEvent, XidEvent, XAPrepareEvent, HeartbeatLogEvent,
                             WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
                only_schemas=only_schemas,
                is_mariadb=False,  # position-based resume (field notes); MariaDB still works
                slave_heartbeat=None if self.s.until_now else self.s.heartbeat_s,
                enable_logging=False,
            )
            in_txn = False
            standalone = False
            try:
                for ev in stream:
                    pos = BinlogPos(stream.log_file, ev.packet.log_pos)
                    if isinstance(ev, RotateEvent):
                        if in_txn and self.txn.count:
                            # a reconnect mid-transaction would resume mid-transaction
                            raise CaptureError(f"binlog stream restarted inside a transaction at "
                                               f"{pos}; stopping at the last commit {self._safe}")
                        continue
                    if isinstance(ev, (MariadbGtidEvent, GtidEvent)):
                        self._last_gtid = str(getattr(ev, "gtid", None) or "")
                        flags = int(getattr(ev, "flags", 0) or 0)
                        if flags & (_FL_PREPARED_XA | _FL_COMPLETED_XA):
                            raise CaptureError(f"XA transaction at {pos} is not supported")
                        standalone = bool(flags & _FL_STANDALONE) if isinstance(
                            ev, MariadbGtidEvent) else False
                        in_txn = isinstance(ev, MariadbGtidEvent) and not standalone
                        continue
                    if isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                        in_txn = True
                        kind = ("insert" if isinstance(ev, WriteRowsEvent) else
                                "update" if isinstance(ev, UpdateRowsEvent) else "delete")
                        self._rows(ev, kind, pos)
                        continue
                    if isinstance(ev, XidEvent):
                        self._end_txn(int(ev.timestamp), int(ev.xid), pos, result)
                        in_txn = standalone = False
                    elif isinstance(ev, XAPrepareEvent):
                        raise CaptureError(f"XA transaction at {pos} is not supported")
                    elif isinstance(ev, QueryEvent):
                        sql = ev.query.strip().rstrip(";").strip()
                        word = sql.split(None, 1)[0].upper() if sql else ""
                        if word == "BEGIN":
                            in_txn = True
                            continue
                        if word in ("COMMIT", "ROLLBACK") and len(sql.split()) == 1:
                            # non-transactional engines: their changes stay even on ROLLBACK
                            self._end_txn(int(ev.timestamp), None, pos, result)
                            in_txn = standalone = False
                        else:
                            self._ddl(ev, pos, ev.query)
                            if not in_txn:
                                self._end_txn(int(ev.timestamp), None, pos, result)
                                standalone = False
                    # here: heartbeat, format description or a transaction end
                    if not in_txn:
                        if self._stop_requested:
                            result.stopped_by = "signal"
                            break
                        now = time.monotonic()
                        if self.writer.is_open:
                            if now - self.writer.opened_at >= self.s.flush_interval_s:
                                self._land(result)
                        elif self._safe != self._saved and \
                                now - self._saved_at >= self.s.flush_interval_s:
                            self._land(result)  # nothing to land: just move the position on
            finally:
                stream.close()
            if in_txn and self.txn.count:
                log.warning("stream ended inside a transaction at %s; its rows are not landed "
                            "(next run resumes at %s)", self._safe, self._safe)
            self.txn.clear()
            self._land(result)
            result.end = str(self._safe)
            result.duration_s = time.monotonic() - t0
            return result
        except BaseException:
            self.writer.abort()
            self.txn.clear()
            raise
        finally:
            if self._ctl is not None:
                try:
                    self._ctl.close()
                except Exception:
                    pass
                self._ctl = None
            self.state.unlock()


def capture(settings: CaptureSettings) -> CaptureResult:
    """Run one capture (in-process API used by tests and the CLI)."""
    return MaxwellCapture(settings).run()


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def _names(text: str | None) -> tuple[str, ...]:
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cdc_lake.capture.mariadb_maxwell",
        description="Land a MariaDB/MySQL row binlog as Maxwell JSON lines files.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=3306)
    p.add_argument("--user", required=True)
    p.add_argument("--password", default=None,
                   help="prefer --password-env; default: $CDC_CAPTURE_PASSWORD, then $MYSQL_PWD")
    p.add_argument("--password-env", default=None, metavar="VAR",
                   help="read the password from this environment variable")
    p.add_argument("--out", required=True, type=Path, help="landing folder")
    p.add_argument("--state", type=Path, default=None,
                   help="resume state file (default: <out>/.<prefix>-capture-state.json)")
    p.add_argument("--until-now", action="store_true",
                   help="stop when caught up with the binlog (default: follow until SIGTERM)")
    p.add_argument("--server-id", type=int, default=None,
                   help="replica server id to announce (default: derived from --out)")
    p.add_argument("--databases", default=None, help="comma-separated schemas to capture")
    p.add_argument("--tables", default=None, help="comma-separated tables ('t' or 'db.t')")
    p.add_argument("--start", default="earliest",
                   help="where to begin when there is no state: earliest, current or FILE:POS")
    p.add_argument("--max-file-rows", type=int, default=100_000)
    p.add_argument("--max-file-bytes", type=int, default=64 * 1024 * 1024)
    p.add_argument("--flush-interval", type=float, default=5.0,
                   help="follow mode: land an open file after this many seconds")
    p.add_argument("--prefix", default="maxwell", help="landing file name prefix")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.password_env:
        if args.password_env not in os.environ:
            print(f"error: --password-env: environment variable {args.password_env} is not set",
                  file=sys.stderr)
            return EXIT_CONFIG
        password = os.environ[args.password_env]
    elif args.password is not None:
        password = args.password
    else:
        password = os.environ.get("CDC_CAPTURE_PASSWORD", os.environ.get("MYSQL_PWD", ""))
    if not re.match(r"^[A-Za-z0-9_.-]+$", args.prefix):
        print(f"error: --prefix {args.prefix!r}: use letters, digits, '_', '.', '-'",
              file=sys.stderr)
        return EXIT_CONFIG
    if args.max_file_rows < 1 or args.max_file_bytes < 1 or args.flush_interval <= 0:
        print("error: --max-file-rows, --max-file-bytes and --flush-interval must be positive",
              file=sys.stderr)
        return EXIT_CONFIG
    settings = CaptureSettings(
        host=args.host, port=args.port, user=args.user, password=password,
        out_dir=args.out.expanduser().resolve(),
        state_path=args.state.expanduser().resolve() if args.state else None,
        until_now=args.until_now, server_id=args.server_id,
        databases=_names(args.databases), tables=_names(args.tables), start=args.start,
        max_file_rows=args.max_file_rows, max_file_bytes=args.max_file_bytes,
        flush_interval_s=args.flush_interval, prefix=args.prefix)
    cap = MaxwellCapture(settings)
    signal.signal(signal.SIGTERM, cap.request_stop)
    signal.signal(signal.SIGINT, cap.request_stop)
    try:
        result = cap.run()
    except CaptureError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - CLI boundary
        import pymysql

        if isinstance(e, pymysql.err.MySQLError):
            print(f"error: {settings.host}:{settings.port}: {e}", file=sys.stderr)
        else:
            log.exception("capture failed")
        return EXIT_FAIL
    print("CAPTURE_SUMMARY " + json.dumps(result.to_json(), sort_keys=True), flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
