"""JSON encoding of MySQL binlog values, following Maxwell's conventions.

``converter(column)`` returns how one column's binlog value becomes a JSON value (exact
DECIMAL text, FLOAT as its shortest float32 text, DATETIME/TIME with the column's fractional
digits, BINARY(n) padded back to n bytes and base64-encoded, SET members in definition order);
``enc`` writes Python values as JSON text without re-encoding pre-encoded numbers.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import ipaddress
import json
import struct
import uuid
from typing import Any, Callable


_EPOCH = dt.datetime(1970, 1, 1)


class _Raw(str):
    """Pre-encoded JSON number text (exact DECIMAL)."""


def json_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def enc(v: Any) -> str:
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
        return "[" + ",".join(enc(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{json_str(str(k))}:{enc(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v), ensure_ascii=False)


def _fmt_datetime(v: dt.datetime, fsp: int) -> str:
    s = f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:{v.second:02d}"
    if fsp > 0:
        s += "." + f"{v.microsecond:06d}"[:fsp]
    return s


def _fmt_time(v: dt.timedelta, fsp: int, negative_fraction_fix: bool = False) -> str:
    us = v.days * 86_400_000_000 + v.seconds * 1_000_000 + v.microseconds
    sign = "-" if us < 0 else ""
    us = abs(us)
    secs, frac = divmod(us, 1_000_000)
    if negative_fraction_fix and sign and frac:
        # mysql-replication 1.0.17 reads a negative TIME2's fraction as its complement
        # (-12:30:00.25 arrives as -12:30:00.75, the whole seconds right): checked against
        # SELECT for TIME(1)..TIME(6) in tests/test_capture_values.py
        frac = 1_000_000 - frac
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


def converter(col: Any) -> Callable[[Any], Any]:
    """How one binlog column value becomes a JSON value (Maxwell conventions)."""
    from pymysqlreplication.constants import FIELD_TYPE as T

    t = col.type
    fsp = int(getattr(col, "fsp", 0) or 0)
    if t in (T.NEWDECIMAL, T.DECIMAL):
        return lambda v: _Raw(format(v, "f"))
    if t == T.FLOAT:
        return _float32_text
    if t in (T.TIMESTAMP, T.TIMESTAMP2):
        # naive UTC (field notes). TIMESTAMP starts at 1970-01-01 00:00:01 UTC: the epoch itself
        # is the zero value '0000-00-00 00:00:00' (allowed without NO_ZERO_DATE), null like the
        # zero DATE/DATETIME the binlog reader already gives as null
        return lambda v: None if v == _EPOCH else _fmt_datetime(v, fsp)
    if t in (T.DATETIME, T.DATETIME2):  # naive, as stored
        return lambda v: _fmt_datetime(v, fsp)
    if t in (T.DATE, T.NEWDATE):
        return lambda v: v.isoformat()
    if t in (T.TIME, T.TIME2):
        return lambda v: _fmt_time(v, fsp, negative_fraction_fix=t == T.TIME2)
    if t == T.YEAR:  # the reader adds 1900 to the stored byte; YEAR 0000 (stored 0) is 0
        return lambda v: 0 if v == 1900 else v
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
        if pad and v == "":  # BINARY(n) of only zero bytes: the reader gives '' (no bytes)
            v = b""
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



def _inet6_text(b: bytes) -> str:
    """INET6 as MariaDB prints it (inet_ntop): IPv4-mapped ``::ffff:1.2.3.4`` and
    IPv4-compatible ``::1.2.3.4`` with the last 32 bits dotted (Python prints them in hex)."""
    addr = ipaddress.IPv6Address(b)
    words = [int.from_bytes(b[i:i + 2], "big") for i in range(0, 16, 2)]
    run = 0
    while run < 8 and words[run] == 0:
        run += 1
    if run == 6 or (run == 5 and words[5] == 0xFFFF):  # the leading zero run is the longest
        return ("::ffff:" if run == 5 else "::") + str(ipaddress.IPv4Address(b[12:]))
    return addr.compressed


# MariaDB's own data types arrive as their stored bytes (BINARY(16) / BINARY(4)); landed as the
# text SELECT shows. The binlog stores UUID in text order (checked on 10.11 with v1 and v4 ids).
_SPECIAL_TEXT: dict[str, Callable[[bytes], str]] = {
    "uuid": lambda b: str(uuid.UUID(bytes=b)),
    "inet4": lambda b: str(ipaddress.IPv4Address(b)),
    "inet6": _inet6_text,
}


_SPECIAL_SIZE = {"uuid": 16, "inet4": 4, "inet6": 16}
_BINARY_TYPES = ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")


def _binlog_binary(col: Any) -> bool:
    """Whether the binlog's own metadata says the column held bytes: a string or blob type
    with the binary character set (not MySQL's binary ``JSON``, nor geometry)."""
    from pymysqlreplication.constants import FIELD_TYPE as T

    return getattr(col, "character_set_name", None) == "binary" and getattr(col, "type", None) in (
        T.STRING, T.VAR_STRING, T.VARCHAR, T.BLOB, T.TINY_BLOB, T.MEDIUM_BLOB, T.LONG_BLOB)


def special_converter(col: Any, today: tuple[str, str | None] | None) -> Callable[[Any], Any] | None:
    """The converter of one of MariaDB's own types (``uuid``, ``inet4``, ``inet6``: today's
    ``information_schema.COLUMNS.DATA_TYPE`` in ``today``), or None. Only when the binlog's
    column is what that type is stored as (a binary string of 16 or 4 bytes): a row written
    while the column was still ``CHAR(36)`` / ``VARCHAR`` lands its text as it was (the
    converter crashed on it: tester)."""
    from pymysqlreplication.constants import FIELD_TYPE as T

    data_type = today[0] if today else ""
    fn = _SPECIAL_TEXT.get(data_type)
    size = _SPECIAL_SIZE.get(data_type)
    if fn is None or getattr(col, "type", None) != T.STRING or not _binlog_binary(col) \
            or int(getattr(col, "max_length", 0) or 0) != size:
        return None

    def conv(v: Any) -> Any:
        if isinstance(v, str):
            v = v.encode("latin-1") if v else b""
        return fn(v.ljust(size, b"\x00"))  # the binlog drops trailing zero bytes

    return conv


def binary_now_text(col: Any, today: tuple[str, str | None] | None) -> str | None:
    """Why a binlog column of bytes cannot be landed as the table reads today, or None: the
    column's type changed since the event was written, from bytes (``BINARY``/``VARBINARY``/
    ``BLOB``, or ``UUID``/``INET*``, which the binlog cannot tell apart) to text or to one of
    MariaDB's own types of another size. Its old values would land as base64 (or a made-up
    address) while later rows land text (a UUID column changed to ``CHAR(36)`` landed
    ``Ej5FZ+ibEtOkVkJmFBdAAA==``: tester). Bytes of the new type's size are landed in it:
    ``BINARY(16)`` -> ``UUID`` as the text the table shows now; the binlog cannot tell a
    ``UUID`` <-> ``INET6`` change from that (MariaDB sets those values NULL; docs/capture.md)."""
    if today is None or not _binlog_binary(col):
        return None
    data_type, charset = today
    size = int(getattr(col, "max_length", 0) or 0)
    if data_type in _SPECIAL_SIZE:
        return None if special_converter(col, today) is not None else (
            f"now {data_type.upper()}, written as {size} bytes")
    if charset is not None and charset != "binary" and data_type not in _BINARY_TYPES:
        return f"now {data_type.upper()} (CHARACTER SET {charset}), written as bytes"
    return None
