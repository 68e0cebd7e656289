"""Canal flat-message JSON: several rows per message (``data[i]`` pairs with ``old[i]``).

Canal carries no binlog file/offset. Order is (``es`` binlog time, message ``id``, the message's
ordinal among the messages of its landing file with the same ``es`` and ``id``, row index):
Canal's ``id`` is the client batch id, shared by every message of one batch, and ``es`` has
second precision, so two changes of one row in one transaction differ only in their place in
the file, which is the binlog order. A message without ``id`` orders as id 0; an ``id`` that
is not a JSON whole number a bigint holds is an error. The ordinal is filled in
per micro-batch by :func:`cdc_lake.cdc.events.finalize_order`; it depends on the file's content only, so a
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
    # Projections kept apart (as in maxwell.parse): the message's fields are read once per
    # message, before its rows are exploded, and the derived columns refer to those reads
    # instead of re-evaluating them per row and in every CASE branch that uses them.
    df = lines.select("_file", "_line", line_position().alias(ORDER_COLUMN),
                      parse_line(F.col("_line")).alias("v"))
    v = F.col("v")
    df = df.select(
        "_file", "_line", ORDER_COLUMN, "v",
        F.coalesce(vget(v, "$.isDdl", "boolean"), F.lit(False)).alias("is_ddl"),
        vget(v, "$.type", "string").alias("typ"),
        vget(v, "$.es", "bigint").alias("es"),
        vget(v, "$.id").alias("id_v"),
        F.coalesce(vget(v, "$.id", "bigint"), F.lit(0)).alias("mid"),
        vget(v, "$.table", "string").alias("tbl"),
        vget(v, "$.database", "string").alias("db"),
        vget(v, "$.pkNames", "array<string>").alias("pk_names"),
        vget(v, "$.mysqlType", "map<string,string>").alias("type_hints"),
        vget(v, "$.sql", "string").alias("ddl_sql"),
        vget(v, "$.data", "array<variant>").alias("rows"),
        vget(v, "$.old", "array<variant>").alias("olds"))
    is_ddl, typ, es, mid, olds = (F.col(c) for c in ("is_ddl", "typ", "es", "mid", "olds"))
    rows_n = F.size("rows")
    df = df.select("*", rows_n.alias("rows_n"),
                   F.posexplode_outer(F.when(~is_ddl, F.col("rows"))).alias("ridx", "r"))
    op = F.create_map(*[x for k, o in _OPS.items() for x in (F.lit(k), F.lit(o))])[F.upper(typ)]
    snapshot_rank = F.when(op == "snapshot", F.lit("0")).otherwise(F.lit("1"))
    # 'V' marks this layout (older layouts began with a digit: they sort before it).
    seq = F.concat_ws(".", F.lit("V"), pad(es, 16), pad(mid, 20), snapshot_rank,
                      F.when(is_ddl, F.lit("00000000")).otherwise(F.lit(ORDINAL)),
                      pad(F.coalesce("ridx", F.lit(0)), 8))
    # a value its slot cannot hold would order wrongly (cut, or negative): an error instead
    range_error = order_range_error(("es", es, 16), ("id", mid, 20))
    commit_ts, es_error = commit_time(es, "ms", "es")
    kind = F.when(v.isNull(), "row").when(is_ddl, "ddl").otherwise("row")
    # try_: a message whose `old` holds fewer rows than `data` failed the whole run (ANSI
    # element_at out of bounds, exit 1, every later run too); such a message is quarantined
    old = F.try_element_at(olds, F.col("ridx") + 1)
    df = df.select("*", op.alias("op"), seq.alias("seq"), kind.alias("_kind"),
                   range_error.alias("range_error"), commit_ts.alias("commit_ts"),
                   es_error.alias("es_error"), old.alias("old"))
    rows_n = F.col("rows_n")
    error = (F.when(v.isNull(), json_failure(F.col("_line")))
             .when(F.col("_kind") != "row", F.lit(None))
             .when(typ.isNull(), F.lit("missing type"))
             .when(F.col("op").isNull(), F.concat(F.lit("unknown type "), F.to_json(vget(v, "$.type"))))
             .when(F.col("tbl").isNull(), F.lit("missing table"))
             .when(es.isNull(), F.lit("missing es (binlog time)"))
             # present but not a JSON whole number a bigint holds: read as a bigint, the message
             # ordered as id 0 (too big) or as a cut or converted value (1.5, "7", true), exit 0
             .when(F.col("id_v").isNotNull() & ~F.is_variant_null("id_v")
                   & (F.schema_of_variant("id_v") != "BIGINT"),
                   F.concat(F.lit("id is not a whole number up to 9223372036854775807: "),
                            F.to_json(F.col("id_v"))))
             .when(F.col("r").isNull() | F.is_variant_null("r"), F.lit("missing data rows"))
             # (ridx: Spark's arrays stop below 10**8 rows)
             .when(F.col("es_error").isNotNull(), F.col("es_error"))
             .when(F.col("range_error").isNotNull(), F.col("range_error"))
             .when(olds.isNotNull() & (F.size(olds) != rows_n),
                   F.format_string("old holds %d rows for the %d rows of data (old[i] pairs with "
                                   "data[i])", F.size(olds), rows_n)))
    return select_normalized(df.select(
        "_file", "_line", ORDER_COLUMN,
        error.alias("_error"), "_kind", "db", "tbl", "op", "seq", "commit_ts",
        F.col("r").alias("row"), "old", "pk_names", "type_hints",
        F.when(is_ddl, typ).alias("ddl_type"), "ddl_sql",
    ), ordered=True)
