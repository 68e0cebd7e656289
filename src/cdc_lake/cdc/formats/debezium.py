"""Debezium (MySQL/MariaDB connector) JSON, with or without the ``{schema, payload}`` wrapper.

Order is (``source.file``, ``source.pos``, snapshot-before-stream, ``source.row``); commit time is
``source.ts_ms``. A literal ``null`` line (Kafka tombstone after a delete) is skipped, not an error.
Schema-change events (``ddl`` field) go to the DDL log. With the schema wrapper, each column's
Connect type / logical name (e.g. ``io.debezium.time.Date``, ``...connect.data.Decimal:2``) is
passed on as a type hint so values are decoded to real types.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_lake.cdc.events import binlog_file_number, pad, select_normalized, vget

_FIELDS = ("array<struct<field:string,type:string,name:string,parameters:map<string,string>,"
           "fields:array<struct<field:string,type:string,name:string,"
           "parameters:map<string,string>>>>>")
_OPS = {"c": "insert", "u": "update", "d": "delete", "r": "snapshot"}


def parse(lines: DataFrame) -> DataFrame:
    v = F.try_parse_json("_line")
    df = lines.select("_file", "_line", v.alias("v"))
    wrapped = vget(F.col("v"), "$.payload").isNotNull() & vget(F.col("v"), "$.schema").isNotNull()
    df = df.withColumn("env", F.when(wrapped, vget(F.col("v"), "$.payload")).otherwise(F.col("v")))
    hints = F.expr(
        f"map_from_entries(transform(filter(try_variant_get(v, '$.schema.fields', '{_FIELDS}'),"
        " x -> x.field = 'after')[0].fields,"
        " f -> struct(f.field, concat_ws(':', coalesce(f.name, f.type), f.parameters['scale'],"
        " f.parameters['connect.decimal.precision']))))")
    env = F.col("env")
    raw_op = vget(env, "$.op", "string")
    op = F.create_map(*[x for k, o in _OPS.items() for x in (F.lit(k), F.lit(o))])[raw_op]
    ddl = vget(env, "$.ddl", "string")
    src_file = vget(env, "$.source.file", "string")
    pos = vget(env, "$.source.pos", "bigint")
    row_no = F.coalesce(vget(env, "$.source.row", "bigint"), F.lit(0))
    snapshot_rank = F.when(raw_op == "r", F.lit("0")).otherwise(F.lit("1"))
    seq = F.concat_ws(".", pad(binlog_file_number(src_file), 10), pad(pos, 20), snapshot_rank,
                      pad(row_no, 10))
    kind = (F.when(F.col("v").isNull(), "row")  # malformed: routed by _error
            .when(F.is_variant_null("v"), "skip")
            .when(ddl.isNotNull(), "ddl")
            .when(raw_op == "t", "ddl")
            .otherwise("row"))
    error = (F.when(F.col("v").isNull(), F.lit("malformed JSON"))
             .when(kind != "row", F.lit(None))
             .when(raw_op.isNull(), F.lit("missing op"))
             .when(op.isNull(), F.concat(F.lit("unknown op "), F.to_json(vget(env, "$.op"))))
             .when(vget(env, "$.source.table", "string").isNull(), F.lit("missing source.table"))
             .when(src_file.isNull() | pos.isNull(),
                   F.lit("missing binlog position (source.file/source.pos)"))
             .when(F.when(raw_op == "d", vget(env, "$.before")).otherwise(vget(env, "$.after"))
                   .isNull() | F.is_variant_null(
                       F.when(raw_op == "d", vget(env, "$.before")).otherwise(vget(env, "$.after"))),
                   F.concat(F.lit("missing row image for op "), raw_op)))
    table_from_ddl = F.regexp_extract(vget(env, "$.tableChanges[0].id", "string"), r"([^.\"`]+)\"?$", 1)
    return select_normalized(df.select(
        "_file", "_line",
        error.alias("_error"),
        kind.alias("_kind"),
        F.coalesce(vget(env, "$.source.db", "string"), vget(env, "$.databaseName", "string")).alias("db"),
        F.coalesce(vget(env, "$.source.table", "string"), F.nullif(table_from_ddl, F.lit(""))).alias("tbl"),
        op.alias("op"),
        seq.alias("seq"),
        F.timestamp_millis(vget(env, "$.source.ts_ms", "bigint")).alias("commit_ts"),
        F.when(raw_op == "d", vget(env, "$.before")).otherwise(vget(env, "$.after")).alias("row"),
        vget(env, "$.before").alias("old"),
        F.lit(None).cast("array<string>").alias("pk_names"),
        hints.alias("type_hints"),
        F.when(raw_op == "t", F.lit("truncate")).when(ddl.isNotNull(), F.lit("schema-change"))
         .when(F.is_variant_null("v"), F.lit("kafka-tombstone")).alias("ddl_type"),
        F.when(raw_op == "t", F.lit("TRUNCATE")).otherwise(ddl).alias("ddl_sql"),
    ))
