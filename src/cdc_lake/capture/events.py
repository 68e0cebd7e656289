"""Binlog events as the capture's reader tells them apart: the event classes it asks the dump
for, MariaDB's GTID flags (standalone, XA), the transaction markers in query events (``BEGIN``,
``SAVEPOINT``, ``ROLLBACK [TO]``) and the reader's state per transaction and per dump connection.

Example::

    E = event_classes()
    isinstance(ev, E.XidEvent)                      # a transaction's commit
    SAVEPOINT.match("SAVEPOINT `a b`")               # -> savepoint_name("`a b`") == "a b"
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cdc_lake.capture.state import BinlogPos

# MariaDB GTID event flags (sql/log_event.h)
FL_STANDALONE = 1
FL_PREPARED_XA = 64
FL_COMPLETED_XA = 128


@dataclass
class TxnState:
    """Where the reader is between events: inside a transaction (BEGIN, or a MariaDB GTID that
    is not standalone) and, for an XA transaction, where it began and what it changes."""
    open: bool = False
    xa: dict[str, Any] | None = None


@dataclass
class DumpState:
    """One binlog dump connection, started at ``at``."""
    at: BinlogPos
    cur_file: str
    first_fd: bool = True
    bad_start: Exception | None = None  # a rotate the next Format_description must confirm
    reopen: tuple[BinlogPos, bool] | None = None  # read from here again with checksums on/off


def event_classes() -> Any:
    import pymysqlreplication.event as e
    import pymysqlreplication.row_event as r

    class E:
        RotateEvent, FormatDescriptionEvent = e.RotateEvent, e.FormatDescriptionEvent
        MariadbGtidEvent, GtidEvent, QueryEvent = e.MariadbGtidEvent, e.GtidEvent, e.QueryEvent
        XidEvent, XAPrepareEvent, HeartbeatLogEvent = e.XidEvent, e.XAPrepareEvent, e.HeartbeatLogEvent
        ExecuteLoadQueryEvent = e.ExecuteLoadQueryEvent
        WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent = (r.WriteRowsEvent, r.UpdateRowsEvent,
                                                            r.DeleteRowsEvent)
    return E


def schema_of(ev: Any) -> str:
    """A query event's default database."""
    return ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) \
        else str(ev.schema or "")


ROLLBACK = re.compile(r"^ROLLBACK(?:\s+WORK)?(?:\s+TO\s+(?:SAVEPOINT\s+)?(?P<name>.+))?$",
                       re.IGNORECASE | re.DOTALL)
SAVEPOINT = re.compile(r"^SAVEPOINT\s+(?P<name>.+)$", re.IGNORECASE | re.DOTALL)


def savepoint_name(text: str) -> str:
    """A savepoint name as written (`` `a b` `` or ``a``) -> its name (case-insensitive)."""
    text = text.strip()
    if text.startswith("`") and text.endswith("`"):
        text = text[1:-1].replace("``", "`")
    return text.lower()


def gtid_txn(ev: Any, pos: BinlogPos, mariadb: bool) -> tuple[str, TxnState]:
    """A GTID event's id and the transaction it opens: a MariaDB GTID that is not standalone
    opens one (no ``BEGIN`` follows); a prepared or completed XA transaction is tracked from
    ``pos`` (its tables are collected, its end refused if any is captured)."""
    gtid = str(getattr(ev, "gtid", None) or "")
    flags = int(getattr(ev, "flags", 0) or 0)
    xa = None
    if flags & (FL_PREPARED_XA | FL_COMPLETED_XA):
        xa = {"at": pos, "gtid": gtid, "tables": set(), "completed": bool(flags & FL_COMPLETED_XA)}
    return gtid, TxnState(open=mariadb and not flags & FL_STANDALONE, xa=xa)


def query_marker(query: str) -> tuple[str, str | None]:
    """What a query event's text marks: ``("begin", None)``, ``("savepoint", name)``,
    ``("rollback_to", name)``, ``("rollback", None)``, ``("commit", None)`` or
    ``("statement", None)`` (DDL, or DML logged as a statement)."""
    sql = query.strip().rstrip(";").strip()
    word = sql.split(None, 1)[0].upper() if sql else ""
    if word == "BEGIN":
        return "begin", None
    sp = SAVEPOINT.match(sql)
    if sp:
        return "savepoint", savepoint_name(sp.group("name"))
    rb = ROLLBACK.match(sql)
    if rb:
        return ("rollback_to", savepoint_name(rb.group("name"))) if rb.group("name") \
            else ("rollback", None)
    if word == "COMMIT" and len(sql.split()) == 1:
        return "commit", None
    return "statement", None
