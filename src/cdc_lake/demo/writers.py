"""Serialize binlog entries as Debezium, Maxwell or Canal JSON lines.

Each writer turns one :data:`~cdc_lake.demo.binlog.BinlogEntry` into the lines its tool would
land, in capture order; it adds no ordering of its own beyond what the binlog coordinates say.

- :class:`DebeziumWriter`: one envelope per row (``op`` c/u/d), ``source.file``/``pos``/``row``,
  ``source.ts_ms`` commit time; a primary-key change is a ``d`` of the old key then a ``c`` of
  the new key with the same source coordinates, as Debezium emits it; optional Kafka tombstone
  line ``null`` after each delete. With ``with_schema`` the line is ``{"schema", "payload"}`` and
  values are typed the Debezium way (int32/int64, ``Decimal`` as base64 two's complement,
  ``io.debezium.time.Date`` days, ``io.debezium.time.Timestamp`` epoch ms); without it decimals
  are strings and dates/datetimes ISO strings. No DDL (Debezium sends DDL to another topic).
- :class:`MaxwellWriter`: one line per row with ``position``, ``xid``, ``xoffset``, ``commit`` on
  the last row of a transaction, ``ts`` seconds, ``data`` full row, ``old`` previous values of
  changed columns only, decimals as JSON numbers; DDL as ``table-create``/``table-alter``.
- :class:`CanalWriter`: one flat message per rows event (``data``/``old`` arrays), all values
  strings or null, ``mysqlType``/``sqlType``, ``pkNames``, ``es`` commit ms, ``id`` per message;
  DDL as ``isDdl`` messages.

Example::

    writer = make_writer("canal")
    lines = [line for entry in entries for line in writer.lines(entry)]
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, Protocol

from cdc_lake.demo.binlog import BinlogEntry, DdlEvent, RowChange, RowsEvent, Transaction
from cdc_lake.demo.schema import Column, TableSchema

FORMATS = ("debezium", "maxwell", "canal")
SERVER_ID = 1
_EPOCH = date(1970, 1, 1)


class FormatWriter(Protocol):
    name: str

    def lines(self, entry: BinlogEntry) -> list[str]: ...

    def state(self) -> dict[str, Any]: ...


def make_writer(fmt: str, *, state: dict[str, Any] | None = None, **options: Any) -> FormatWriter:
    """The writer for ``fmt`` with its options (and saved state, for a continued run).

    Raises:
        ValueError: unknown format.
    """
    cls = {"debezium": DebeziumWriter, "maxwell": MaxwellWriter, "canal": CanalWriter}.get(fmt)
    if cls is None:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return cls(**options, **(state or {}))  # type: ignore[no-any-return]


def dumps(value: Any) -> str:
    """Compact JSON (UTF-8 text, not \\u-escaped) that writes :class:`Decimal` as a JSON number
    with its exact digits (``19.90``, not ``19.9``), as Jackson writes a BigDecimal."""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{dumps(v)}"
                              for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _iso_date(v: date) -> str:
    return v.isoformat()


def _iso_datetime(v: datetime) -> str:
    return v.strftime("%Y-%m-%d %H:%M:%S") + (f".{v.microsecond:06d}" if v.microsecond else "")


def _epoch_ms(v: datetime) -> int:
    return int(v.replace(tzinfo=UTC).timestamp() * 1000)


def _decimal_bytes(v: Decimal, scale: int) -> str:
    """Kafka Connect ``Decimal``: unscaled value, big-endian two's complement, base64."""
    unscaled = int(v.scaleb(scale).to_integral_value())
    length = ((unscaled if unscaled >= 0 else ~unscaled).bit_length() + 8) // 8
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode("ascii")


def _key_changed(schema: TableSchema, change: RowChange) -> bool:
    assert change.before is not None and change.after is not None
    return any(change.before[k] != change.after[k] for k in schema.pk)


# ---------------------------------------------------------------------------------- Debezium

class DebeziumWriter:
    """Debezium MySQL connector envelopes (JSON converter, ``decimal.handling.mode=precise``)."""

    name = "debezium"
    VERSION = "2.7.3.Final"

    def __init__(self, *, with_schema: bool = True, tombstones: bool = True,
                 server_name: str = "shop") -> None:
        self.with_schema = with_schema
        self.tombstones = tombstones
        self.server_name = server_name

    def state(self) -> dict[str, Any]:
        return {}

    def lines(self, entry: BinlogEntry) -> list[str]:
        if isinstance(entry, DdlEvent):
            return []  # schema changes go to the schema-change topic, not the table topics
        out: list[str] = []
        for ev in entry.events:
            for row_index, change in enumerate(ev.rows):
                for op, before, after in self._ops(ev, change):
                    out.append(self._line(entry, ev, row_index, op, before, after))
                    if op == "d" and self.tombstones:
                        out.append("null")
        return out

    def _ops(self, ev: RowsEvent, change: RowChange
             ) -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
        if ev.op == "insert":
            return [("c", None, change.after)]
        if ev.op == "delete":
            return [("d", change.before, None)]
        if _key_changed(ev.table, change):
            return [("d", change.before, None), ("c", None, change.after)]
        return [("u", change.before, change.after)]

    def _line(self, txn: Transaction, ev: RowsEvent, row_index: int, op: str,
              before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
        t = ev.table
        source = {
            "version": self.VERSION, "connector": "mysql", "name": self.server_name,
            "ts_ms": txn.commit_ms, "snapshot": "false", "db": t.database, "sequence": None,
            "table": t.name, "server_id": SERVER_ID, "gtid": None, "file": ev.file,
            "pos": ev.pos, "row": row_index, "thread": 7 + txn.xid % 5, "query": None,
        }
        payload = {
            "before": self._row(t, before), "after": self._row(t, after), "source": source,
            "op": op, "ts_ms": txn.commit_ms + 150 + ev.pos % 700, "transaction": None,
        }
        if not self.with_schema:
            return dumps(payload)
        return dumps({"schema": self._schema(t), "payload": payload})

    def _row(self, t: TableSchema, row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        return {c.name: self._value(c, row.get(c.name)) for c in t.columns}

    def _value(self, col: Column, v: Any) -> Any:
        if v is None:
            return None
        kind = col.kind
        if kind == "decimal":
            return _decimal_bytes(v, col.decimal_precision_scale[1]) if self.with_schema else \
                format(v, "f")
        if kind == "date":
            return (v - _EPOCH).days if self.with_schema else _iso_date(v)
        if kind == "datetime":
            return _epoch_ms(v) if self.with_schema else _iso_datetime(v)
        return v

    @staticmethod
    def _field(col: Column) -> dict[str, Any]:
        f: dict[str, Any] = {"type": {"int": "int32", "bigint": "int64"}.get(col.kind, "string"),
                             "optional": col.nullable}
        if col.kind == "decimal":
            p, s = col.decimal_precision_scale
            f.update(type="bytes", name="org.apache.kafka.connect.data.Decimal", version=1,
                     parameters={"scale": str(s), "connect.decimal.precision": str(p)})
        elif col.kind == "date":
            f.update(type="int32", name="io.debezium.time.Date", version=1)
        elif col.kind == "datetime":
            f.update(type="int64", name="io.debezium.time.Timestamp", version=1)
        f["field"] = col.name
        return f

    def _schema(self, t: TableSchema) -> dict[str, Any]:
        prefix = f"{self.server_name}.{t.database}.{t.name}"
        value = {"type": "struct", "fields": [self._field(c) for c in t.columns],
                 "optional": True, "name": f"{prefix}.Value"}

        def s(field: str, type_: str = "string", optional: bool = False) -> dict[str, Any]:
            return {"type": type_, "optional": optional, "field": field}

        source = {"type": "struct", "optional": False,
                  "name": "io.debezium.connector.mysql.Source", "field": "source", "fields": [
                      s("version"), s("connector"), s("name"), s("ts_ms", "int64"),
                      {"type": "string", "optional": True, "name": "io.debezium.data.Enum",
                       "version": 1, "parameters": {"allowed": "true,last,false,incremental"},
                       "default": "false", "field": "snapshot"},
                      s("db"), s("sequence", optional=True), s("table", optional=True),
                      s("server_id", "int64"), s("gtid", optional=True), s("file"),
                      s("pos", "int64"), s("row", "int32"), s("thread", "int64", True),
                      s("query", optional=True)]}
        transaction = {"type": "struct", "optional": True, "name": "event.block", "version": 1,
                       "field": "transaction", "fields": [
                           s("id"), s("total_order", "int64"), s("data_collection_order", "int64")]}
        return {"type": "struct", "optional": False, "name": f"{prefix}.Envelope", "version": 1,
                "fields": [{**value, "field": "before"}, {**value, "field": "after"}, source,
                           s("op"), s("ts_ms", "int64", True), transaction]}


# ---------------------------------------------------------------------------------- Maxwell

_MAXWELL_COLUMN_TYPES = {"int": "int", "bigint": "bigint", "decimal": "decimal", "date": "date",
                         "datetime": "datetime", "string": "varchar"}


class MaxwellWriter:
    """Maxwell's Daemon JSON (``output_binlog_position``, ``output_primary_keys``,
    ``output_primary_key_columns``, ``output_ddl``, ``output_xoffset``).

    Args:
        with_position: write ``position`` (``output_binlog_position``).
        ddl: write DDL events (``output_ddl``).
        commit_xoffset: also write ``xoffset`` on the row that carries ``commit: true``. Maxwell
            itself omits it there (``RowMap.toJSON``: xoffset only when not ``txCommit``); the
            default keeps it so every row has an explicit offset.
    """

    name = "maxwell"

    def __init__(self, *, with_position: bool = True, ddl: bool = True,
                 commit_xoffset: bool = True) -> None:
        self.with_position = with_position
        self.ddl = ddl
        self.commit_xoffset = commit_xoffset

    def state(self) -> dict[str, Any]:
        return {}

    def lines(self, entry: BinlogEntry) -> list[str]:
        if isinstance(entry, DdlEvent):
            return [self._ddl(entry)] if self.ddl else []
        rows = [(ev, change) for ev in entry.events for change in ev.rows]
        out = []
        for xoffset, (ev, change) in enumerate(rows):
            t = ev.table
            data = change.after if ev.op != "delete" else change.before
            assert data is not None
            last = xoffset == len(rows) - 1
            msg: dict[str, Any] = {"database": t.database, "table": t.name, "type": ev.op,
                                   "ts": entry.commit_ms // 1000, "xid": entry.xid}
            if not last or self.commit_xoffset:
                msg["xoffset"] = xoffset
            if last:
                msg["commit"] = True
            if self.with_position:
                msg["position"] = f"{ev.file}:{ev.pos}"
            msg.update(server_id=SERVER_ID, thread_id=7 + entry.xid % 5,
                       primary_key=[self._value(t.column(k), data[k]) for k in t.pk],
                       primary_key_columns=list(t.pk),
                       data={c.name: self._value(c, data.get(c.name)) for c in t.columns})
            if ev.op == "update":
                assert change.before is not None and change.after is not None
                msg["old"] = {c.name: self._value(c, change.before.get(c.name))
                              for c in t.columns
                              if change.before.get(c.name) != change.after.get(c.name)}
            out.append(dumps(msg))
        return out

    @staticmethod
    def _value(col: Column, v: Any) -> Any:
        if v is None:
            return None
        if col.kind == "date":
            return _iso_date(v)
        if col.kind == "datetime":
            return _iso_datetime(v)
        return v  # ints, strings; Decimal is written as a JSON number by dumps()

    @staticmethod
    def _def(t: TableSchema) -> dict[str, Any]:
        cols = []
        for c in t.columns:
            col: dict[str, Any] = {"type": _MAXWELL_COLUMN_TYPES[c.kind], "name": c.name}
            if c.kind == "string":
                col["charset"] = "utf8mb4"
            elif c.kind == "decimal":
                col["precision"], col["scale"] = c.decimal_precision_scale
            elif c.kind in ("int", "bigint"):
                col["signed"] = True
            cols.append(col)
        return {"database": t.database, "charset": "utf8mb4", "table": t.name,
                "columns": cols, "primary-key": list(t.pk)}

    def _ddl(self, ev: DdlEvent) -> str:
        msg: dict[str, Any] = {"type": ev.ddl_type, "database": ev.database, "table": ev.table}
        if ev.schema_before is not None:
            msg["old"] = self._def(ev.schema_before)
        msg.update({"def": self._def(ev.schema_after), "ts": ev.commit_ms // 1000,
                    "sql": ev.sql})
        if self.with_position:
            msg["position"] = f"{ev.file}:{ev.pos}"
        return dumps(msg)


# ---------------------------------------------------------------------------------- Canal

_JDBC_TYPES = {"int": 4, "bigint": -5, "decimal": 3, "date": 91, "datetime": 93}


class CanalWriter:
    """Canal flat messages (``flatMessage=true``), one per rows event or DDL statement.

    Args:
        next_id: ``id`` of the next message (saved between runs).
    """

    name = "canal"

    def __init__(self, *, next_id: int = 1) -> None:
        self.next_id = next_id

    def state(self) -> dict[str, Any]:
        return {"next_id": self.next_id}

    def _id(self) -> int:
        i = self.next_id
        self.next_id += 1
        return i

    def lines(self, entry: BinlogEntry) -> list[str]:
        if isinstance(entry, DdlEvent):
            return [dumps({
                "data": None, "database": entry.database, "es": entry.commit_ms,
                "id": self._id(), "isDdl": True, "mysqlType": None, "old": None, "pkNames": None,
                "sql": entry.sql, "sqlType": None, "table": entry.table,
                "ts": entry.commit_ms + 37, "type": "CREATE" if entry.ddl_type == "table-create"
                else "ALTER"})]
        out = []
        for ev in entry.events:
            t = ev.table
            images = [c.after if ev.op != "delete" else c.before for c in ev.rows]
            old = None
            if ev.op == "update":
                old = [{c.name: self._value(c, ch.before.get(c.name)) for c in t.columns
                        if ch.before.get(c.name) != ch.after.get(c.name)}  # type: ignore[union-attr]
                       for ch in ev.rows]
            out.append(dumps({
                "data": [{c.name: self._value(c, img.get(c.name)) for c in t.columns}
                         for img in images if img is not None],
                "database": t.database, "es": entry.commit_ms, "id": self._id(),
                "isDdl": False, "mysqlType": {c.name: c.mysql_type for c in t.columns},
                "old": old, "pkNames": list(t.pk), "sql": "",
                "sqlType": {c.name: _JDBC_TYPES.get(c.kind, 2005 if c.mysql_type == "text"
                                                    else 12) for c in t.columns},
                "table": t.name, "ts": entry.commit_ms + 40 + ev.pos % 400,
                "type": ev.op.upper()}))
        return out

    @staticmethod
    def _value(col: Column, v: Any) -> str | None:
        if v is None:
            return None
        if isinstance(v, Decimal):
            return format(v, "f")
        if isinstance(v, datetime):
            return _iso_datetime(v)
        if isinstance(v, date):
            return _iso_date(v)
        return str(v)
