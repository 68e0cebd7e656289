"""Binlog events the capture refuses to land (``CaptureNeedsOperator``, exit 3: every retry
would stop at the same event) and what each message tells the operator to do
(``docs/capture.md``, "Refused binlog events").

Nothing of a refused transaction is landed; the state keeps the last transaction end before it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from cdc_lake.capture.binlog_stream import RESNAPSHOT
from cdc_lake.capture.ddl import statement_dml
from cdc_lake.capture.server import reset_text
from cdc_lake.capture.state import BinlogPos, CaptureNeedsOperator

Wanted = Callable[[Any, Any], bool]


def check_rotate(name: str, base: str, logs: list[str] | None,
                 relist: Callable[[], list[str] | None], pos: BinlogPos,
                 safe: BinlogPos) -> list[str] | None:
    """A rotate's next file must be one of the server's binary logs (base.NNNNNN): a name
    like ``mariadb-bin.00`` means the event was parsed with the wrong checksum length.
    Returns the (re-listed, when ``name`` is new) binary logs."""
    ok = bool(re.fullmatch(re.escape(base) + r"\.\d{6,}", name))
    if ok and logs is not None and name not in logs:
        logs = relist()
        ok = logs is None or name in logs
    if not ok:
        raise CaptureNeedsOperator(
            f"the binlog at {pos} rotates to {name!r}, which is not one of the server's "
            f"binary logs ({base}.NNNNNN): the file was most likely written with another "
            "binlog_checksum setting (NONE vs CRC32) than mysql-replication parsed it with, "
            f"so its events cannot be trusted. Nothing after {safe} was recorded. "
            "Check the file with mariadb-binlog; " + RESNAPSHOT)
    return logs


def other_binlog(file: str, server: str, start: BinlogPos, state_file: Path,
                 want: dict[str, Any], found: dict[str, int]) -> CaptureNeedsOperator:
    """The file the saved position names was written at another time or by another server."""
    return CaptureNeedsOperator(
        f"{file} on {server} is not the binlog file the saved position {start} ({state_file}) "
        f"belongs to (written at {want.get('created')} by server id {want.get('server_id')}; "
        f"now: {found['created']} by server id {found['server_id']}): {reset_text()}")


def type_changed_since(schema: str, table: str, changed: list[tuple[str, str]],
                       pos: BinlogPos) -> CaptureNeedsOperator:
    """A row event of a column that held bytes when it was written and holds text (or another
    of MariaDB's own types) today (``maxwell_json.binary_now_text``)."""
    cols = "; ".join(f"{c!r} ({why})" for c, why in changed)
    return CaptureNeedsOperator(
        f"{schema}.{table}: the row event at binlog position {pos} was written before the "
        f"type of column(s) {cols} changed (an ALTER TABLE, or the table dropped and created "
        "again). The binlog holds the old bytes, "
        "and the capture cannot tell how they read in the new type (a UUID changed to CHAR(36) "
        "would land as base64 while later rows land text). Nothing of this transaction was "
        "landed; the capture stops here every run. Rebuild the table from a snapshot (its "
        "rows as they are now, docs/capture.md \"Refused binlog events\"), or leave the table "
        "out (--tables / --databases)")


def partial_row_image(schema: str, table: str, kind: str, label: str, missing: list[str],
                      pos: BinlogPos) -> CaptureNeedsOperator:
    return CaptureNeedsOperator(
        f"{schema}.{table}: the {kind} {label}image at binlog position {pos} does not carry "
        f"every column (missing: {', '.join(map(str, missing))}): it was written with "
        "binlog_row_image MINIMAL or NOBLOB (a session or an earlier global setting), not FULL; "
        "landing it would put NULL in place of those values. Nothing of this transaction was "
        f"landed; the capture stops here every run. {RESNAPSHOT}")


def statement_dml_check(schema: str, sql: str, pos: BinlogPos, wanted: Wanted,
                        databases: set[str]) -> None:
    """Refuse a row change logged as a statement on a captured table (its rows are not in
    the binlog; skipping it would lose them silently)."""
    targets = statement_dml(sql, schema)
    if not targets:
        return
    hit = []
    for db, table in targets:
        if table is not None:
            if wanted(db, table):
                hit.append(f"{db}.{table}")
        elif wanted(db, None) or not databases or any(d in sql.lower() for d in databases):
            hit.append(f"{db}.<tables of a multi-table statement>")
    if hit:
        text = " ".join(sql.split())
        raise CaptureNeedsOperator(
            f"{', '.join(hit)}: the change at binlog position {pos} was logged as a "
            f"statement, not as rows ({text[:200]!r}): it was written with binlog_format "
            "STATEMENT or MIXED (a session or an earlier global setting); the capture only "
            "reads row events and would lose it. Nothing of this transaction was landed; "
            f"the capture stops here every run. {RESNAPSHOT}")


def load_statement_check(ev: Any, pos: BinlogPos, wanted: Wanted, databases: set[str]) -> None:
    """LOAD DATA logged as a statement (Execute_load_query event): its rows are not in the
    binlog."""
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
        statement_dml_check(schema, sql, pos, wanted, databases)
    elif not sql:
        raise CaptureNeedsOperator(
            f"a LOAD DATA statement at binlog position {pos} was logged as a statement "
            "(binlog_format STATEMENT or MIXED), its rows are not in the binlog. "
            + RESNAPSHOT)


def xa_refusal(xa: dict[str, Any] | None, pos: BinlogPos) -> CaptureNeedsOperator:
    """An XA transaction that changes a captured table (``xa``: where it started, its GTID and
    tables; None when its start was before this run's position)."""
    tables = ", ".join(sorted(xa["tables"])) if xa else "tables unknown"
    at = xa["at"] if xa else pos
    gtid = f" (GTID {xa['gtid']})" if xa and xa.get("gtid") else ""
    return CaptureNeedsOperator(
        f"XA transaction at binlog position {at}{gtid} changes {tables}: XA transactions "
        "are not supported (its rows are logged at XA PREPARE, its outcome later). Nothing "
        f"of it was landed; the capture stops here every run. Use ordinary transactions for "
        f"these tables, or leave them out (--tables / --databases); then rebuild the lake's "
        f"copy from a snapshot and capture from after {pos} with a new state file "
        "(docs/capture.md, \"Refused binlog events\")")


def dump_refused(text: str, here: BinlogPos, start: BinlogPos, server: str,
                 state_file: Path) -> CaptureNeedsOperator:
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
        f"{server}: binlog dump from {here} failed: {text} -- {why}. "
        f"A state file ({state_file}) only ever holds transaction ends, so it was "
        f"edited, or {reset_text()}")


def unreadable_checksum(at: BinlogPos) -> CaptureNeedsOperator:
    return CaptureNeedsOperator(
        f"binlog file {at.file} (read from {at}) cannot be read with or without CRC32 "
        "checksums; it was written with another binlog_checksum than the server uses now and "
        f"mysql-replication cannot parse it. Check the file with mariadb-binlog; {RESNAPSHOT}")
