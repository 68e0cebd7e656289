"""The simulated binlog: committed transactions and DDL, each with MySQL binlog coordinates.

The simulation (:mod:`cdc_lake.demo.shop_model`) decides *what* happens; :class:`Binlog` places
it in the log the way a MySQL server would: a transaction is ``BEGIN``, then per statement a
table-map and one rows event (several rows for a multi-row statement), then ``XID``; a DDL
statement is a single query event. Positions grow by the event sizes; the server rotates to the
next ``mysql-bin.NNNNNN`` file when one grows past ``max_file_size`` (and on ``FLUSH LOGS``),
and a new file starts again at a small position. Writers (:mod:`cdc_lake.demo.writers`) turn
these entries into Debezium, Maxwell or Canal lines without deciding any ordering themselves.

Example::

    log = Binlog()
    txn = log.transaction(commit_ms, [Statement(schema, "insert", (RowChange(None, row),))])
    txn.events[0].file, txn.events[0].pos    # ('mysql-bin.000001', 157)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from cdc_lake.demo.schema import TableSchema

Op = Literal["insert", "update", "delete"]

FIRST_POS = 157  # after the format-description and previous-gtids events of a new file
_BEGIN_SIZE = 73
_TABLE_MAP_SIZE = 52
_XID_SIZE = 31
_ROWS_HEADER_SIZE = 30


@dataclass(frozen=True)
class RowChange:
    """One row of a rows event: full before image (update/delete), full after image (insert/update)."""

    before: dict[str, Any] | None
    after: dict[str, Any] | None


@dataclass(frozen=True)
class Statement:
    """One DML statement as the binlog records it: one table, one kind, one or more rows."""

    table: TableSchema
    op: Op
    rows: tuple[RowChange, ...]


@dataclass(frozen=True)
class RowsEvent:
    """A statement placed in the binlog at (``file``, ``pos``)."""

    table: TableSchema
    op: Op
    rows: tuple[RowChange, ...]
    file: str
    pos: int


@dataclass(frozen=True)
class Transaction:
    """A committed transaction: its rows events in log order, its xid and commit time (ms)."""

    xid: int
    commit_ms: int
    events: tuple[RowsEvent, ...]


@dataclass(frozen=True)
class DdlEvent:
    """A DDL statement (auto-committed; never inside a transaction)."""

    database: str
    table: str
    ddl_type: Literal["table-create", "table-alter"]
    sql: str
    commit_ms: int
    file: str
    pos: int
    schema_before: TableSchema | None
    schema_after: TableSchema


BinlogEntry = Transaction | DdlEvent


def _row_size(row: dict[str, Any] | None) -> int:
    return 0 if row is None else len(json.dumps(row, default=str, ensure_ascii=False).encode())


class Binlog:
    """Assigns binlog file, position and xid to statements in commit order.

    Args:
        file_index: number of the current ``mysql-bin.NNNNNN`` file.
        pos: next free position in that file.
        next_xid: xid of the next transaction.
        max_file_size: rotate to a new file after a transaction that ends past this size.
    """

    def __init__(self, *, file_index: int = 1, pos: int = FIRST_POS, next_xid: int = 1041,
                 max_file_size: int = 64 * 1024) -> None:
        self.file_index = file_index
        self.pos = pos
        self.next_xid = next_xid
        self.max_file_size = max_file_size

    @property
    def file(self) -> str:
        return f"mysql-bin.{self.file_index:06d}"

    def rotate(self) -> None:
        """``FLUSH LOGS``: continue in the next file."""
        self.file_index += 1
        self.pos = FIRST_POS

    def transaction(self, commit_ms: int, statements: list[Statement]) -> Transaction:
        """Log one committed transaction.

        Raises:
            ValueError: ``statements`` is empty (MySQL logs nothing for an empty transaction).
        """
        if not statements:
            raise ValueError("a transaction needs at least one statement")
        self.pos += _BEGIN_SIZE
        events = []
        for st in statements:
            self.pos += _TABLE_MAP_SIZE
            events.append(RowsEvent(st.table, st.op, st.rows, self.file, self.pos))
            self.pos += _ROWS_HEADER_SIZE + sum(_row_size(r.before) + _row_size(r.after)
                                                for r in st.rows)
        self.pos += _XID_SIZE
        txn = Transaction(self.next_xid, commit_ms, tuple(events))
        self.next_xid += 1 + (commit_ms % 3)  # xids of other sessions interleave
        self._maybe_rotate()
        return txn

    def ddl(self, commit_ms: int, ddl_type: Literal["table-create", "table-alter"], sql: str,
            schema_before: TableSchema | None, schema_after: TableSchema) -> DdlEvent:
        """Log one DDL query event."""
        ev = DdlEvent(schema_after.database, schema_after.name, ddl_type, sql, commit_ms,
                      self.file, self.pos, schema_before, schema_after)
        self.pos += 60 + len(sql.encode())
        self._maybe_rotate()
        return ev

    def _maybe_rotate(self) -> None:
        if self.pos > self.max_file_size:
            self.rotate()

    def state(self) -> dict[str, int]:
        return {"file_index": self.file_index, "pos": self.pos, "next_xid": self.next_xid,
                "max_file_size": self.max_file_size}

    @classmethod
    def from_state(cls, state: dict[str, int]) -> Binlog:
        return cls(**state)
