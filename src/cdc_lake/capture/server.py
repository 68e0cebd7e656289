"""What the capture asks the source server before reading: is it fit for row capture, which
binary logs it holds, and where this run starts (``docs/capture.md``).

    from cdc_lake.capture.server import check_server, start_position
    check_server(query, "db1:3306")            # CaptureConfigError naming every setting to fix
    pos = start_position(saved, logs, "earliest", query, state_file)

``query(sql)`` runs one statement on the control connection and returns its rows.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from cdc_lake.capture.state import BinlogPos, CaptureConfigError, CaptureNeedsOperator

log = logging.getLogger("cdc_lake.capture")

Query = Callable[..., list[tuple[Any, ...]]]


def check_server(query: Query, server: str) -> dict[str, Any]:
    """The server's binlog settings; every one that row capture cannot work with is named."""
    row = query("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, "
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
        raise CaptureConfigError(f"{server}: server not suitable for row capture: "
                                 + "; ".join(problems))
    return info


def binary_logs(query: Query) -> list[str] | None:
    """``SHOW BINARY LOGS`` (oldest first), or None without the privilege to list them."""
    import pymysql

    try:
        return [r[0] for r in query("SHOW BINARY LOGS")]
    except pymysql.err.MySQLError as e:
        log.warning("cannot list binary logs (%s); grant BINLOG MONITOR to check positions", e)
        return None


def reset_text() -> str:
    """What to do when the binlog behind a saved position was reset or is another server's."""
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


def start_position(saved: dict[str, Any] | None, logs: list[str] | None, start: str,
                   query: Query, state_file: Path) -> BinlogPos:
    """The saved position (checked against the server's binary logs), else ``--start``:
    ``earliest``, ``current`` or ``FILE:POS``."""
    if saved is not None:
        pos = BinlogPos(str(saved["log_file"]), int(saved["log_pos"]))
        if logs is not None and pos.file not in logs:
            first = BinlogPos(logs[0], 4) if logs else None
            last = BinlogPos(logs[-1], 4) if logs else None
            now = f"{first.file if first else '-'} .. {last.file if last else '-'}"
            if last is None or pos.index > last.index or \
                    pos.file.rsplit(".", 1)[0] != last.file.rsplit(".", 1)[0]:
                raise CaptureNeedsOperator(
                    f"saved position {pos} ({state_file}) is not in this server's "
                    f"binary logs ({now}): {reset_text()}")
            raise CaptureNeedsOperator(
                f"saved position {pos} ({state_file}) is gone from the server (binary "
                f"logs now: {now}): the changes between it and {now.split(' ')[0]} were "
                "purged before they were captured and the lake misses them. Rebuild the "
                "lake's tables from a snapshot (docs/capture.md, \"Refused binlog events\"); "
                "to go on without them, move the state file aside and start with --start "
                "current (later positions sort after the landed ones), then full-refresh "
                "the pipeline once a snapshot is landed. Keep binary logs longer "
                "(binlog_expire_logs_seconds) than the capture can be down")
        return pos
    start = start.strip()
    if start == "earliest":
        if not logs:
            raise CaptureConfigError("cannot find the earliest binary log (SHOW BINARY LOGS "
                                     "needs BINLOG MONITOR); pass --start FILE:POS")
        return BinlogPos(logs[0], 4)
    if start == "current":
        import pymysql

        try:
            row = query("SHOW MASTER STATUS")
        except pymysql.err.MySQLError as e:
            raise CaptureConfigError(f"SHOW MASTER STATUS failed ({e}); grant BINLOG MONITOR "
                                     "or pass --start FILE:POS") from None
        if not row:
            raise CaptureConfigError("binary logging is off")
        return BinlogPos(str(row[0][0]), int(row[0][1]))
    return BinlogPos.parse(start)
