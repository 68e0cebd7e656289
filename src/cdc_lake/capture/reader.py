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
from typing import Any

from cdc_lake.capture import charsets
from cdc_lake.capture.binlog_stream import binlog_error, stream_class
from cdc_lake.capture.events import (DumpState, TxnState, event_classes, gtid_txn,
                                     query_marker, schema_of)
from cdc_lake.capture.landing import LandingWriter, TxnBuffer
from cdc_lake.capture.refusals import (check_rotate, dump_refused, load_statement_check,
                                       other_binlog, statement_dml_check, unreadable_checksum,
                                       xa_refusal)
from cdc_lake.capture.row_lines import MaxwellLines
from cdc_lake.capture.server import binary_logs, check_server, start_position
from cdc_lake.capture.source_schema import SourceSchema
from cdc_lake.capture.state import (BinlogPos, CaptureError, CaptureNeedsOperator,
                                    CaptureSettings, StateStore)

log = logging.getLogger("cdc_lake.capture")

SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


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


class MaxwellCapture:
    """Read the binlog from the saved position and land Maxwell JSON lines files."""

    def __init__(self, settings: CaptureSettings) -> None:
        self.s = settings
        self.state = StateStore(settings.state_file)
        self.writer = LandingWriter(settings.out_dir, settings.prefix)
        self.txn = TxnBuffer(settings.out_dir, settings.spill_rows)
        self.schema = SourceSchema(self._query)  # today's keys, engines, types (cached)
        self.lines = MaxwellLines(self.schema)
        self._ctl: Any = None
        self._stop_requested = False
        self._tables = {t.lower() for t in settings.tables}
        self._dbs = {d.lower() for d in settings.databases}
        self._identity: dict[str, dict[str, int]] = {}  # binlog file -> its Format_description
        self._logs: list[str] | None = None
        self._server = f"{settings.host}:{settings.port}"
        self._tx = TxnState()

    # ---- the control connection ----
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

    # ---- filters ----
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

    # ---- rows and DDL into the open transaction ----
    def _rows(self, event: Any, kind: str, pos: BinlogPos) -> None:
        if self._wanted(event.schema, event.table):
            for undo, head, tail in self.lines.rows(event, kind, pos):
                self.txn.add(undo, head, tail)

    def _ddl(self, event: Any, pos: BinlogPos, sql: str) -> None:
        for head, tail in self.lines.ddl(event, pos, sql, schema_of(event), self._wanted):
            self.txn.add("d", head, tail)

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
            self.state.save(self._safe, {"server": self._server,
                                         "last_gtid": self._last_gtid,
                                         "last_file": result.files[-1] if result.files else None,
                                         **({"binlog_identity": {"file": self._safe.file, **ident}}
                                            if ident else {})})
            self._saved = self._safe
        self._saved_at = time.monotonic()
        self._file_start = self._safe

    def request_stop(self, *_: Any) -> None:
        self._stop_requested = True

    # ---- the run ----
    def run(self) -> CaptureResult:
        """Read from the saved position (or ``--start``) to the end of the binlog (or a stop
        request), landing whole transactions; the state moves only after a file is in place."""
        charsets.install()
        self._ev, self._tx = event_classes(), TxnState()
        t0 = time.monotonic()
        self.state.lock(self.s)
        try:
            check_server(self._query, self._server)
            for f in self.writer.remove_leftovers() + self.state.remove_leftovers():
                log.info("removed %s, left by a capture that was killed", f.name)
            saved = self.state.load()
            self._logs = binary_logs(self._query)
            start = self._start = start_position(saved, self._logs, self.s.start, self._query,
                                                 self.state.path)
            self._safe = self._file_start = start
            self._base = start.file.rsplit(".", 1)[0]  # binary logs are base.NNNNNN
            # no state yet: record the start even if nothing is new (a --start current run
            # that found nothing would otherwise start at "now" again next time, skipping
            # every change written in between); an old state without the binlog's identity:
            # record it now, so the next runs can tell a reset binlog
            self._saved = start if saved and saved.get("binlog_identity") else None
            want = saved.get("binlog_identity") if saved else None
            self._want_ident = want if isinstance(want, dict) and want.get("file") == start.file \
                else None
            self._saved_at = time.monotonic()
            self._last_gtid = saved.get("last_gtid") if saved else None
            result = CaptureResult(start=str(start), end=str(start))
            try:
                self._read(start, result)
            except CaptureNeedsOperator:
                # land the whole transactions before the refused event; the state then points
                # just before it, so every run stops there again until an operator acts
                self.txn.clear()
                self._land(result)
                raise
            if self._tx.open and self.txn.count:
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

    def _read(self, start: BinlogPos, result: CaptureResult) -> None:
        """Dump the binlog from ``start``; a file written with the other binlog_checksum
        setting is read again from its start, parsed as written (once per file and setting)."""
        at, checksum = start, None
        switched: set[tuple[BinlogPos, bool]] = set()
        while True:
            reopen = self._read_dump(at, checksum, result)
            if reopen is None:
                return
            if reopen in switched:
                raise unreadable_checksum(reopen[0])
            switched.add(reopen)
            log.info("binlog file %s was written with binlog_checksum=%s: reading it "
                     "again from %s with that setting", reopen[0].file,
                     "CRC32" if reopen[1] else "NONE", reopen[0])
            at, checksum = reopen

    def _open_dump(self, at: BinlogPos, checksum: bool | None) -> Any:
        E = self._ev
        st = stream_class()(
            connection_settings=self._conn_kwargs(),
            server_id=self.s.replica_server_id,
            resume_stream=True, log_file=at.file, log_pos=at.pos,
            blocking=not self.s.until_now,
            only_events=[E.RotateEvent, E.FormatDescriptionEvent, E.MariadbGtidEvent, E.GtidEvent,
                         E.QueryEvent, E.XidEvent, E.XAPrepareEvent, E.HeartbeatLogEvent,
                         E.ExecuteLoadQueryEvent,
                         E.WriteRowsEvent, E.UpdateRowsEvent, E.DeleteRowsEvent],
            only_schemas=sorted(self.s.databases) or None,
            is_mariadb=False,  # position-based resume (field notes); MariaDB still works
            slave_heartbeat=None if self.s.until_now else self.s.heartbeat_s,
            enable_logging=False,
        )
        st.use_checksum = checksum
        return st

    def _read_dump(self, at: BinlogPos, checksum: bool | None,
                   result: CaptureResult) -> tuple[BinlogPos, bool] | None:
        """One dump connection: events until the end, a stop request, or a file to read again
        with the other checksum setting (returned)."""
        stream = self._open_dump(at, checksum)
        dump = DumpState(at=at, cur_file=at.file)
        try:
            for ev in stream:
                pos = BinlogPos(stream.log_file, ev.packet.log_pos)
                boundary = self._on_event(ev, pos, stream, dump, result)
                if dump.reopen is not None:
                    break
                if boundary and not self._tx.open and self._between_txns(result):
                    break
        except Exception as e:  # noqa: BLE001 - server errors of the dump
            err = binlog_error(e)
            if err is None or err[0] != 1236:
                raise
            here = BinlogPos(stream.log_file or at.file, int(stream.log_pos or at.pos))
            if "checksum" in err[1].lower() and not (self._tx.open and self.txn.count):
                # the file has checksums the stream did not announce: read it again with
                # checksums (the server's setting changed since it was written)
                dump.reopen = (here, True)
            else:
                raise dump_refused(err[1], here, self._start, self._server,
                                   self.state.path) from None
        finally:
            stream.close()
        return dump.reopen

    def _between_txns(self, result: CaptureResult) -> bool:
        """After a transaction end or a heartbeat: land a file that has been open long enough
        (or move the saved position on); True when a stop was requested."""
        if self._stop_requested:
            result.stopped_by = "signal"
            return True
        now = time.monotonic()
        if self.writer.is_open:
            if now - self.writer.opened_at >= self.s.flush_interval_s:
                self._land(result)
        elif self._safe != self._saved and now - self._saved_at >= self.s.flush_interval_s:
            self._land(result)  # nothing to land: move the position on
        return False

    # ---- events ----
    def _on_event(self, ev: Any, pos: BinlogPos, stream: Any, dump: DumpState,
                  result: CaptureResult) -> bool:
        """Handle one event; True when it may have ended a transaction (or is a heartbeat)."""
        E, tx = self._ev, self._tx
        if isinstance(ev, E.RotateEvent):
            self._on_rotate(ev, pos, dump)
        elif isinstance(ev, E.FormatDescriptionEvent):
            self._on_format(ev, stream, dump)
        elif isinstance(ev, (E.MariadbGtidEvent, E.GtidEvent)):
            self._on_gtid(ev, pos)
        elif isinstance(ev, (E.WriteRowsEvent, E.UpdateRowsEvent, E.DeleteRowsEvent)):
            tx.open = True
            if tx.xa is not None:  # read, not landed: refused at its end if captured
                if self._wanted(ev.schema, ev.table):
                    tx.xa["tables"].add(f"{ev.schema}.{ev.table}")
            else:
                self._rows(ev, "insert" if isinstance(ev, E.WriteRowsEvent) else
                           "update" if isinstance(ev, E.UpdateRowsEvent) else "delete", pos)
        elif isinstance(ev, E.ExecuteLoadQueryEvent):
            load_statement_check(ev, pos, self._wanted, self._dbs)
        elif isinstance(ev, E.XidEvent):
            self._end_txn(int(ev.timestamp), int(ev.xid), pos, result)
            self._tx = TxnState()
            return True
        elif isinstance(ev, E.XAPrepareEvent) or (
                tx.xa is not None and isinstance(ev, E.QueryEvent)
                and re.match(r"^\s*XA\s+(?:COMMIT|ROLLBACK)\b", ev.query, re.I)):
            if tx.xa is None or tx.xa["tables"]:
                raise xa_refusal(tx.xa, pos)
            # an XA transaction of tables not captured: nothing to land
            self._end_txn(int(ev.timestamp), None, pos, result)
            self._tx = TxnState()
            return True
        elif isinstance(ev, E.QueryEvent):
            return self._on_query(ev, pos, result)
        else:
            return True  # a heartbeat
        return False

    def _on_rotate(self, ev: Any, pos: BinlogPos, dump: DumpState) -> None:
        if self._tx.open and self.txn.count:
            # a reconnect mid-transaction would resume mid-transaction
            raise CaptureError(f"binlog stream restarted inside a transaction at {pos}; "
                               f"stopping at the last commit {self._safe}")
        try:
            self._logs = check_rotate(str(getattr(ev, "next_binlog", "") or ""), self._base,
                                      self._logs, lambda: binary_logs(self._query), pos,
                                      self._safe)
            dump.cur_file = str(ev.next_binlog)
        except CaptureNeedsOperator as bad:
            if int(ev.timestamp or 0) != 0:
                raise
            # the server's own rotate before a file's first event: the file's
            # Format_description (next) tells how to parse it
            dump.bad_start = bad

    def _on_format(self, ev: Any, stream: Any, dump: DumpState) -> None:
        alg = getattr(ev, "checksum_algorithm", None)
        parses = stream.parses_checksum
        if alg in (0, 1) and parses is not None and bool(alg) != parses:
            # this file was written with the other binlog_checksum: read it again from its
            # start, parsed as written
            dump.reopen = (dump.at if dump.first_fd else BinlogPos(dump.cur_file, 4), bool(alg))
            return
        if dump.bad_start is not None:
            raise dump.bad_start
        dump.first_fd = False
        ident = {"created": int(ev.timestamp), "server_id": int(ev.packet.server_id)}
        self._identity[stream.log_file] = ident
        want = self._want_ident
        if want is not None and stream.log_file == want["file"]:
            if (want.get("created"), want.get("server_id")) != (ident["created"],
                                                                ident["server_id"]):
                raise other_binlog(stream.log_file, self._server, self._start, self.state.path,
                                   want, ident)
            self._want_ident = None

    def _on_gtid(self, ev: Any, pos: BinlogPos) -> None:
        self._last_gtid, self._tx = gtid_txn(ev, pos, isinstance(ev, self._ev.MariadbGtidEvent))

    def _on_query(self, ev: Any, pos: BinlogPos, result: CaptureResult) -> bool:
        tx = self._tx
        marker, name = query_marker(ev.query)
        if marker == "begin":
            tx.open = True
            return False
        if marker == "savepoint" and tx.open:
            self.txn.savepoint(name or "")
            return False
        if marker == "rollback_to" and tx.open:
            # ROLLBACK TO sp: logged when the transaction also changed a non-transactional
            # table; the transactional rows after sp go
            self.txn.rollback_to(name or "")
            return False
        if marker in ("rollback", "commit"):
            # non-transactional engines: their changes stay on ROLLBACK
            if marker == "rollback":
                self.txn.rollback()
            self._end_txn(int(ev.timestamp), None, pos, result)
            tx.open = False
            return True
        if tx.xa is not None:
            return False  # XA START / XA END of an XA transaction
        statement_dml_check(schema_of(ev), ev.query, pos, self._wanted, self._dbs)
        self._ddl(ev, pos, ev.query)
        if not tx.open:
            self._end_txn(int(ev.timestamp), None, pos, result)
        return True


def capture(settings: CaptureSettings) -> CaptureResult:
    """Run one capture (in-process API used by tests and the CLI)."""
    return MaxwellCapture(settings).run()

