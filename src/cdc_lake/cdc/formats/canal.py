"""Canal flat-message JSON: several rows per message (``data[i]`` pairs with ``old[i]``).

Canal carries no binlog file/offset. Order is (``es`` binlog time, message ``id``, the message's
ordinal among the messages of its landing file with the same ``es`` and ``id``, row index):
Canal's ``id`` is the client batch id, shared by every message of one batch, and ``es`` has
second precision, so two changes of one row in one transaction differ only in their place in
the file, which is the binlog order. The ordinal is filled in per micro-batch by
:func:`cdc_lake.cdc.events.finalize_order`; it depends on the file's content only, so a
re-delivered copy of a file yields the same sequence values (and no new SCD2 versions).

``INSERT``/``UPDATE``/``DELETE`` are changes; ``INIT`` (the initial full load) is a snapshot row,
ordered before a stream change with the same ``es`` and ``id``. Values are strings;
``mysqlType`` gives each column's type. ``isDdl`` messages go to the DDL log.

Example::

    events = parse(lines)  # lines: DataFrame[_file, _line]; columns of events.COLUMNS + _pos
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_lake.cdc.events import (ORDER_COLUMN, ORDINAL, commit_time, json_failure,
                                 line_position, order_range_error, pad, parse_line,
                                 select_normalized, vget)

_OPS = {"INSERT": "insert", "UPDATE": "update", "DELETE": "delete", "INIT": "snapshot"}


def parse(lines: DataFrame) -> DataFrame:
    df = lines.select("_file", "_line", line_position().alias(ORDER_COLUMN),
                      parse_line(F.col("_line")).alias("v"))
    v = F.col("v")
    is_ddl = F.coalesce(vget(v, "$.isDdl", "boolean"), F.lit(False))
    rows = F.when(~is_ddl, vget(v, "$.data", "array<variant>"))
    df = df.select("*", F.posexplode_outer(rows).alias("ridx", "r"))
    typ = vget(v, "$.type", "string")
    op = F.create_map(*[x for k, o in _OPS.items() for x in (F.lit(k), F.lit(o))])[F.upper(typ)]
    es = vget(v, "$.es", "bigint")
    mid = F.coalesce(vget(v, "$.id", "bigint"), F.lit(0))
    snapshot_rank = F.when(op == "snapshot", F.lit("0")).otherwise(F.lit("1"))
    # 'V' marks this layout (older layouts began with a digit: they sort before it).
    seq = F.concat_ws(".", F.lit("V"), pad(es, 16), pad(mid, 20), snapshot_rank,
                      F.when(is_ddl, F.lit("00000000")).otherwise(F.lit(ORDINAL)),
                      pad(F.coalesce("ridx", F.lit(0)), 8))
    # a value its slot cannot hold would order wrongly (cut, or negative): an error instead
    range_error = order_range_error(("es", es, 16), ("id", mid, 20))
    commit_ts, es_error = commit_time(es, "ms", "es")
    kind = F.when(v.isNull(), "row").when(is_ddl, "ddl").otherwise("row")
    olds = vget(v, "$.old", "array<variant>")
    # try_: a message whose `old` holds fewer rows than `data` failed the whole run (ANSI
    # element_at out of bounds, exit 1, every later run too); such a message is quarantined
    old = F.try_element_at(olds, F.col("ridx") + 1)
    rows_n = F.size(vget(v, "$.data", "array<variant>"))
    error = (F.when(v.isNull(), json_failure(F.col("_line")))
             .when(kind != "row", F.lit(None))
             .when(typ.isNull(), F.lit("missing type"))
             .when(op.isNull(), F.concat(F.lit("unknown type "), F.to_json(vget(v, "$.type"))))
             .when(vget(v, "$.table", "string").isNull(), F.lit("missing table"))
             .when(es.isNull(), F.lit("missing es (binlog time)"))
             .when(F.col("r").isNull() | F.is_variant_null("r"), F.lit("missing data rows"))
             # (ridx: Spark's arrays stop below 10**8 rows)
             .when(es_error.isNotNull(), es_error)
             .when(range_error.isNotNull(), range_error)
             .when(olds.isNotNull() & (F.size(olds) != rows_n),
                   F.format_string("old holds %d rows for the %d rows of data (old[i] pairs with "
                                   "data[i])", F.size(olds), rows_n)))
    return select_normalized(df.select(
        "_file", "_line", ORDER_COLUMN,
        error.alias("_error"), kind.alias("_kind"),
        vget(v, "$.database", "string").alias("db"),
        vget(v, "$.table", "string").alias("tbl"),
        op.alias("op"), seq.alias("seq"),
        commit_ts.alias("commit_ts"),
        F.col("r").alias("row"),
        old.alias("old"),
        vget(v, "$.pkNames", "array<string>").alias("pk_names"),
        vget(v, "$.mysqlType", "map<string,string>").alias("type_hints"),
        F.when(is_ddl, typ).alias("ddl_type"),
        vget(v, "$.sql", "string").alias("ddl_sql"),
    ), ordered=True)
