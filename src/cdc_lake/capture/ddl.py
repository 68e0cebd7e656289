"""Which schema change a DDL statement is, as Maxwell records it (``classify_ddl``)."""

from __future__ import annotations

import re
from typing import Any


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



_DML_WORD = re.compile(r"^(?:INSERT|REPLACE|UPDATE|DELETE|LOAD\s+DATA|LOAD\s+XML)\b", re.I)
_DML_TARGETS: list[re.Pattern[str]] = [
    re.compile(rf"^(?:INSERT|REPLACE)\s+(?:(?:LOW_PRIORITY|DELAYED|HIGH_PRIORITY|IGNORE)\s+)*"
               rf"(?:INTO\s+)?{_QNAME}", re.I | re.S),
    re.compile(rf"^UPDATE\s+(?:(?:LOW_PRIORITY|IGNORE)\s+)*{_QNAME}\s+SET\b", re.I | re.S),
    re.compile(rf"^DELETE\s+(?:(?:LOW_PRIORITY|QUICK|IGNORE)\s+)*FROM\s+{_QNAME}"
               rf"(?:\s*$|\s+(?:WHERE|ORDER|LIMIT|RETURNING|PARTITION|FOR)\b)", re.I | re.S),
    re.compile(rf"^LOAD\s+(?:DATA|XML)\b.*?\bINTO\s+TABLE\s+{_QNAME}", re.I | re.S),
]


def statement_dml(sql: str, schema: str) -> list[tuple[str, str | None]] | None:
    """A row change logged as a *statement* (``binlog_format=STATEMENT``/``MIXED``, also a
    session override): ``[(database, table)]`` it writes, ``table`` None when the statement's
    target cannot be told (multi-table UPDATE/DELETE); None for anything that is not DML
    (BEGIN, COMMIT, DDL, SAVEPOINT, XA ...). Comments (``/* */``, ``-- ``, ``#``) are skipped
    and ``/*! ... */`` read as the server does."""
    text = _strip_comments(sql).lstrip("( \t\r\n")
    if not _DML_WORD.match(text):
        return None
    for pattern in _DML_TARGETS:
        m = pattern.match(text)
        if m:
            a, b = m.groups()[-2], m.groups()[-1]
            return [_qualified(a, b, schema)]
    return [(schema, None)]
