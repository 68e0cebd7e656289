"""Column types the formats state: Canal ``mysqlType``, Debezium's schema wrapper.

:func:`from_canal` / :func:`from_debezium` map one hint to a Spark type and its decoder;
:func:`hinted` takes every hint a micro-batch's events carry for one column. Events of one
batch can state different types for a column (a source-side ``ALTER`` between them: Debezium
``Decimal`` scale 2, then 4; ``Timestamp`` in ms, then ``MicroTimestamp`` in µs). The column
then gets the lossless merge of their types, and each event's value is decoded by its own
event's hint (:attr:`ColumnType.by_hint`): decoding every value with one hint's scale or unit
stored -0.05 as -0.0005 and 2024 as 1970 (tester).

Example::

    hinted(("org.apache.kafka.connect.data.Decimal:2:10", "org.apache.kafka.connect.data.Decimal:4:12"),
           "debezium")
    # ColumnType(sql="decimal(12,4)", decoder="b64_decimal", scale=2, by_hint=(... scale 2 ..., ... scale 4 ...))
"""

from __future__ import annotations

import re
from dataclasses import replace

from cdc_lake.cdc.column_types import ColumnType
from cdc_lake.cdc.widening import widen


def hinted(hints: tuple[str, ...], fmt: str) -> ColumnType | None:
    """The column type stated by the hints a batch carries for one column (``None``: no hint
    names a known type). Several hints: their types merged losslessly (``widening.widen``);
    where their decoders or scales differ, the type lists each hint's decoder in ``by_hint`` for
    :func:`cdc_lake.cdc.column_types.decode`. A hint whose type has no lossless merge with the
    others (``date`` and ``timestamp``, ``bigint`` and a ``MicroTimestamp``, ``double`` and a
    ``Decimal``): the column keeps the first hint's type, and the values of that hint are cast
    into it with the usual exactness check where both decode plainly (Canal ``int`` and
    ``varchar``), decoded by their own decoder within one type family (two decimals: an inexact
    value is refused by the decoder), and refused otherwise (``refuse``: quarantined as not
    valid; decoded and cast they were stored changed: a timestamp cut to its date, µs read as
    seconds, a decimal rounded to a double — tester)."""
    one = from_canal if fmt == "canal" else from_debezium
    known = [(h, t) for h in sorted(set(hints)) if (t := one(h)) is not None]
    if not known:
        return None
    first = known[0][1]
    sql = first.sql
    ways = [(known[0][0], first.decoder, first.scale)]
    for h, t in known[1:]:
        merged = _merged(sql, t.sql)
        if merged is not None:
            sql = merged
            ways.append((h, t.decoder, t.scale))
        elif first.decoder == "plain" and t.decoder == "plain":
            ways.append((h, "plain", 0))  # cast, then checked value by value (changes.py)
        elif _family(t.sql) == _family(first.sql):
            ways.append((h, t.decoder, t.scale))
        else:
            ways.append((h, "refuse", 0))
    if len({(d, sc) for _, d, sc in ways}) == 1:
        return replace(first, sql=sql)
    return replace(first, sql=sql, by_hint=tuple(ways))


def _family(sql: str) -> str:
    return re.sub(r"\(.*", "", sql)


def _merged(a: str, b: str) -> str | None:
    """The type holding every value of ``a`` and ``b`` exactly (``None``: none does)."""
    if a == b:
        return a
    wider = widen(a, b)
    if wider is not None:
        return wider
    return a if widen(b, a) is not None else None  # ``a`` already holds ``b`` (else: unrelated)


def from_canal(mysql_type: str) -> ColumnType | None:
    """Spark type for a Canal ``mysqlType`` (see docs/formats.md, "Type rules").

    Every MySQL integer type is ``bigint`` (``BIGINT UNSIGNED``: ``decimal(20,0)``), as in the
    other formats, so a table keeps its types when the producer changes.
    """
    t = mysql_type.lower().strip()
    unsigned = "unsigned" in t
    base = re.sub(r"\s*(unsigned|zerofill)\s*", "", t)
    name = re.sub(r"\(.*", "", base)
    if name in ("tinyint", "smallint", "mediumint", "int", "integer", "year"):
        return ColumnType("bigint")
    if name == "bigint":
        return ColumnType("decimal(20,0)" if unsigned else "bigint")
    if name in ("decimal", "numeric"):
        m = re.match(r"^\w+\((\d+)(?:\s*,\s*(\d+))?\)", base)
        p, s = (int(m.group(1)), int(m.group(2) or 0)) if m else (38, 10)
        return ColumnType(f"decimal({min(p, 38)},{min(s, 38)})")
    if name in ("float", "double", "real"):
        return ColumnType("double")
    if name == "date":
        return ColumnType("date")
    if name in ("datetime", "timestamp"):
        return ColumnType("timestamp")
    if name == "json":
        return ColumnType("string", "json")
    if name in ("char", "varchar", "text", "tinytext", "mediumtext", "longtext", "enum", "set",
                "time", "bit", "binary", "varbinary", "blob", "tinyblob", "mediumblob",
                "longblob"):
        return ColumnType("string")
    return None


_STRING = ColumnType("string")
_JSON = ColumnType("string", "json")
# Kafka Connect schema types as the JSON converter writes them (int8..int64, float/double,
# also float32/float64 as some tools spell them) and logical types by their schema name.
_DEBEZIUM = {
    "int8": ColumnType("bigint"), "int16": ColumnType("bigint"), "int32": ColumnType("bigint"),
    "int64": ColumnType("bigint"),
    "float": ColumnType("double"), "float32": ColumnType("double"),
    "double": ColumnType("double"), "float64": ColumnType("double"),
    "boolean": ColumnType("boolean"), "string": _STRING, "bytes": _STRING,
    "array": _JSON, "map": _JSON, "struct": _JSON,
    "io.debezium.time.Date": ColumnType("date", "epoch_days"),
    "org.apache.kafka.connect.data.Date": ColumnType("date", "epoch_days"),
    "io.debezium.time.Timestamp": ColumnType("timestamp", "epoch_ms"),
    "org.apache.kafka.connect.data.Timestamp": ColumnType("timestamp", "epoch_ms"),
    "io.debezium.time.MicroTimestamp": ColumnType("timestamp", "epoch_us"),
    "io.debezium.time.NanoTimestamp": ColumnType("timestamp", "epoch_ns"),
    "io.debezium.time.ZonedTimestamp": ColumnType("timestamp"),
    "io.debezium.time.Time": ColumnType("string", "time_ms"),
    "org.apache.kafka.connect.data.Time": ColumnType("string", "time_ms"),
    "io.debezium.time.MicroTime": ColumnType("string", "time_us"),
    "io.debezium.time.NanoTime": ColumnType("string", "time_ns"),
    "io.debezium.time.ZonedTime": _STRING,
    "io.debezium.time.Year": ColumnType("bigint"),
    "io.debezium.time.MicroDuration": ColumnType("bigint"),
    "io.debezium.time.Interval": _STRING,
    "io.debezium.data.Json": _JSON,
    "io.debezium.data.Enum": _STRING, "io.debezium.data.EnumSet": _STRING,
    "io.debezium.data.Uuid": _STRING, "io.debezium.data.Xml": _STRING,
    "io.debezium.data.Bits": _STRING, "io.debezium.data.Ltree": _STRING,
    "io.debezium.data.VariableScaleDecimal": _JSON,
}


def from_debezium(hint: str) -> ColumnType | None:
    """Spark type for a Debezium schema field hint ``name[:scale[:precision[:type]]]``.

    ``name`` is the logical schema name (or the Connect type when there is none); an unknown
    logical name falls back to the field's Connect ``type``. The stated schema always wins over
    guessing from values: ``double`` stays ``double`` at full precision.
    """
    name, scale, precision, base = (hint.split(":") + ["", "", ""])[:4]
    if name == "org.apache.kafka.connect.data.Decimal":
        if scale and not (scale.isdigit() and int(scale) <= 38):
            return None  # a scale Spark cannot hold (or not a number): typed by its values
        s = int(scale or 0)
        p = int(precision) if precision.isdigit() and s <= int(precision) <= 38 else 38
        return ColumnType(f"decimal({p},{s})", "b64_decimal", s)
    if name.startswith("io.debezium.data.geometry."):
        return _JSON
    return _DEBEZIUM.get(name) or _DEBEZIUM.get(base)
