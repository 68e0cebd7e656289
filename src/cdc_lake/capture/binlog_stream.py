"""The binlog stream as the capture reads it: python-mysql-replication's ``BinLogStreamReader``
parsing each file with the checksum setting it was written with, and the checks of an event's
completeness (a full row image) and of the server's errors.

Example::

    stream = stream_class()(connection_settings=..., server_id=..., resume_stream=True, ...)
    full_bitmap(event.columns_present_bitmap, event.number_of_columns)   # False: not FULL
"""

from __future__ import annotations

from typing import Any

RESNAPSHOT = ("The lake's copy of the table(s) cannot be corrected from this binlog: make every "
               "writer log full row images (binlog_format=ROW and binlog_row_image=FULL, "
               "globally and with no SET SESSION overrides), then rebuild the table(s) from a "
               "snapshot (docs/capture.md, \"Refused binlog events\")")


def full_bitmap(bitmap: bytes | None, ncols: int) -> bool:
    """Whether a rows event's columns-present bitmap has a bit for each of its ``ncols``."""
    if bitmap is None:
        return True
    full, rest = divmod(int(ncols), 8)
    if any(b != 0xFF for b in bitmap[:full]):
        return False
    return rest == 0 or (bitmap[full] & ((1 << rest) - 1)) == (1 << rest) - 1


def binlog_error(e: Exception) -> tuple[int, str] | None:
    """(code, message) of a server error the binlog dump ended with, else None."""
    args = getattr(e, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):
        return args[0], str(args[1])
    return None


def stream_class() -> Any:
    """``BinLogStreamReader`` that parses with the checksum setting of the *file* being read
    (``use_checksum``: None = the server's current ``binlog_checksum``, as the library does).
    mysql-replication takes the current global setting for the whole stream; a file written
    before ``SET GLOBAL binlog_checksum`` changed it would be misparsed (4 bytes short or long
    per event: truncated statements, rotate names like ``mariadb-bin.00``)."""
    from pymysqlreplication import BinLogStreamReader

    class _Stream(BinLogStreamReader):  # type: ignore[misc]
        use_checksum: bool | None = None

        def _BinLogStreamReader__checksum_enabled(self) -> bool:  # noqa: N802 - library hook
            if self.use_checksum is None:
                return bool(BinLogStreamReader._BinLogStreamReader__checksum_enabled(self))
            if self.use_checksum:
                # the library announces @@global.binlog_checksum, which may be NONE by now; the
                # server then sends the following files' events differently from how they are
                # parsed: announce CRC32, the setting the file being read was written with
                conn = self._stream_connection
                make_cursor = conn.cursor

                def cursor(*a: Any, **kw: Any) -> Any:
                    cur = make_cursor(*a, **kw)
                    execute = cur.execute

                    def run(sql: str, args: Any = None) -> Any:
                        if sql.replace(" ", "").startswith("SET@master_binlog_checksum="):
                            sql, args = "SET @master_binlog_checksum = 'CRC32'", None
                        return execute(sql, args)

                    cur.execute = run
                    return cur

                conn.cursor = cursor
            return self.use_checksum

        @property
        def parses_checksum(self) -> bool | None:
            return getattr(self, "_BinLogStreamReader__use_checksum", None)

    return _Stream
