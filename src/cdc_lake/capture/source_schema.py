"""What the capture reads from the source server's ``information_schema`` about a table, cached
per table until the next DDL (:meth:`SourceSchema.clear`): primary key, whether ROLLBACK undoes
its changes, system versioning, each column's type and character set. It is today's schema: events
written before a DDL are read with it too (docs/capture.md, "Limits").

Example::

    schema = SourceSchema(query)                  # query(sql, args) -> rows
    schema.primary_key_columns("shop", "orders", fallback=None)   # ['id']
    schema.transactional("shop", "audit")         # False for MyISAM / Aria
    schema.versioned("shop", "prices", ["id", "row_end"])   # ('row_end', ['row_end', 'row_start'])
"""

from __future__ import annotations

from typing import Any, Callable

def is_current(row_end: Any) -> bool:
    """Whether a system-versioned row's end marks it current: the largest TIMESTAMP(6)
    (2038-01-19 03:14:07.999999; 2106-02-07 06:28:15.999999 on MariaDB 11.5+) or, with
    transaction-precise versioning, the largest BIGINT UNSIGNED."""
    if isinstance(row_end, int):
        return row_end == 2**64 - 1
    return isinstance(row_end, str) and row_end.startswith(
        ("2038-01-19 03:14:07.999999", "2106-02-07 06:28:15.999999"))



class SourceSchema:
    def __init__(self, query: Callable[..., list[tuple[Any, ...]]]) -> None:
        self._query = query
        self._pk: dict[tuple[str, str], list[str] | None] = {}
        self._engine: dict[tuple[str, str], bool] = {}
        self._types: dict[tuple[str, str], dict[str, tuple[str, str | None]]] = {}
        self._versioned: dict[tuple[str, str], tuple[str, list[str]] | None] = {}

    def clear(self) -> None:
        """After a DDL: look every table up again."""
        for cache in (self._pk, self._engine, self._types, self._versioned):
            cache.clear()

    def primary_key_columns(self, db: str, table: str, fallback: Any) -> list[str]:
        key = (db, table)
        if key not in self._pk:
            rows = self._query(
                "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA=%s "
                "AND TABLE_NAME=%s AND CONSTRAINT_NAME='PRIMARY' ORDER BY ORDINAL_POSITION",
                (db, table))
            self._pk[key] = [r[0] for r in rows] or None
        pk = self._pk[key]
        if pk is None:
            # table gone (or no PK) today: use the binlog's own metadata of that moment
            if isinstance(fallback, str):
                return [fallback] if fallback else []
            return list(fallback or ())
        return pk

    def transactional(self, db: str, table: str) -> bool:
        """Whether a ROLLBACK undoes the table's changes (its engine's TRANSACTIONS); a table
        gone since counts as transactional (InnoDB, the default)."""
        key = (db, table)
        if key not in self._engine:
            rows = self._query(
                "SELECT e.TRANSACTIONS FROM information_schema.TABLES t JOIN "
                "information_schema.ENGINES e ON e.ENGINE = t.ENGINE WHERE t.TABLE_SCHEMA=%s "
                "AND t.TABLE_NAME=%s", (db, table))
            self._engine[key] = not rows or str(rows[0][0]).upper() != "NO"
        return self._engine[key]

    def versioned(self, db: str, table: str, pk_cols: list[str]) -> tuple[str, list[str]] | None:
        """For a system-versioned table: ``(row-end column, columns SELECT * does not show)``;
        None for other tables. The row end is the primary key's last column (MariaDB appends it
        to every unique key); the implicit ``row_start``/``row_end`` are invisible and not in
        ``information_schema.COLUMNS``, explicit period columns are and stay."""
        key = (db, table)
        if key not in self._versioned:
            found = None
            rows = self._query("SELECT TABLE_TYPE FROM information_schema.TABLES WHERE "
                               "TABLE_SCHEMA=%s AND TABLE_NAME=%s", (db, table))
            if rows and str(rows[0][0]).upper() == "SYSTEM VERSIONED" and pk_cols:
                cols = {str(r[0]) for r in self._query(
                    "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=%s "
                    "AND TABLE_NAME=%s", (db, table))}
                found = (pk_cols[-1], [c for c in (pk_cols[-1], "row_start") if c not in cols])
            self._versioned[key] = found
        return self._versioned[key]

    def column_types(self, db: str, table: str) -> dict[str, tuple[str, str | None]]:
        """Today's ``(DATA_TYPE, CHARACTER_SET_NAME)`` per column (the character set is None for
        non-text types), from ``information_schema.COLUMNS`` (like the key columns: refreshed
        after DDL). The rows converter compares them with the binlog's own column types
        (:func:`cdc_lake.capture.maxwell_json.special_converter`, ``binary_now_text``)."""
        key = (db, table)
        if key not in self._types:
            rows = self._query(
                "SELECT COLUMN_NAME, DATA_TYPE, CHARACTER_SET_NAME FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA=%s AND TABLE_NAME=%s", (db, table))
            self._types[key] = {str(n): (str(t).lower(), None if cs is None else str(cs).lower())
                                for n, t, cs in rows}
        return self._types[key]
