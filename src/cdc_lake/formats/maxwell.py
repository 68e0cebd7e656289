"""Maxwell's Daemon JSON.

Order is (binlog file, offset, ``xoffset``) from ``position`` when present, else (``ts``, ``xid``,
``xoffset``). ``data`` is the full row (the deleted row for deletes); ``old`` holds previous values
of changed columns only, so a primary-key change shows up as an ``update`` whose ``old`` carries
the old key. DDL types (``table-alter``...) go to the DDL log; ``bootstrap-start``/``-complete``
are markers and are skipped (counted), ``bootstrap-insert`` is a snapshot row.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_lake.events import binlog_file_number, pad, select_normalized, vget

_OPS = {"insert": "insert", "update": "update", "delete": "delete", "bootstrap-insert": "snapshot"}
_MARKERS = ("bootstrap-start", "bootstrap-complete")


def parse(lines: DataFrame) -> DataFrame:
    df = lines.select("_file", "_line", F.try_parse_json("_line").alias("v"))
    v = F.col("v")
    typ = vget(v, "$.type", "string")
    op = F.create_map(*[x for k, o in _OPS.items() for x in (F.lit(k), F.lit(o))])[typ]
    position = vget(v, "$.position", "string")
    pos_file = F.regexp_extract(position, r"^(.*):(\d+)$", 1)
    pos_off = F.regexp_extract(position, r"^(.*):(\d+)$", 2)
    xoffset = F.coalesce(vget(v, "$.xoffset", "bigint"), F.lit(0))
    ts = vget(v, "$.ts", "bigint")
    seq = (F.when(pos_off != "", F.concat_ws(".", F.lit("P"), pad(binlog_file_number(pos_file), 10),
                                              pad(pos_off, 20), pad(xoffset, 10)))
           .when(ts.isNotNull(), F.concat_ws(".", F.lit("T"), pad(ts, 12),
                                             pad(F.coalesce(vget(v, "$.xid", "bigint"), F.lit(0)), 20),
                                             pad(xoffset, 10))))
    is_ddl = typ.contains("-") & ~typ.startswith("bootstrap")
    kind = (F.when(v.isNull(), "row").when(typ.isin(*_MARKERS), "skip")
            .when(is_ddl, "ddl").otherwise("row"))
    data = vget(v, "$.data")
    error = (F.when(v.isNull(), F.lit("malformed JSON"))
             .when(kind != "row", F.lit(None))
             .when(typ.isNull(), F.lit("missing type"))
             .when(op.isNull(), F.concat(F.lit("unknown type "), F.to_json(vget(v, "$.type"))))
             .when(vget(v, "$.table", "string").isNull(), F.lit("missing table"))
             .when(seq.isNull(), F.lit("missing binlog order (position or ts)"))
             .when(data.isNull() | F.is_variant_null(data), F.lit("missing data")))
    return select_normalized(df.select(
        "_file", "_line",
        error.alias("_error"), kind.alias("_kind"),
        vget(v, "$.database", "string").alias("db"),
        vget(v, "$.table", "string").alias("tbl"),
        op.alias("op"), seq.alias("seq"),
        F.timestamp_seconds(ts).alias("commit_ts"),
        data.alias("row"),
        vget(v, "$.old").alias("old"),
        vget(v, "$.primary_key_columns", "array<string>").alias("pk_names"),
        F.lit(None).cast("map<string,string>").alias("type_hints"),
        F.when(kind != "row", typ).alias("ddl_type"),
        vget(v, "$.sql", "string").alias("ddl_sql"),
    ))
