"""Independent reference model of what the Delta tables must contain.

Plain Python, sharing no code with the job (``cdc_lake.cdc.job``/``formats``/``engines``) nor with the
demo generator: it parses raw landing lines of each format itself (from the public format
descriptions in ``/work/shared/docs/binlog-formats.md``), orders the changes by binlog order,
drops duplicates and replays them into ``table -> key tuple -> row`` (SCD1) or into version rows
(SCD2, as ``docs/contracts.md`` describes). Values are typed as ``contracts.md`` says: integers
``int``, decimals :class:`~decimal.Decimal`, dates :class:`~datetime.date`, timestamps
timezone-aware UTC :class:`~datetime.datetime`, strings ``str``.

Binlog order per format:

- Debezium: (``source.file``, ``source.pos``, ``source.row``).
- Maxwell: (``position`` file, offset, ``xoffset``) when ``position`` is present, else
  (``ts``, ``xid``, ``xoffset``); a row without ``xoffset`` but with ``commit: true`` is the last
  of its transaction.
- Canal: (``es``, ``id``, row index).

Ties (a Debezium primary-key change is a ``d`` and a ``c`` with the same coordinates, on two
different keys) fall back to (file name, line number).

Example::

    cfg = RefConfig.from_yaml(tmp_path / "pipeline.yaml")
    model = ReferenceModel(cfg)
    for f in sorted(landing.glob("*.json")):
        model.add_file(f)
    assert_table_equals(model.scd1("orders"), read_delta_rows(lake / "orders"), ("id",))
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

Key = tuple[Any, ...]
Row = dict[str, Any]

CDC_COLUMNS = ("_cdc_op", "_cdc_seq", "_cdc_commit_ts", "_cdc_run_id")
SCD2_COLUMNS = ("_valid_from", "_valid_to", "_is_current")
EPOCH = date(1970, 1, 1)
EPOCH_DT = datetime(1970, 1, 1, tzinfo=UTC)

_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TS_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(\.\d{1,6})?(Z|[+-]00:?00)?$")
_INT_RE = re.compile(r"^[+-]?\d+$")
_DECIMAL_TYPE_RE = re.compile(r"^decimal\((\d+),(\d+)\)$")
MAXWELL_DATA_OPS = {"insert": "insert", "update": "update", "delete": "delete",
                    "bootstrap-insert": "snapshot"}
MAXWELL_DDL_TYPES = {"table-create", "table-alter", "table-drop", "database-create",
                     "database-alter", "database-drop"}
MAXWELL_SKIP_TYPES = {"bootstrap-start", "bootstrap-complete", "heartbeat"}
DEBEZIUM_OPS = {"c": "insert", "u": "update", "d": "delete", "r": "snapshot"}
CANAL_OPS = {"INSERT": "insert", "UPDATE": "update", "DELETE": "delete"}


# ------------------------------------------------------------------------------------ config

@dataclass(frozen=True)
class RefTable:
    name: str
    source_table: str
    database: str | None
    keys: tuple[str, ...]
    types: Mapping[str, str]
    scd: int = 1
    columns: tuple[str, ...] | None = None
    exclude_columns: tuple[str, ...] = ()

    def project(self, row: Row) -> Row:
        if self.columns is not None:
            row = {c: v for c, v in row.items() if c in self.columns}
        return {c: v for c, v in row.items() if c not in self.exclude_columns}


@dataclass(frozen=True)
class RefConfig:
    fmt: str
    database: str | None
    tables: Mapping[str, RefTable]
    ignore_tables: tuple[str, ...] = ()
    infer_temporal: bool = True

    @classmethod
    def from_yaml(cls, path: Path | str) -> RefConfig:
        return cls.from_mapping(yaml.safe_load(Path(path).read_text(encoding="utf-8")))

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> RefConfig:
        src = raw["source"]
        db = src.get("database")
        tables = {}
        for name, t in raw["tables"].items():
            t = t or {}
            tables[name] = RefTable(
                name=name, source_table=t.get("source_table", name),
                database=t.get("database", db), keys=tuple(t.get("keys") or ()),
                types={c: str(v).lower().replace(" ", "") for c, v in (t.get("types") or {}).items()},
                scd=int(t.get("scd", 1)),
                columns=tuple(t["columns"]) if t.get("columns") is not None else None,
                exclude_columns=tuple(t.get("exclude_columns") or ()))
        return cls(fmt=src["format"], database=db, tables=tables,
                   ignore_tables=tuple(raw.get("ignore_tables") or ()),
                   infer_temporal=bool(raw.get("infer_temporal", True)))

    def table_for(self, database: str | None, source_table: str | None) -> RefTable | None:
        for t in self.tables.values():
            if t.source_table == source_table and (t.database is None or t.database == database):
                return t
        return None


# ------------------------------------------------------------------------------------ records

@dataclass(frozen=True)
class Change:
    """One row change, typed, with its binlog order."""

    table: str
    op: str                      # insert | update | delete | snapshot
    key: Key
    row: Row                     # after image; the deleted row for a delete
    old_key: Key | None          # set when an update moved the row from another key
    old_row: Row | None          # before image, when the format gives one
    seq: tuple[Any, ...]
    commit_ts: datetime
    source_file: str
    line_no: int
    row_index: int

    @property
    def identity(self) -> tuple[Any, ...]:
        return (self.table, self.seq, self.op, self.key)

    @property
    def order(self) -> tuple[Any, ...]:
        return (self.seq, Path(self.source_file).name, self.line_no, self.row_index)


@dataclass(frozen=True)
class Quarantined:
    source_file: str
    raw_line: str
    reason: str        # starts with malformed | unknown_table | missing_key | unknown_op | cast


@dataclass(frozen=True)
class Ddl:
    database: str | None
    table: str | None
    ddl_type: str
    sql: str
    commit_ts: datetime | None
    source_file: str


class Reject(Exception):
    """A line or row change that belongs in quarantine."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class Skip(Exception):
    """A line that carries no data (Kafka tombstone, bootstrap marker, ignored table)."""


# ------------------------------------------------------------------------------------ typing

def decimal_ps(type_: str) -> tuple[int, int] | None:
    m = _DECIMAL_TYPE_RE.match(type_)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_timestamp(s: str) -> datetime | None:
    m = _TS_RE.match(s.strip())
    if not m:
        if _DATE_RE.match(s.strip()):
            return datetime.fromisoformat(s.strip()).replace(tzinfo=UTC)
        return None
    d, hh, mm, ss, frac, _tz = m.groups()
    us = int((frac or ".0")[1:].ljust(6, "0"))
    y, mo, dd = (int(x) for x in d.split("-"))
    try:
        return datetime(y, mo, dd, int(hh), int(mm), int(ss), us, tzinfo=UTC)
    except ValueError:
        return None


def cast(v: Any, type_: str) -> Any:
    """Cast a JSON/decoded value to a Spark SQL type the way a faithful CDC target must.

    Raises:
        Reject: ``cast`` if the value cannot be represented in that type.
    """
    if v is None:
        return None
    t = type_.lower()

    def bad() -> Reject:
        return Reject("cast", f"{v!r} is not a valid {t}")

    if t in ("int", "integer", "bigint", "smallint", "tinyint"):
        if isinstance(v, bool):
            raise bad()
        if isinstance(v, int):
            out = v
        elif isinstance(v, Decimal) and v.is_finite() and v == v.to_integral_value():
            out = int(v)
        elif isinstance(v, str) and _INT_RE.match(v.strip()):
            out = int(v.strip())
        else:
            raise bad()
        limit = 2**63 if t == "bigint" else 2**31
        if not -limit <= out < limit:
            raise bad()
        return out
    if (ps := decimal_ps(t)) is not None:
        p, s = ps
        if isinstance(v, bool):
            raise bad()
        try:
            d = v if isinstance(v, Decimal) else Decimal(v.strip() if isinstance(v, str) else
                                                         repr(v) if isinstance(v, float) else v)
        except (InvalidOperation, TypeError, ValueError):
            raise bad() from None
        if not d.is_finite():
            raise bad()
        d = d.quantize(Decimal(1).scaleb(-s), ROUND_HALF_UP)
        if d.adjusted() >= p - s:
            raise bad()
        return d
    if t == "date":
        if isinstance(v, datetime):
            return v.date()
        if isinstance(v, date):
            return v
        if isinstance(v, int) and not isinstance(v, bool):
            return EPOCH + timedelta(days=v)
        if isinstance(v, str) and _DATE_RE.match(v.strip()):
            try:
                return date.fromisoformat(v.strip())
            except ValueError:
                raise bad() from None
        raise bad()
    if t == "timestamp":
        if isinstance(v, datetime):
            return v if v.tzinfo else v.replace(tzinfo=UTC)
        if isinstance(v, date):
            return datetime(v.year, v.month, v.day, tzinfo=UTC)
        if isinstance(v, int) and not isinstance(v, bool):
            return EPOCH_DT + timedelta(milliseconds=v)
        if isinstance(v, str) and (ts := parse_timestamp(v)) is not None:
            return ts
        raise bad()
    if t == "string":
        if isinstance(v, str):
            return v
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | Decimal):
            return str(v)
        if isinstance(v, dict | list):
            return json_text(v)
        raise bad()
    if t == "boolean":
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.strip().lower() in ("true", "false"):
            return v.strip().lower() == "true"
        raise bad()
    if t in ("double", "float"):
        try:
            return float(v)
        except (TypeError, ValueError):
            raise bad() from None
    raise Reject("cast", f"unsupported type {t!r}")


def infer(v: Any, infer_temporal: bool) -> Any:
    """Type a value that comes with no type information (JSON value kind)."""
    if isinstance(v, str) and infer_temporal:
        if _DATE_RE.match(v):
            try:
                return date.fromisoformat(v)
            except ValueError:
                return v
        if (ts := parse_timestamp(v)) is not None and not _DATE_RE.match(v):
            return ts
    if isinstance(v, dict | list):
        return json_text(v)
    return v


def json_text(v: Any) -> str:
    """Compact JSON of a parsed value whose numbers may be ``Decimal`` (written as their text)."""
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{json_text(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(json_text(x) for x in v) + "]"
    if isinstance(v, Decimal):
        return str(v)
    return json.dumps(v, ensure_ascii=False)


def canal_type(mysql_type: str) -> str | None:
    m = re.match(r"^\s*([a-z]+)\s*(?:\(([^)]*)\))?\s*(unsigned)?", mysql_type.lower())
    if not m:
        return None
    base, args, unsigned = m.groups()
    if base in ("tinyint", "smallint", "mediumint"):
        return "int"
    if base in ("int", "integer"):
        return "bigint" if unsigned else "int"
    if base == "bigint":
        return "decimal(20,0)" if unsigned else "bigint"
    if base in ("decimal", "numeric"):
        p, _, s = (args or "10,0").partition(",")
        return f"decimal({int(p)},{int(s or 0)})"
    if base == "date":
        return "date"
    if base in ("datetime", "timestamp"):
        return "timestamp"
    if base in ("float", "double", "real"):
        return "double"
    return "string"


def debezium_field_type(f: Mapping[str, Any]) -> tuple[str | None, Any]:
    """(Spark type, decoder) of one Debezium schema field."""
    name, t = f.get("name"), f.get("type")
    if name == "org.apache.kafka.connect.data.Decimal":
        params = f.get("parameters")
        params = params if isinstance(params, dict) else {}
        try:
            scale = int(params.get("scale", 0))
            precision = int(params.get("connect.decimal.precision", 38))
        except (TypeError, ValueError):
            return None, None  # unreadable parameters: no type information (a lenient model)

        def dec(v: Any) -> Any:
            if isinstance(v, str):
                try:
                    raw = base64.b64decode(v, validate=True)
                except ValueError:
                    raise Reject("cast", f"{v!r} is not base64") from None
                return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)
            return v
        return f"decimal({precision},{scale})", dec
    if name == "io.debezium.time.Date":
        return "date", lambda v: EPOCH + timedelta(days=v) if isinstance(v, int) else v
    if name == "io.debezium.time.Timestamp":
        return "timestamp", lambda v: EPOCH_DT + timedelta(milliseconds=v) if isinstance(v, int) else v
    if name == "io.debezium.time.MicroTimestamp":
        return "timestamp", lambda v: EPOCH_DT + timedelta(microseconds=v) if isinstance(v, int) else v
    if name == "io.debezium.time.ZonedTimestamp":
        return "timestamp", lambda v: v
    simple = {"int8": "int", "int16": "int", "int32": "int", "int64": "bigint",
              "boolean": "boolean", "float32": "double", "float64": "double", "string": "string"}
    return simple.get(str(t)), lambda v: v


def binlog_file_order(name: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", name)
    return (int(m.group(1)) if m else -1, name)


def sortable_seq(seq: Any) -> str:
    """A string whose lexical order is the order of the (nested) tuple ``seq``."""
    if isinstance(seq, tuple | list):
        return "|".join(sortable_seq(x) for x in seq)
    if isinstance(seq, int):
        return f"{seq + 2**63:020d}"
    return str(seq)


def ms_to_dt(ms: int | Decimal) -> datetime:
    return EPOCH_DT + timedelta(milliseconds=int(ms))


# ------------------------------------------------------------------------------------ model

@dataclass
class _Parsed:
    """What a format parser extracted from one line (before typing)."""

    database: str | None
    table: str | None
    op: str
    row: Mapping[str, Any] | None           # after image (delete: the deleted row)
    before: Mapping[str, Any] | None = None  # full before image
    old: Mapping[str, Any] | None = None     # changed columns only (Maxwell/Canal)
    hints: Mapping[str, tuple[str | None, Any]] = field(default_factory=dict)
    seq: tuple[Any, ...] = ()
    commit_ts: datetime | None = None
    row_index: int = 0


class ReferenceModel:
    """Feed it landing files (in any order, with duplicates); ask for expected tables."""

    def __init__(self, config: RefConfig) -> None:
        self.config = config
        self.changes: list[Change] = []
        self.quarantine: list[Quarantined] = []
        self.ddl: list[Ddl] = []
        self.skipped = 0
        self._seen: set[tuple[Any, ...]] = set()

    # ---------------------------------------------------------------- feeding

    def add_file(self, path: Path | str) -> None:
        path = Path(path)
        self.add_lines(str(path), path.read_text(encoding="utf-8").split("\n"))

    def add_lines(self, source_file: str, lines: Iterable[str]) -> None:
        parse = {"debezium": self._parse_debezium, "maxwell": self._parse_maxwell,
                 "canal": self._parse_canal}[self.config.fmt]
        for line_no, raw in enumerate(lines):
            line = raw.rstrip("\r")
            if not line.strip():
                continue
            try:
                obj = json.loads(line, parse_float=Decimal)
            except json.JSONDecodeError as e:
                self.quarantine.append(Quarantined(source_file, line, f"malformed: {e}"))
                continue
            try:
                parsed = parse(obj, source_file)
            except Skip:
                self.skipped += 1
                continue
            except Reject as r:
                self.quarantine.append(Quarantined(source_file, line, str(r)))
                continue
            for p in parsed:
                try:
                    ch = self._change(p, source_file, line_no)
                except Skip:
                    continue
                except Reject as r:
                    self.quarantine.append(Quarantined(source_file, line, str(r)))
                    continue
                if ch.identity not in self._seen:
                    self._seen.add(ch.identity)
                    self.changes.append(ch)

    def _table(self, p: _Parsed) -> RefTable:
        spec = self.config.table_for(p.database, p.table)
        if spec is None:
            if p.table in self.config.ignore_tables:
                raise Skip()
            raise Reject("unknown_table", f"{p.database}.{p.table} is not configured")
        return spec

    def _type_row(self, spec: RefTable, image: Mapping[str, Any],
                  hints: Mapping[str, tuple[str | None, Any]]) -> Row:
        out: Row = {}
        for col, v in image.items():
            hint, decode = hints.get(col, (None, None))
            if decode is not None and v is not None:
                v = decode(v)
            type_ = spec.types.get(col) or hint
            out[col] = cast(v, type_) if type_ else infer(v, self.config.infer_temporal)
        return spec.project(out)

    def _key(self, spec: RefTable, row: Row, what: str) -> Key:
        missing = [k for k in spec.keys if row.get(k) is None]
        if missing:
            raise Reject("missing_key", f"{what} lacks key column(s) {missing}")
        return tuple(row[k] for k in spec.keys)

    def _change(self, p: _Parsed, source_file: str, line_no: int) -> Change:
        spec = self._table(p)
        if p.row is None or not isinstance(p.row, Mapping):
            raise Reject("malformed", "no row image")
        row = self._type_row(spec, p.row, p.hints)
        key = self._key(spec, row, "row")
        old_row: Row | None = None
        if p.before is not None:
            old_row = self._type_row(spec, p.before, p.hints)
        elif p.old is not None:
            old_row = self._type_row(spec, {**p.row, **p.old}, p.hints)
        old_key = None
        if p.op == "update" and old_row is not None:
            ok = self._key(spec, old_row, "before image")
            old_key = ok if ok != key else None
        assert p.commit_ts is not None
        return Change(spec.name, p.op, key, row, old_key, old_row, p.seq, p.commit_ts,
                      source_file, line_no, p.row_index)

    # ---------------------------------------------------------------- format parsers

    def _parse_debezium(self, obj: Any, source_file: str) -> list[_Parsed]:
        if obj is None:
            raise Skip()  # Kafka tombstone after a delete
        if not isinstance(obj, dict):
            raise Reject("malformed", f"expected a JSON object, got {type(obj).__name__}")
        schema = None
        if "payload" in obj and "schema" in obj:
            schema, obj = obj["schema"], obj["payload"]
            if obj is None:
                raise Skip()
            if not isinstance(obj, dict):
                raise Reject("malformed", "payload is not an object")
        if "ddl" in obj and "op" not in obj:  # schema-change topic record
            src = obj.get("source")
            src = src if isinstance(src, dict) else {}
            ts = src.get("ts_ms")
            self.ddl.append(Ddl(obj.get("databaseName") or src.get("db"), src.get("table"),
                                "ddl", str(obj["ddl"]),
                                ms_to_dt(ts) if isinstance(ts, int) else None, source_file))
            raise Skip()
        src = obj.get("source")
        if not isinstance(src, dict):
            raise Reject("malformed", "no source block")
        op = obj.get("op")
        if not isinstance(op, str) or op not in DEBEZIUM_OPS:
            raise Reject("unknown_op", f"op {op!r}")
        if not isinstance(src.get("file"), str) or not isinstance(src.get("pos"), int):
            raise Reject("malformed", "source.file/pos missing")
        hints: dict[str, tuple[str | None, Any]] = {}
        if isinstance(schema, dict):
            fields = schema.get("fields")
            for f in fields if isinstance(fields, list) else []:
                if not isinstance(f, dict):
                    continue  # not a field: no name, no hints
                if f.get("field") in ("after", "before") and f.get("type") == "struct":
                    columns = f.get("fields")
                    for cf in columns if isinstance(columns, list) else []:
                        if isinstance(cf, dict) and isinstance(cf.get("field"), str):
                            hints[cf["field"]] = debezium_field_type(cf)
                        elif f.get("field") == "after":  # the after image's types are unknown
                            raise Reject("malformed", "a schema field of after without a name")
        before, after = obj.get("before"), obj.get("after")
        kind = DEBEZIUM_OPS[op]
        row = before if kind == "delete" else after
        if not isinstance(row, dict):
            raise Reject("malformed", f"op {op!r} without {'before' if kind == 'delete' else 'after'}")
        seq = (binlog_file_order(src["file"]), src["pos"], int(src.get("row") or 0))
        ts = src.get("ts_ms", obj.get("ts_ms"))
        if not isinstance(ts, int):
            raise Reject("malformed", "no source.ts_ms")
        return [_Parsed(src.get("db"), src.get("table"), kind, row,
                        before=before if kind == "update" and isinstance(before, dict) else None,
                        hints=hints, seq=seq, commit_ts=ms_to_dt(ts))]

    def _parse_maxwell(self, obj: Any, source_file: str) -> list[_Parsed]:
        if not isinstance(obj, dict):
            raise Reject("malformed", f"expected a JSON object, got {type(obj).__name__}")
        typ = obj.get("type")
        ts = obj.get("ts")
        pos = obj.get("position")
        if isinstance(pos, str) and ":" in pos:
            f, _, off = pos.rpartition(":")
            if not off.isdigit():
                raise Reject("malformed", f"position {pos!r}")
            base: tuple[Any, ...] = (0, binlog_file_order(f), int(off))
        elif pos is None:
            base = (1, ts, obj.get("xid") or 0)
        else:
            raise Reject("malformed", f"position {pos!r}")
        if not isinstance(typ, str):
            raise Reject("unknown_op", f"type {typ!r}")
        if typ in MAXWELL_DDL_TYPES:
            self.ddl.append(Ddl(obj.get("database"), obj.get("table"), typ, str(obj.get("sql")),
                                datetime.fromtimestamp(ts, UTC) if isinstance(ts, int) else None,
                                source_file))
            raise Skip()
        if typ in MAXWELL_SKIP_TYPES:
            raise Skip()
        if typ not in MAXWELL_DATA_OPS:
            raise Reject("unknown_op", f"type {typ!r}")
        if not isinstance(ts, int) or isinstance(ts, bool):
            raise Reject("malformed", "no ts")
        data, old = obj.get("data"), obj.get("old")
        if not isinstance(data, dict):
            raise Reject("malformed", "data is not an object")
        xoff = obj.get("xoffset")
        rank = xoff if isinstance(xoff, int) else (2**62 if obj.get("commit") else -1)
        return [_Parsed(obj.get("database"), obj.get("table"), MAXWELL_DATA_OPS[typ], data,
                        old=old if typ == "update" and isinstance(old, dict) else None,
                        seq=(*base, rank), commit_ts=datetime.fromtimestamp(ts, UTC))]

    def _parse_canal(self, obj: Any, source_file: str) -> list[_Parsed]:
        if not isinstance(obj, dict):
            raise Reject("malformed", f"expected a JSON object, got {type(obj).__name__}")
        es, mid = obj.get("es"), obj.get("id")
        if obj.get("isDdl") is True:
            self.ddl.append(Ddl(obj.get("database"), obj.get("table"), str(obj.get("type")),
                                str(obj.get("sql")), ms_to_dt(es) if isinstance(es, int) else None,
                                source_file))
            raise Skip()
        typ = obj.get("type")
        if not isinstance(typ, str) or typ not in CANAL_OPS:
            raise Reject("unknown_op", f"type {typ!r}")
        mid = 0 if mid is None else mid  # a message without an id orders as id 0
        if not isinstance(es, int) or not isinstance(mid, int):
            raise Reject("malformed", "es missing, or es/id not a whole number")
        data, old = obj.get("data"), obj.get("old")
        if not isinstance(data, list) or not data:
            raise Reject("malformed", "data is not a non-empty array")
        mysql_types = obj.get("mysqlType") or {}
        hints = {c: (canal_type(str(t)), None) for c, t in mysql_types.items()}
        out = []
        for i, row in enumerate(data):
            o = old[i] if isinstance(old, list) and i < len(old) else None
            out.append(_Parsed(obj.get("database"), obj.get("table"), CANAL_OPS[typ],
                               row if isinstance(row, dict) else None,
                               old=o if typ == "UPDATE" and isinstance(o, dict) else None,
                               hints=hints, seq=(es, mid, i), commit_ts=ms_to_dt(es),
                               row_index=i))
        return out

    # ---------------------------------------------------------------- results

    def ordered_changes(self, table: str) -> list[Change]:
        return sorted((c for c in self.changes if c.table == table), key=lambda c: c.order)

    def scd1(self, table: str) -> dict[Key, Row]:
        """Expected live rows, each with ``_cdc_op`` and ``_cdc_commit_ts`` of its last change."""
        state: dict[Key, Row] = {}
        for ch in self.ordered_changes(table):
            if ch.op == "delete":
                state.pop(ch.key, None)
                continue
            if ch.old_key is not None:
                state.pop(ch.old_key, None)
            state[ch.key] = {**ch.row, "_cdc_op": ch.op, "_cdc_commit_ts": ch.commit_ts}
        return state

    def deleted_keys(self, table: str) -> set[Key]:
        """Keys whose last change is a delete (or a move away): they must stay deleted."""
        last: dict[Key, bool] = {}
        for ch in self.ordered_changes(table):
            if ch.op == "delete":
                last[ch.key] = True
            else:
                if ch.old_key is not None:
                    last[ch.old_key] = True
                last[ch.key] = False
        return {k for k, gone in last.items() if gone}

    def scd2(self, table: str) -> list[Row]:
        """Expected version rows (``_cdc_op``, ``_valid_from``, ``_valid_to``, ``_is_current``,
        plus ``_ref_seq``/``_ref_key`` for matching), in binlog order."""
        versions: list[Row] = []
        spec = self.config.tables[table]
        open_: dict[Key, int] = {}
        last: dict[Key, int] = {}

        def add(key: Key, row: Row, op: str, ch: Change) -> None:
            if key in open_:
                versions[open_.pop(key)].update(_valid_to=ch.commit_ts, _is_current=False)
            elif key in last and versions[last[key]]["_cdc_op"] == "delete":
                versions[last[key]]["_valid_to"] = ch.commit_ts
            current = op != "delete"
            versions.append({**row, **dict(zip(spec.keys, key, strict=True)), "_cdc_op": op,
                             "_cdc_commit_ts": ch.commit_ts, "_valid_from": ch.commit_ts,
                             "_valid_to": None, "_is_current": current,
                             "_ref_seq": ch.seq, "_ref_key": key})
            last[key] = len(versions) - 1
            if current:
                open_[key] = len(versions) - 1

        for ch in self.ordered_changes(table):
            if ch.old_key is not None:
                add(ch.old_key, ch.old_row or {}, "delete", ch)
            add(ch.key, ch.row, ch.op, ch)
        return versions


# ------------------------------------------------------------------------------------ compare

def values_equal(expected: Any, actual: Any) -> bool:
    """Typed equality: a date is not a string, a Decimal is not a float; naive datetimes are UTC."""
    if expected is None or actual is None:
        return expected is None and actual is None
    if isinstance(expected, bool):
        return isinstance(actual, bool) and expected == actual
    if isinstance(expected, int):
        return type(actual) is int and expected == actual
    if isinstance(expected, Decimal):
        return isinstance(actual, Decimal) and expected == actual
    if isinstance(expected, datetime):
        if not isinstance(actual, datetime):
            return False
        norm = [d if d.tzinfo else d.replace(tzinfo=UTC) for d in (expected, actual)]
        return norm[0] == norm[1]
    if isinstance(expected, date):
        return type(actual) is date and expected == actual
    if isinstance(expected, float):
        return isinstance(actual, float) and abs(expected - actual) < 1e-9
    return type(expected) is type(actual) and expected == actual


def _show(v: Any) -> str:
    return f"{v!r}"


def _compare_row(label: str, expected: Row, actual: Row, ignore: set[str]) -> list[str]:
    out = []
    for col in sorted((set(expected) | set(actual)) - ignore):
        e, a = expected.get(col), actual.get(col)
        if not values_equal(e, a):
            out.append(f"  {label} {col}: expected {_show(e)}, got {_show(a)}")
    return out


def diff_table(expected: Mapping[Key, Row], actual_rows: Sequence[Row], keys: Sequence[str], *,
               table: str = "", compare: Iterable[str] = (), ignore: Iterable[str] = ()
               ) -> list[str]:
    """Readable differences between expected SCD1 rows and a Delta table's rows.

    ``_cdc_*`` and SCD2 bookkeeping columns are ignored unless named in ``compare``; columns
    missing on one side count as null; values must match in type (see :func:`values_equal`).
    """
    compare = set(compare)
    skip = ({*CDC_COLUMNS, *SCD2_COLUMNS, "_ref_seq", "_ref_key"} - compare) | set(ignore)
    actual: dict[Key, Row] = {}
    out: list[str] = []
    for r in actual_rows:
        k = tuple(r.get(c) for c in keys)
        if k in actual:
            out.append(f"  duplicate key {k}")
        actual[k] = r
    missing = [k for k in expected if k not in actual]
    extra = [k for k in actual if k not in expected]
    for k in sorted(missing, key=repr):
        out.append(f"  missing key {k}: expected {_strip(expected[k], skip)}")
    for k in sorted(extra, key=repr):
        out.append(f"  extra key {k}: got {_strip(actual[k], skip)}")
    for k in sorted((k for k in expected if k in actual), key=repr):
        out += _compare_row(f"key {k}", expected[k], actual[k], skip)
    if out:
        out.insert(0, f"table {table or '?'}: {len(missing)} missing, {len(extra)} extra, "
                      f"{len(expected)} expected rows, {len(actual_rows)} actual rows")
    return out


def _strip(row: Row, skip: set[str]) -> Row:
    return {c: v for c, v in row.items() if c not in skip}


def diff_scd2(expected: Sequence[Row], actual_rows: Sequence[Row], keys: Sequence[str], *,
              table: str = "", strict_delete_rows: bool = False) -> list[str]:
    """Compare SCD2 version rows per key, matched in ``_cdc_seq`` order.

    Checked per version: ``_cdc_op`` (delete vs not), ``_is_current``, ``_valid_from``, data
    columns, and ``_valid_to`` of non-delete versions. Delete versions are checked on key,
    op and validity start only unless ``strict_delete_rows`` (the contract does not say what
    else a delete row holds).
    """
    out: list[str] = []
    exp_by: dict[Key, list[Row]] = {}
    for r in expected:
        exp_by.setdefault(r["_ref_key"], []).append(r)
    act_by: dict[Key, list[Row]] = {}
    for r in actual_rows:
        act_by.setdefault(tuple(r.get(c) for c in keys), []).append(r)
    meta = {*CDC_COLUMNS, *SCD2_COLUMNS, "_ref_seq", "_ref_key"}
    for k in sorted(set(exp_by) | set(act_by), key=repr):
        exp = exp_by.get(k, [])
        act = sorted(act_by.get(k, []), key=lambda r: str(r.get("_cdc_seq")))
        if len(exp) != len(act):
            out.append(f"  key {k}: expected {len(exp)} versions "
                       f"{[e['_cdc_op'] for e in exp]}, got {len(act)} "
                       f"{[a.get('_cdc_op') for a in act]}")
            continue
        current = [a for a in act if a.get("_is_current")]
        if len(current) > 1:
            out.append(f"  key {k}: {len(current)} current rows")
        for i, (e, a) in enumerate(zip(exp, act, strict=True)):
            label = f"key {k} v{i}"
            if (e["_cdc_op"] == "delete") != (a.get("_cdc_op") == "delete"):
                out.append(f"  {label} _cdc_op: expected {e['_cdc_op']!r}, got {a.get('_cdc_op')!r}")
                continue
            for col in ("_is_current", "_valid_from"):
                if not values_equal(e[col], a.get(col)):
                    out.append(f"  {label} {col}: expected {_show(e[col])}, got {_show(a.get(col))}")
            is_delete = e["_cdc_op"] == "delete"
            if not is_delete and not values_equal(e["_valid_to"], a.get("_valid_to")):
                out.append(f"  {label} _valid_to: expected {_show(e['_valid_to'])}, "
                           f"got {_show(a.get('_valid_to'))}")
            if not is_delete or strict_delete_rows:
                out += _compare_row(label, e, a, meta)
    if out:
        out.insert(0, f"scd2 table {table or '?'}: {len(expected)} expected versions, "
                      f"{len(actual_rows)} actual")
    return out


def assert_no_diff(diff: list[str], limit: int = 40) -> None:
    if diff:
        more = f"\n  ... {len(diff) - limit} more" if len(diff) > limit else ""
        raise AssertionError("\n".join(diff[:limit]) + more)


def assert_table_equals(expected: Mapping[Key, Row], actual_rows: Sequence[Row],
                        keys: Sequence[str], **kwargs: Any) -> None:
    assert_no_diff(diff_table(expected, actual_rows, keys, **kwargs))


def read_delta_rows(path: Path | str) -> list[Row]:
    """All rows of a Delta table (empty list if there is no table at ``path``)."""
    from deltalake import DeltaTable  # comparison tooling only

    if not (Path(path) / "_delta_log").is_dir():
        return []
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def quarantine_entries(model: ReferenceModel) -> set[tuple[str, str]]:
    """(file name, raw line) of every expected quarantine record, deduplicated."""
    return {(Path(q.source_file).name, q.raw_line.strip()) for q in model.quarantine}
