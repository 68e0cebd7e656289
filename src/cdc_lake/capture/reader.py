"""Read the row binlog from the saved position and land Maxwell JSON lines (``MaxwellCapture``).

Transactions are buffered (``TxnBuffer``) until their end is seen, written to the open landing
file, and the resume position is saved only after the file holding them was renamed into place
(``docs/capture.md``); a crash can re-land a transaction, never lose one.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from cdc_lake.capture import charsets
from cdc_lake.capture.binlog_stream import (RESNAPSHOT, binlog_error, full_bitmap,
                                              stream_class)
from cdc_lake.capture.ddl import classify_ddl, statement_dml
from cdc_lake.capture.landing import LandingWriter, TxnBuffer
from cdc_lake.capture.maxwell_json import converter, enc, json_str
from cdc_lake.capture.source_schema import SourceSchema, is_current
from cdc_lake.capture.state import (BinlogPos, CaptureBadValue, CaptureConfigError, CaptureError,
                                    CaptureNeedsOperator, CaptureSettings, StateStore)

log = logging.getLogger("cdc_lake.capture")

SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


# MariaDB GTID event flags (sql/log_event.h)
_FL_STANDALONE = 1
_FL_PREPARED_XA = 64
_FL_COMPLETED_XA = 128


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


_ROLLBACK = re.compile(r"^ROLLBACK(?:\s+WORK)?(?:\s+TO\s+(?:SAVEPOINT\s+)?(?P<name>.+))?$",
                       re.IGNORECASE | re.DOTALL)
_SAVEPOINT = re.compile(r"^SAVEPOINT\s+(?P<name>.+)$", re.IGNORECASE | re.DOTALL)


def _savepoint_name(text: str) -> str:
    """A savepoint name as written (`` `a b` `` or ``a``) -> its name (case-insensitive)."""
    text = text.strip()
    if text.startswith("`") and text.endswith("`"):
        text = text[1:-1].replace("``", "`")
    return text.lower()


class MaxwellCapture:
    """Read the binlog from the saved position and land Maxwell JSON lines files."""

    def __init__(self, settings: CaptureSettings) -> None:
        self.s = settings
        self.state = StateStore(settings.state_file)
        self.writer = LandingWriter(settings.out_dir, settings.prefix)
        self.txn = TxnBuffer(settings.out_dir, settings.spill_rows)
        self.schema = SourceSchema(self._query)  # today's keys, engines, types (cached)
        self._conv_cache: dict[int, tuple[Any, list[tuple[str, Callable[[Any], Any]]]]] = {}
        self._ctl: Any = None
        self._stop_requested = False
        self._tables = {t.lower() for t in settings.tables}
        self._dbs = {d.lower() for d in settings.databases}
        self._identity: dict[str, dict[str, int]] = {}  # binlog file -> its Format_description
        self._logs: list[str] | None = None

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
        logs = self._logs = self._binary_logs()
        if saved is not None:
            pos = BinlogPos(str(saved["log_file"]), int(saved["log_pos"]))
            if logs is not None and pos.file not in logs:
                first = BinlogPos(logs[0], 4) if logs else None
                last = BinlogPos(logs[-1], 4) if logs else None
                now = f"{first.file if first else '-'} .. {last.file if last else '-'}"
                if last is None or pos.index > last.index or \
                        pos.file.rsplit(".", 1)[0] != last.file.rsplit(".", 1)[0]:
                    raise CaptureNeedsOperator(
                        f"saved position {pos} ({self.state.path}) is not in this server's "
                        f"binary logs ({now}): {self._reset_text()}")
                raise CaptureNeedsOperator(
                    f"saved position {pos} ({self.state.path}) is gone from the server (binary "
                    f"logs now: {now}): the changes between it and {now.split(' ')[0]} were "
                    "purged before they were captured and the lake misses them. Rebuild the "
                    "lake's tables from a snapshot (docs/capture.md, \"Refused binlog events\"); "
                    "to go on without them, move the state file aside and start with --start "
                    "current (later positions sort after the landed ones), then full-refresh "
                    "the pipeline once a snapshot is landed. Keep binary logs longer "
                    "(binlog_expire_logs_seconds) than the capture can be down")
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

    def _reset_text(self) -> str:
        return ("the binlog was reset (RESET MASTER) or this is another server. Binlog positions "
                "then start again from the first file, below the positions already landed; the "
                "pipeline orders changes by (file number, position), so it would silently ignore "
                "every new change: do NOT just remove the state file and restart the capture. "
                "If --host/--port point at the wrong server, fix them. Otherwise rebuild the "
                "lake: land a snapshot of the tables and the new binlog in a NEW landing folder "
                "(--out NEW, which has no state; --start earliest if the new binlog covers "
                "everything since the reset), point the pipeline's source.path at it, move its "
                "checkpoint aside and run it with --full-refresh (docs/capture.md, \"Refused "
                "binlog events\")")

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

    def _converters(self, event: Any) -> list[tuple[str, Callable[[Any], Any]]]:
        tm = event.table_map[event.table_id]
        hit = self._conv_cache.get(event.table_id)
        if hit is not None and hit[0] is tm:
            return hit[1]
        bad = charsets.unsupported_text_columns(event.columns)
        if bad:
            raise CaptureConfigError(
                f"{event.schema}.{event.table}: column(s) "
                + ", ".join(f"{c!r} (CHARACTER SET {cs})" for c, cs in bad)
                + " use a character set the capture cannot decode (its values would land as "
                "bytes, not text). Convert them (ALTER TABLE ... CONVERT TO CHARACTER SET "
                "utf8mb4) or leave the table out (--tables / --databases); nothing of this "
                "transaction was landed")
        special = self.schema.special_types(event.schema, event.table)
        convs = [(c.name, special.get(c.name) or converter(c)) for c in event.columns]
        self._conv_cache[event.table_id] = (tm, convs)
        return convs

    # ---- event handling ----
    def _rows(self, event: Any, kind: str, pos: BinlogPos) -> None:
        if not self._wanted(event.schema, event.table):
            return
        ncols = int(getattr(event, "number_of_columns", 0) or 0)
        images = [("", getattr(event, "columns_present_bitmap", None))]
        if kind == "update":
            images = [("before ", images[0][1]),
                      ("after ", getattr(event, "columns_present_bitmap2", None))]
        for label, bitmap in images:
            if not full_bitmap(bitmap, ncols):
                missing = [c.name for i, c in enumerate(event.columns)
                           if bitmap is not None and i < ncols and not bitmap[i // 8] & (1 << (i % 8))]
                raise CaptureNeedsOperator(
                    f"{event.schema}.{event.table}: the {kind} {label}image at binlog position "
                    f"{pos} does not carry every column (missing: {', '.join(map(str, missing))}): "
                    "it was written with binlog_row_image MINIMAL or NOBLOB (a session or an "
                    "earlier global setting), not FULL; landing it would put NULL in place of "
                    "those values. Nothing of this transaction was landed; the capture stops "
                    f"here every run. {RESNAPSHOT}")
        convs = self._converters(event)
        if any(name is None or str(name).startswith("UNKNOWN_COL") for name, _ in convs):
            raise CaptureConfigError(f"{event.schema}.{event.table}: the binlog has no column names "
                                     "(binlog_row_metadata was not FULL when it was written)")
        pk_cols = self.schema.primary_key_columns(event.schema, event.table, event.primary_key)
        versioned = self.schema.versioned(event.schema, event.table, pk_cols)
        if versioned is not None:
            pk_cols = pk_cols[:-1]  # MariaDB appends the row-end column to every unique key
        prefix = f'{{"database":{json_str(event.schema)},"table":{json_str(event.table)},"type":'
        pk_cols_json = "[" + ",".join(json_str(c) for c in pk_cols) + "]"

        def conv(values: dict[str, Any], nones: dict[str, Any]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name, fn in convs:
                v = values.get(name)
                if v is None:
                    out[name] = "" if nones.get(name) == "empty set" else None
                else:
                    out[name] = fn(v)
            return out

        try:
            rows = event.rows  # decoded on first access
        except UnicodeDecodeError as e:
            raise CaptureBadValue(
                f"{event.schema}.{event.table}: a value at binlog position {pos} is not valid "
                f"{e.encoding} ({e.reason} at byte {e.start}: {e.object[e.start:e.start + 8]!r}), "
                "the character set its column declares; nothing of this transaction was "
                "landed. Fix or delete the row, or leave the table out (--tables / "
                "--databases) and capture from after it (--start FILE:POS with a new state "
                "file)") from None
        undoable = self.schema.transactional(event.schema, event.table)
        for row in rows:
            rkind = kind
            if kind == "update":
                before = conv(row["before_values"], row["before_none_sources"])
                data = conv(row["after_values"], row["after_none_sources"])
            else:
                before = None
                data = conv(row["values"], row["none_sources"])
            if versioned is not None:
                end, hidden = versioned
                if not is_current(data.get(end)):
                    # a history row: written by an UPDATE (insert) or a DELETE (the current
                    # row's update to a past row end), removed by DELETE HISTORY (delete)
                    if before is None or not is_current(before.get(end)):
                        continue
                    rkind, data, before = "delete", before, None
                for c in hidden:
                    data.pop(c, None)
                    if before is not None:
                        before.pop(c, None)
            old = None if before is None else {
                k: v for k, v in before.items() if data.get(k) != v or type(data.get(k)) is not type(v)}
            head = f'{prefix}"{rkind}"'
            tail = (f',"position":"{pos}","primary_key":{enc([data.get(c) for c in pk_cols])}'
                    f',"primary_key_columns":{pk_cols_json},"data":{enc(data)}')
            if old:
                tail += f',"old":{enc(old)}'
            self.txn.add("r" if undoable else "n", head, tail + "}")

    def _ddl(self, event: Any, pos: BinlogPos, sql: str) -> int:
        schema = event.schema.decode("utf-8", "replace") if isinstance(event.schema, bytes) \
            else str(event.schema or "")
        n = 0
        for rec in classify_ddl(sql, schema):
            if not self._wanted(rec["database"], rec["table"]):
                continue
            self.schema.clear()
            head = (f'{{"database":{enc(rec["database"])},"table":{enc(rec["table"])},'
                    f'"type":"{rec["type"]}","ts":{int(event.timestamp)}')
            extra = "".join(f',"{k}":{enc(rec[k])}' for k in ("new_database", "new_table")
                            if k in rec)
            tail = f',"position":"{pos}","sql":{json_str(sql)}{extra}}}'
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
            ident = self._identity.get(self._safe.file)
            self.state.save(self._safe, {"server": f"{self.s.host}:{self.s.port}",
                                         "last_gtid": self._last_gtid,
                                         "last_file": result.files[-1] if result.files else None,
                                         **({"binlog_identity": {"file": self._safe.file, **ident}}
                                            if ident else {})})
            self._saved = self._safe
        self._saved_at = time.monotonic()
        self._file_start = self._safe

    def request_stop(self, *_: Any) -> None:
        self._stop_requested = True

    def run(self) -> CaptureResult:
        from pymysqlreplication.event import (ExecuteLoadQueryEvent, FormatDescriptionEvent,
                                              GtidEvent, HeartbeatLogEvent, MariadbGtidEvent,
                                              QueryEvent, RotateEvent, XAPrepareEvent, XidEvent)
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        charsets.install()
        t0 = time.monotonic()
        self.state.lock(self.s)
        try:
            self.check_server()
            for f in self.writer.remove_leftovers() + self.state.remove_leftovers():
                log.info("removed %s, left by a capture that was killed", f.name)
            saved = self.state.load()
            start = self._start_position(saved)
            self._safe = self._file_start = start
            # no state yet: record the start even if nothing is new (a --start current run
            # that found nothing would otherwise start at "now" again next time, skipping
            # every change written in between); an old state without the binlog's identity:
            # record it now, so the next runs can tell a reset binlog
            self._saved = start if saved and saved.get("binlog_identity") else None
            want_ident = saved.get("binlog_identity") if saved else None
            if not isinstance(want_ident, dict) or want_ident.get("file") != start.file:
                want_ident = None
            self._saved_at = time.monotonic()
            self._last_gtid: str | None = saved.get("last_gtid") if saved else None
            result = CaptureResult(start=str(start), end=str(start))
            only_schemas = sorted(self.s.databases) or None
            stream_cls = stream_class()
            base = start.file.rsplit(".", 1)[0]

            def open_stream(at: BinlogPos, checksum: bool | None) -> Any:
                st = stream_cls(
                    connection_settings=self._conn_kwargs(),
                    server_id=self.s.replica_server_id,
                    resume_stream=True, log_file=at.file, log_pos=at.pos,
                    blocking=not self.s.until_now,
                    only_events=[RotateEvent, FormatDescriptionEvent, MariadbGtidEvent, GtidEvent,
                                 QueryEvent, XidEvent, XAPrepareEvent, HeartbeatLogEvent,
                                 ExecuteLoadQueryEvent,
                                 WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
                    only_schemas=only_schemas,
                    is_mariadb=False,  # position-based resume (field notes); MariaDB still works
                    slave_heartbeat=None if self.s.until_now else self.s.heartbeat_s,
                    enable_logging=False,
                )
                st.use_checksum = checksum
                return st

            in_txn = False
            standalone = False
            xa: dict[str, Any] | None = None   # an XA transaction being read (not landed)
            at, checksum = start, None
            switched: set[tuple[BinlogPos, bool]] = set()
            try:
                while True:
                    stream = open_stream(at, checksum)
                    first_fd = True
                    cur_file = at.file
                    bad_start: CaptureNeedsOperator | None = None
                    reopen: tuple[BinlogPos, bool] | None = None
                    try:
                        for ev in stream:
                            pos = BinlogPos(stream.log_file, ev.packet.log_pos)
                            if isinstance(ev, RotateEvent):
                                if in_txn and self.txn.count:
                                    # a reconnect mid-transaction would resume mid-transaction
                                    raise CaptureError(
                                        f"binlog stream restarted inside a transaction at {pos}; "
                                        f"stopping at the last commit {self._safe}")
                                try:
                                    self._check_rotate(ev, base, pos)
                                    cur_file = str(ev.next_binlog)
                                except CaptureNeedsOperator as bad:
                                    if int(ev.timestamp or 0) != 0:
                                        raise
                                    # the server's own rotate before a file's first event: the
                                    # file's Format_description (next) tells how to parse it
                                    bad_start = bad
                                continue
                            if isinstance(ev, FormatDescriptionEvent):
                                alg = getattr(ev, "checksum_algorithm", None)
                                parses = stream.parses_checksum
                                if alg in (0, 1) and parses is not None and bool(alg) != parses:
                                    # this file was written with the other binlog_checksum:
                                    # read it again from its start, parsed as written
                                    here = at if first_fd else BinlogPos(cur_file, 4)
                                    reopen = (here, bool(alg))
                                    break
                                if bad_start is not None:
                                    raise bad_start
                                first_fd = False
                                ident = {"created": int(ev.timestamp),
                                         "server_id": int(ev.packet.server_id)}
                                self._identity[stream.log_file] = ident
                                if want_ident is not None and stream.log_file == want_ident["file"]:
                                    if (want_ident.get("created"), want_ident.get("server_id")) \
                                            != (ident["created"], ident["server_id"]):
                                        raise CaptureNeedsOperator(
                                            f"{stream.log_file} on {self.s.host}:{self.s.port} is "
                                            f"not the binlog file the saved position {start} "
                                            f"({self.state.path}) belongs to (written at "
                                            f"{want_ident.get('created')} by server id "
                                            f"{want_ident.get('server_id')}; now: "
                                            f"{ident['created']} by server id "
                                            f"{ident['server_id']}): {self._reset_text()}")
                                    want_ident = None
                                continue
                            if isinstance(ev, (MariadbGtidEvent, GtidEvent)):
                                self._last_gtid = str(getattr(ev, "gtid", None) or "")
                                flags = int(getattr(ev, "flags", 0) or 0)
                                xa = None
                                if flags & (_FL_PREPARED_XA | _FL_COMPLETED_XA):
                                    xa = {"at": pos, "gtid": self._last_gtid, "tables": set(),
                                          "completed": bool(flags & _FL_COMPLETED_XA)}
                                standalone = bool(flags & _FL_STANDALONE) if isinstance(
                                    ev, MariadbGtidEvent) else False
                                in_txn = isinstance(ev, MariadbGtidEvent) and not standalone
                                continue
                            if isinstance(ev, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                                in_txn = True
                                if xa is not None:
                                    if self._wanted(ev.schema, ev.table):
                                        xa["tables"].add(f"{ev.schema}.{ev.table}")
                                    continue
                                kind = ("insert" if isinstance(ev, WriteRowsEvent) else
                                        "update" if isinstance(ev, UpdateRowsEvent) else "delete")
                                self._rows(ev, kind, pos)
                                continue
                            if isinstance(ev, ExecuteLoadQueryEvent):
                                self._statement_load(ev, pos)
                                continue
                            if isinstance(ev, XidEvent):
                                self._end_txn(int(ev.timestamp), int(ev.xid), pos, result)
                                in_txn = standalone = False
                                xa = None
                            elif isinstance(ev, XAPrepareEvent) or (
                                    xa is not None and isinstance(ev, QueryEvent)
                                    and re.match(r"^\s*XA\s+(?:COMMIT|ROLLBACK)\b", ev.query,
                                                 re.I)):
                                if xa is None or xa["tables"]:
                                    self._refuse_xa(xa, pos)
                                # an XA transaction of tables not captured: nothing to land
                                self._end_txn(int(ev.timestamp), None, pos, result)
                                in_txn = standalone = False
                                xa = None
                            elif isinstance(ev, QueryEvent):
                                sql = ev.query.strip().rstrip(";").strip()
                                word = sql.split(None, 1)[0].upper() if sql else ""
                                if word == "BEGIN":
                                    in_txn = True
                                    continue
                                sp = _SAVEPOINT.match(sql)
                                if sp and in_txn:
                                    self.txn.savepoint(_savepoint_name(sp.group("name")))
                                    continue
                                rb = _ROLLBACK.match(sql)
                                if rb and rb.group("name") and in_txn:
                                    # ROLLBACK TO sp: logged when the transaction also changed a
                                    # non-transactional table; the transactional rows after sp go
                                    self.txn.rollback_to(_savepoint_name(rb.group("name")))
                                    continue
                                if (rb and not rb.group("name")) or (word == "COMMIT"
                                                                      and len(sql.split()) == 1):
                                    # non-transactional engines: their changes stay on ROLLBACK
                                    if rb:
                                        self.txn.rollback()
                                    self._end_txn(int(ev.timestamp), None, pos, result)
                                    in_txn = standalone = False
                                elif xa is not None:
                                    continue  # XA START / XA END of an XA transaction
                                else:
                                    self._statement_dml(ev, pos, ev.query)
                                    self._ddl(ev, pos, ev.query)
                                    if not in_txn:
                                        self._end_txn(int(ev.timestamp), None, pos, result)
                                        standalone = False
                            # here: heartbeat or a transaction end
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
                                    self._land(result)  # nothing to land: move the position on
                    except Exception as e:  # noqa: BLE001 - server errors of the dump
                        err = binlog_error(e)
                        if err is None or err[0] != 1236:
                            raise
                        here = BinlogPos(stream.log_file or at.file,
                                         int(stream.log_pos or at.pos))
                        if "checksum" in err[1].lower() and not (in_txn and self.txn.count):
                            # the file has checksums the stream did not announce: read it again
                            # with checksums (the server's setting changed since it was written)
                            reopen = (here, True)
                        else:
                            raise self._dump_refused(err[1], here, start) from None
                    finally:
                        stream.close()
                    if reopen is None:
                        break
                    if reopen in switched:
                        raise CaptureNeedsOperator(
                            f"binlog file {reopen[0].file} (read from {reopen[0]}) cannot be read "
                            "with or without CRC32 checksums; it was written with another "
                            "binlog_checksum than the server uses now and mysql-replication "
                            "cannot parse it. Check the file with mariadb-binlog; "
                            f"{RESNAPSHOT}")
                    switched.add(reopen)
                    log.info("binlog file %s was written with binlog_checksum=%s: reading it "
                             "again from %s with that setting", reopen[0].file,
                             "CRC32" if reopen[1] else "NONE", reopen[0])
                    at, checksum = reopen
            except CaptureNeedsOperator:
                # land the whole transactions before the refused event; the state then points
                # just before it, so every run stops there again until an operator acts
                self.txn.clear()
                self._land(result)
                raise
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

    # ---- refusals (exit 3: every retry would stop at the same event) ----
    def _check_rotate(self, ev: Any, base: str, pos: BinlogPos) -> None:
        """A rotate's next file must be one of the server's binary logs (base.NNNNNN): a name
        like ``mariadb-bin.00`` means the event was parsed with the wrong checksum length."""
        name = str(getattr(ev, "next_binlog", "") or "")
        ok = bool(re.fullmatch(re.escape(base) + r"\.\d{6,}", name))
        if ok and self._logs is not None and name not in self._logs:
            self._logs = self._binary_logs()
            ok = self._logs is None or name in self._logs
        if not ok:
            raise CaptureNeedsOperator(
                f"the binlog at {pos} rotates to {name!r}, which is not one of the server's "
                f"binary logs ({base}.NNNNNN): the file was most likely written with another "
                "binlog_checksum setting (NONE vs CRC32) than mysql-replication parsed it with, "
                f"so its events cannot be trusted. Nothing after {self._safe} was recorded. "
                "Check the file with mariadb-binlog; " + RESNAPSHOT)

    def _statement_dml(self, ev: Any, pos: BinlogPos, sql: str) -> None:
        """Refuse a row change logged as a statement on a captured table (its rows are not in
        the binlog; skipping it would lose them silently)."""
        schema = ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) \
            else str(ev.schema or "")
        targets = statement_dml(sql, schema)
        if not targets:
            return
        hit = []
        for db, table in targets:
            if table is not None:
                if self._wanted(db, table):
                    hit.append(f"{db}.{table}")
            elif self._wanted(db, None) or not self._dbs or any(
                    d in sql.lower() for d in self._dbs):
                hit.append(f"{db}.<tables of a multi-table statement>")
        if hit:
            text = " ".join(sql.split())
            raise CaptureNeedsOperator(
                f"{', '.join(hit)}: the change at binlog position {pos} was logged as a "
                f"statement, not as rows ({text[:200]!r}): it was written with binlog_format "
                "STATEMENT or MIXED (a session or an earlier global setting); the capture only "
                "reads row events and would lose it. Nothing of this transaction was landed; "
                f"the capture stops here every run. {RESNAPSHOT}")

    def _statement_load(self, ev: Any, pos: BinlogPos) -> None:
        """LOAD DATA logged as a statement (Execute_load_query event)."""
        schema, sql = "", ""
        try:  # the library does not read the statement; it follows the post-header
            ev.packet.read(int(ev.status_vars_length))
            schema = ev.packet.read(int(ev.schema_length)).decode("utf-8", "replace")
            ev.packet.read(1)
            sql = bytes(ev.packet.read(ev.event_size - 4 - 4 - 1 - 2 - 2 - 4 - 4 - 4 - 1
                                       - int(ev.status_vars_length) - int(ev.schema_length) - 1)
                        ).decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - refuse anyway, without the text
            sql = ""
        if sql and statement_dml(sql, schema) is not None:
            self._statement_dml(ev, pos, sql)
        elif not sql:
            raise CaptureNeedsOperator(
                f"a LOAD DATA statement at binlog position {pos} was logged as a statement "
                "(binlog_format STATEMENT or MIXED), its rows are not in the binlog. "
                + RESNAPSHOT)

    def _refuse_xa(self, xa: dict[str, Any] | None, pos: BinlogPos) -> None:
        tables = ", ".join(sorted(xa["tables"])) if xa else "tables unknown"
        at = xa["at"] if xa else pos
        gtid = f" (GTID {xa['gtid']})" if xa and xa.get("gtid") else ""
        raise CaptureNeedsOperator(
            f"XA transaction at binlog position {at}{gtid} changes {tables}: XA transactions "
            "are not supported (its rows are logged at XA PREPARE, its outcome later). Nothing "
            f"of it was landed; the capture stops here every run. Use ordinary transactions for "
            f"these tables, or leave them out (--tables / --databases); then rebuild the lake's "
            f"copy from a snapshot and capture from after {pos} with a new state file "
            "(docs/capture.md, \"Refused binlog events\")")

    def _dump_refused(self, text: str, here: BinlogPos, start: BinlogPos) -> CaptureNeedsOperator:
        """Error 1236 (the server refuses to send the binlog from a position)."""
        low = text.lower()
        if "max_allowed_packet" in low or "position > file size" in low or \
                "impossible position" in low or \
                "bogus data" in low or "wrong offset" in low or "event too big" in low:
            why = (f"the saved position {start} is not the start of an event in "
                   f"{start.file} (beyond its end or inside an event)")
        elif "could not find first log file" in low:
            why = f"{start.file} is gone from the server (purged)"
        else:
            why = "the server refused to send the binlog from there"
        return CaptureNeedsOperator(
            f"{self.s.host}:{self.s.port}: binlog dump from {here} failed: {text} -- {why}. "
            f"A state file ({self.state.path}) only ever holds transaction ends, so it was "
            f"edited, or {self._reset_text()}")


def capture(settings: CaptureSettings) -> CaptureResult:
    """Run one capture (in-process API used by tests and the CLI)."""
    return MaxwellCapture(settings).run()

