"""Canal flat-message JSON: several rows per message (``data[i]`` pairs with ``old[i]``).

Canal carries no binlog file/offset, so order is (``es`` binlog ms, message ``id``, row index):
two changes of one key must differ in ``es`` or ``id`` to be ordered (true for real Canal output,
whose ``id`` grows per message). Values are strings; ``mysqlType`` gives each column's type.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_lake.cdc.events import pad, select_normalized, vget

_OPS = {"INSERT": "insert", "UPDATE": "update", "DELETE": "delete"}


def parse(lines: DataFrame) -> DataFrame:
    df = lines.select("_file", "_line", F.try_parse_json("_line").alias("v"))
    v = F.col("v")
    is_ddl = F.coalesce(vget(v, "$.isDdl", "boolean"), F.lit(False))
    rows = F.when(~is_ddl, vget(v, "$.data", "array<variant>"))
    df = df.select("*", F.posexplode_outer(rows).alias("ridx", "r"))
    typ = vget(v, "$.type", "string")
    op = F.create_map(*[x for k, o in _OPS.items() for x in (F.lit(k), F.lit(o))])[F.upper(typ)]
    es = vget(v, "$.es", "bigint")
    mid = F.coalesce(vget(v, "$.id", "bigint"), F.lit(0))
    seq = F.concat_ws(".", pad(es, 16), pad(mid, 20), pad(F.coalesce("ridx", F.lit(0)), 8))
    kind = F.when(v.isNull(), "row").when(is_ddl, "ddl").otherwise("row")
    old = F.element_at(vget(v, "$.old", "array<variant>"), F.col("ridx") + 1)
    error = (F.when(v.isNull(), F.lit("malformed JSON"))
             .when(kind != "row", F.lit(None))
             .when(typ.isNull(), F.lit("missing type"))
             .when(op.isNull(), F.concat(F.lit("unknown type "), F.to_json(vget(v, "$.type"))))
             .when(vget(v, "$.table", "string").isNull(), F.lit("missing table"))
             .when(es.isNull(), F.lit("missing es (binlog time)"))
             .when(F.col("r").isNull() | F.is_variant_null("r"), F.lit("missing data rows")))
    return select_normalized(df.select(
        "_file", "_line",
        error.alias("_error"), kind.alias("_kind"),
        vget(v, "$.database", "string").alias("db"),
        vget(v, "$.table", "string").alias("tbl"),
        op.alias("op"), seq.alias("seq"),
        F.timestamp_millis(es).alias("commit_ts"),
        F.col("r").alias("row"),
        old.alias("old"),
        vget(v, "$.pkNames", "array<string>").alias("pk_names"),
        vget(v, "$.mysqlType", "map<string,string>").alias("type_hints"),
        F.when(is_ddl, typ).alias("ddl_type"),
        vget(v, "$.sql", "string").alias("ddl_sql"),
    ))
