"""Decoders for MariaDB/MySQL character sets, as the binlog reader needs them.

mysql-replication 1.0.17 decodes a text column with the Python codec named like the column's
character set (through PyMySQL's table) and, when Python has no such codec, returns the raw
bytes, which the capture would land as base64 text. Several names mean something else in
Python, or nothing:

* ``latin1`` is MariaDB's cp1252 **with** the five bytes cp1252 leaves undefined (0x81, 0x8D,
  0x8F, 0x90, 0x9D) mapped to the same code points; Python's strict cp1252 fails on them, so
  one such value stopped every later capture run at that event;
* ``utf16``, ``utf32`` and ``ucs2`` are big-endian without a byte-order mark (Python's
  ``utf16``/``utf32`` are little-endian on this machine: garbled text or a decode failure);
  ``utf16le`` has no Python codec of that name;
* ``macce`` is Python's ``mac_latin2``; ``eucjpms`` is decoded as ``euc_jp`` (the Microsoft
  extension's extra characters fail loudly, they are not guessed).

``swe7``, ``dec8``, ``hp8``, ``keybcs2``, ``armscii8`` and ``geostd8`` have no decoder here:
:func:`encoding_for` returns None and the capture stops naming the column (exit 2) instead of
landing base64 text.

Example::

    install()                      # once, before reading the binlog
    encoding_for("utf16")          # 'utf-16-be'
    encoding_for("swe7")           # None
"""

from __future__ import annotations

import codecs
from typing import Any

_LATIN1 = "cdc_lake_mariadb_latin1"
# keys: the names mysql-replication gives columns (its Charset.encoding: MariaDB's latin1 is
# already called cp1252 there, utf8mb4 utf8), and MariaDB's own names
_MAP = {"latin1": _LATIN1, "cp1252": _LATIN1, "utf16": "utf-16-be", "utf32": "utf-32-be", "ucs2": "utf-16-be",
        "utf16le": "utf-16-le", "macce": "mac_latin2", "eucjpms": "euc_jp"}
UNSUPPORTED = frozenset({"swe7", "dec8", "hp8", "keybcs2", "armscii8", "geostd8"})


def _latin1_codec() -> codecs.CodecInfo:
    table = []
    for b in range(256):
        try:
            table.append(bytes([b]).decode("cp1252"))
        except UnicodeDecodeError:
            table.append(chr(b))  # MariaDB: the byte's own code point (U+0081 ...)
    decoding = "".join(table)
    encoding = codecs.charmap_build(decoding)
    return codecs.CodecInfo(
        name=_LATIN1,
        encode=lambda s, errors="strict": codecs.charmap_encode(s, errors, encoding),
        decode=lambda b, errors="strict": codecs.charmap_decode(b, errors, decoding))


def _search(name: str) -> codecs.CodecInfo | None:
    return _latin1_codec() if name == _LATIN1 else None


codecs.register(_search)


def encoding_for(charset: str | None) -> str | None:
    """The Python codec for a MariaDB character set name; None when there is none here."""
    if charset is None:
        return "utf-8"
    name = charset.lower()
    if name in UNSUPPORTED:
        return None
    enc = _MAP.get(name)
    if enc is None:
        from pymysql.charset import charset_by_name

        cs = charset_by_name(name)
        enc = cs.encoding if cs else name
    try:
        codecs.lookup(enc)
    except LookupError:
        return None
    return enc


def install() -> None:
    """Make mysql-replication decode text columns with :func:`encoding_for` (a name it cannot
    look up still gives the raw bytes; :func:`unsupported_text_columns` finds those first)."""
    from pymysqlreplication.row_event import RowsEvent

    def charset_to_encoding(name: str) -> str:
        return encoding_for(name) or name

    RowsEvent.charset_to_encoding = staticmethod(charset_to_encoding)  # type: ignore[method-assign]


def unsupported_text_columns(columns: Any) -> list[tuple[str, str]]:
    """``(column, charset)`` of text columns whose character set has no decoder here."""
    from pymysqlreplication.constants import FIELD_TYPE as T

    text = {T.STRING, T.VARCHAR, T.VAR_STRING, T.BLOB, T.TINY_BLOB, T.MEDIUM_BLOB, T.LONG_BLOB}
    out = []
    for c in columns:
        cs = getattr(c, "character_set_name", None)
        if c.type in text and cs and cs.lower() != "binary" and encoding_for(cs) is None:
            out.append((str(c.name), cs))
    return out
