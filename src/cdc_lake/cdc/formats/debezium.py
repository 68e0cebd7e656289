"""Debezium JSON (MySQL/MariaDB and PostgreSQL connectors), with or without ``{schema, payload}``.

Order, MySQL/MariaDB: (``source.file``, ``source.pos``, snapshot-before-stream, ``source.row``).
PostgreSQL (``source.lsn``, no binlog file/pos): (``source.lsn``, snapshot-before-stream,
``source.txId``). Snapshot rows (op ``r``, or op ``c`` with ``source.snapshot`` ``true``/``last``/
``first``/...) get op ``snapshot``; they share the connector position, so they sort before the
stream changes at that position and, among themselves, by a hash of the row image (stable on
re-delivery). Commit time is ``source.ts_ms``, or the envelope ``ts_ms`` when that is 0/absent
(snapshot rows of some versions). A literal ``null`` line (Kafka tombstone) is skipped.
Schema-change events (``ddl`` field) go to the DDL log. With the schema wrapper, each column's
Connect type / logical name is passed on as a type hint ``name:scale:precision:type`` (e.g.
``io.debezium.time.Date:::int32``, ``org.apache.kafka.connect.data.Decimal:2:10:bytes``,
``double:::double``) so values are decoded to the stated types
(:func:`cdc_lake.cdc.type_hints.from_debezium`).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_lake.cdc.events import (binlog_file_number, commit_time, json_failure,
                                 order_range_error, pad, parse_line, select_normalized, vget)

# a Connect schema's field list: each field's name, type, logical name and parameters
_COLUMNS = "array<struct<field:string,type:string,name:string,parameters:map<string,string>>>"
# the envelope's fields (before, after, source, ...), each with its own field list
_FIELDS = f"array<struct<field:string,type:string,name:string,parameters:map<string,string>,fields:{_COLUMNS}>>"
_OPS = {"c": "insert", "u": "update", "d": "delete", "r": "snapshot"}
_SNAPSHOT_VALUES = ("true", "last", "first", "first_in_data_collection", "last_in_data_collection",
                    "incremental")


def parse(lines: DataFrame) -> DataFrame:
    # Projections kept apart (as in maxwell.parse): each field is read from the parsed line once,
    # and the derived columns refer to those reads. As one projection, Spark re-evaluated the
    # reads (and the binlog file name's regex) in every CASE branch that used them.
    v = parse_line(F.col("_line"))
    df = lines.select("_file", "_line", v.alias("v")).select(
        "_file", "_line", "v",
        vget(F.col("v"), "$.payload").alias("payload"),
        # (reading $.schema itself copies the whole schema out of the line: only when the
        # wrapper's schema has no type, as no Connect schema does)
        (vget(F.col("v"), "$.schema.type", "string").isNotNull()
         | vget(F.col("v"), "$.schema").isNotNull()).alias("has_schema"),
        # Connect lists the envelope's fields as before, after, source, ...: the 'after' field
        # is read directly where it is second (and the first is not also 'after'); casting the
        # whole fields list (before, source, ...) per line cost a 94k-line batch 4 of 16 s
        vget(F.col("v"), "$.schema.fields[0].field", "string").alias("f0"),
        vget(F.col("v"), "$.schema.fields[1].field", "string").alias("f1"),
        vget(F.col("v"), "$.schema.fields[1].fields", _COLUMNS).alias("f1_fields"))
    # try_element_at: a schema without an 'after' field (schema-change records) gives null
    any_after = F.expr(f"try_element_at(filter(try_variant_get(v, '$.schema.fields', '{_FIELDS}'),"
                       " x -> x.field = 'after'), 1).fields")
    after_fields = (F.when((F.col("f1") == "after") & F.coalesce(F.col("f0") != "after", F.lit(True)),
                           F.col("f1_fields")).otherwise(any_after))
    env = F.when(F.col("payload").isNotNull() & F.col("has_schema"), F.col("payload")).otherwise(F.col("v"))
    df = df.select("_file", "_line", "v", after_fields.alias("after_fields"), env.alias("env"))
    env = F.col("env")
    df = df.select(
        "_file", "_line", "v", "after_fields", "env",
        vget(env, "$.op", "string").alias("raw_op"),
        F.lower(vget(env, "$.source.snapshot", "string")).alias("snap_flag"),
        vget(env, "$.ddl", "string").alias("ddl"),
        vget(env, "$.source.file", "string").alias("src_file"),
        vget(env, "$.source.pos", "bigint").alias("pos"),
        vget(env, "$.source.lsn", "bigint").alias("lsn"),
        F.coalesce(vget(env, "$.source.row", "bigint"), F.lit(0)).alias("row_no"),
        F.coalesce(vget(env, "$.source.txId", "bigint"), F.lit(0)).alias("tx"),
        vget(env, "$.source.ts_ms", "bigint").alias("src_ts"),
        vget(env, "$.ts_ms", "bigint").alias("env_ts"),
        # transaction metadata (provide.transaction.metadata): BEGIN/END records, not data
        (vget(env, "$.status", "string").isin("BEGIN", "END") & vget(env, "$.id").isNotNull()
         ).alias("tx_status"),
        vget(env, "$.source.table", "string").alias("src_table"),
        F.coalesce(vget(env, "$.source.db", "string"), vget(env, "$.databaseName", "string")).alias("db"),
        vget(env, "$.tableChanges[0].id", "string").alias("ddl_table_id"),
        vget(env, "$.before").alias("before"),
        vget(env, "$.after").alias("after"))
    names = F.transform(F.col("after_fields"), lambda f: f["field"])
    # a field listed twice (or without a name) would fail the whole run (duplicate/null map key)
    bad_schema = (F.size(F.array_distinct(F.array_compact(names))) < F.size(names))
    raw_op, ddl, src_file, pos, lsn = (F.col(c) for c in ("raw_op", "ddl", "src_file", "pos", "lsn"))
    is_snapshot = (raw_op == "r") | ((raw_op == "c") & F.col("snap_flag").isin(*_SNAPSHOT_VALUES))
    df = df.select(
        "*", is_snapshot.alias("is_snapshot"), bad_schema.alias("bad_schema"),
        binlog_file_number(src_file).alias("file_no"),
        (src_file.isNotNull() & pos.isNotNull()).alias("has_binlog"),
        F.when(raw_op == "d", F.col("before")).otherwise(F.col("after")).alias("image"))
    is_snapshot, file_no, has_binlog, image = (F.col(c) for c in ("is_snapshot", "file_no",
                                                                   "has_binlog", "image"))
    hints = F.when(~F.col("bad_schema"), F.expr(
        "map_from_entries(transform(after_fields,"
        " f -> struct(f.field, concat_ws(':', coalesce(f.name, f.type),"
        " coalesce(f.parameters['scale'], ''), coalesce(f.parameters['connect.decimal.precision'], ''),"
        " coalesce(f.type, '')))))"))
    op = F.when(is_snapshot, F.lit("snapshot")).otherwise(
        F.create_map(*[x for k, o in _OPS.items() for x in (F.lit(k), F.lit(o))])[raw_op])
    row_no, tx = F.col("row_no"), F.col("tx")
    snapshot_rank = F.when(is_snapshot, F.lit("0")).otherwise(F.lit("1"))
    # Snapshot rows share one position: a hash of the row image orders them deterministically.
    tiebreak = F.when(is_snapshot, F.concat(F.lit("."), F.lpad(F.hex(F.xxhash64(F.to_json(image))),
                                                                 16, "0")))
    mysql_seq = F.concat(F.concat_ws(".", pad(file_no, 10), pad(pos, 20),
                                     snapshot_rank, pad(row_no, 10)), F.coalesce(tiebreak, F.lit("")))
    pg_seq = F.concat(F.concat_ws(".", F.lit("L"), pad(lsn, 20), snapshot_rank, pad(tx, 20)),
                      F.coalesce(tiebreak, F.lit("")))
    seq = F.when(has_binlog, mysql_seq).when(lsn.isNotNull(), pg_seq)
    # a value its slot cannot hold would order wrongly (cut, or negative): an error instead
    range_error = (F.when(has_binlog, order_range_error(
                        ("source.file number", file_no, 10),
                        ("source.pos", pos, 20), ("source.row", row_no, 10)))
                   .when(lsn.isNotNull(), order_range_error(("source.lsn", lsn, 20),
                                                            ("source.txId", tx, 20))))
    src_ts = F.col("src_ts")
    commit_ms = F.coalesce(F.when(src_ts > 0, src_ts), F.col("env_ts"), src_ts)
    commit_ts, ts_error = commit_time(commit_ms, "ms", "source.ts_ms (else ts_ms)")
    kind = (F.when(F.col("v").isNull(), "row")  # malformed: routed by _error
            .when(F.is_variant_null("v"), "skip")
            .when(raw_op.isNull() & F.col("tx_status"), "skip")
            .when(ddl.isNotNull(), "ddl")
            .when(raw_op == "t", "ddl")
            .otherwise("row"))
    df = df.select("*", op.alias("op"), seq.alias("seq"), kind.alias("_kind"),
                   range_error.alias("range_error"), commit_ts.alias("commit_ts"),
                   ts_error.alias("ts_error"), hints.alias("type_hints"))
    error = (F.when(F.col("v").isNull(), json_failure(F.col("_line")))
             .when(F.col("_kind") != "row", F.lit(None))
             .when(raw_op.isNull(), F.lit("missing op"))
             .when(F.col("op").isNull(), F.concat(F.lit("unknown op "), F.to_json(vget(env, "$.op"))))
             .when(F.col("src_table").isNull(), F.lit("missing source.table"))
             .when(F.col("seq").isNull(),
                   F.lit("missing connector position: need source.file + source.pos (MySQL/"
                         "MariaDB) or source.lsn (PostgreSQL)"))
             .when(has_binlog & file_no.isNull(),
                   F.concat(F.lit("source.file does not end in a number (the number orders "
                                  "binlog files): "), F.to_json(vget(env, "$.source.file"))))
             .when(F.col("range_error").isNotNull(), F.col("range_error"))
             .when(F.col("ts_error").isNotNull(), F.col("ts_error"))
             .when(F.coalesce(F.col("bad_schema"), F.lit(False)),
                   F.concat(F.lit("the schema's after fields list a name twice or a field without "
                                  "a name: "), F.to_json(names)))
             .when(image.isNull() | F.is_variant_null(image),
                   F.concat(F.lit("missing row image for op "), raw_op))
             .when((raw_op != "d") & _unavailable_in(F.col("_line")), _unavailable_reason(image)))
    table_from_ddl = F.regexp_extract(F.col("ddl_table_id"), r"([^.\"`]+)\"?$", 1)
    return select_normalized(df.select(
        "_file", "_line",
        error.alias("_error"),
        "_kind",
        "db",
        F.coalesce(F.col("src_table"), F.nullif(table_from_ddl, F.lit(""))).alias("tbl"),
        "op", "seq", "commit_ts",
        image.alias("row"),
        F.col("before").alias("old"),
        F.lit(None).cast("array<string>").alias("pk_names"),
        "type_hints",
        F.when(raw_op == "t", F.lit("truncate")).when(ddl.isNotNull(), F.lit("schema-change"))
         .when(F.is_variant_null("v"), F.lit("kafka-tombstone")).alias("ddl_type"),
        F.when(raw_op == "t", F.lit("TRUNCATE")).otherwise(ddl).alias("ddl_sql"),
    ))


# Debezium's placeholder for a value the change event does not carry (PostgreSQL: a TOASTed
# column the UPDATE did not touch, REPLICA IDENTITY DEFAULT), as text and as base64 bytes.
UNAVAILABLE = ("__debezium_unavailable_value", "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==")


def _unavailable_in(line: Column) -> Column:
    """Cheap first test on the raw line; the row image is only looked into when it passes."""
    return line.contains(UNAVAILABLE[0]) | line.contains(UNAVAILABLE[1])


def _unavailable_reason(image: Column) -> Column:
    """Null unless a top-level value of ``image`` is the placeholder: then the error naming the
    columns. Storing the placeholder would replace the column's real value (tester)."""
    fields = F.try_variant_get(image, "$", "map<string,variant>")
    marks = F.array(*[F.lit(x) for x in UNAVAILABLE])
    # a scalar placeholder, or an array holding it (an untouched TOASTed PostgreSQL array)
    cols = F.map_keys(F.map_filter(fields, lambda k, v: F.try_variant_get(v, "$", "string").isin(*UNAVAILABLE)
                                   | F.coalesce(F.arrays_overlap(F.try_variant_get(v, "$", "array<string>"),
                                                                 marks), F.lit(False))))
    return F.when(F.size(cols) > 0, F.concat(
        F.lit("column(s) "), F.array_join(F.array_sort(cols), ", "),
        F.lit(" hold Debezium's unavailable-value placeholder (a PostgreSQL TOAST value the change "
              "did not touch): the event does not carry their values and storing the placeholder "
              "would replace them, so it is not stored; set REPLICA IDENTITY FULL on the source "
              "table or use Debezium's ReselectColumnsPostProcessor (reselect.unavailable.values), "
              "then re-ingest the quarantined lines")))
