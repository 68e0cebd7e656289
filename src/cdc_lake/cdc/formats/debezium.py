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

_FIELDS = ("array<struct<field:string,type:string,name:string,parameters:map<string,string>,"
           "fields:array<struct<field:string,type:string,name:string,"
           "parameters:map<string,string>>>>>")
_OPS = {"c": "insert", "u": "update", "d": "delete", "r": "snapshot"}
_SNAPSHOT_VALUES = ("true", "last", "first", "first_in_data_collection", "last_in_data_collection",
                    "incremental")


def parse(lines: DataFrame) -> DataFrame:
    v = parse_line(F.col("_line"))
    df = lines.select("_file", "_line", v.alias("v"))
    wrapped = vget(F.col("v"), "$.payload").isNotNull() & vget(F.col("v"), "$.schema").isNotNull()
    df = df.withColumn("env", F.when(wrapped, vget(F.col("v"), "$.payload")).otherwise(F.col("v")))
    # try_element_at: a schema without an 'after' field (schema-change records) gives null
    after_fields = F.expr(f"try_element_at(filter(try_variant_get(v, '$.schema.fields', '{_FIELDS}'),"
                          " x -> x.field = 'after'), 1).fields")
    names = F.transform(after_fields, lambda f: f["field"])
    # a field listed twice (or without a name) would fail the whole run (duplicate/null map key)
    bad_schema = (F.size(F.array_distinct(F.array_compact(names))) < F.size(names))
    hints = F.when(~bad_schema, F.expr(
        f"map_from_entries(transform(try_element_at(filter(try_variant_get(v, '$.schema.fields', '{_FIELDS}'),"
        " x -> x.field = 'after'), 1).fields,"
        " f -> struct(f.field, concat_ws(':', coalesce(f.name, f.type),"
        " coalesce(f.parameters['scale'], ''), coalesce(f.parameters['connect.decimal.precision'], ''),"
        " coalesce(f.type, '')))))"))
    env = F.col("env")
    raw_op = vget(env, "$.op", "string")
    snap_flag = F.lower(vget(env, "$.source.snapshot", "string"))
    is_snapshot = (raw_op == "r") | ((raw_op == "c") & snap_flag.isin(*_SNAPSHOT_VALUES))
    op = F.when(is_snapshot, F.lit("snapshot")).otherwise(
        F.create_map(*[x for k, o in _OPS.items() for x in (F.lit(k), F.lit(o))])[raw_op])
    ddl = vget(env, "$.ddl", "string")
    src_file = vget(env, "$.source.file", "string")
    pos = vget(env, "$.source.pos", "bigint")
    lsn = vget(env, "$.source.lsn", "bigint")
    row_no = F.coalesce(vget(env, "$.source.row", "bigint"), F.lit(0))
    snapshot_rank = F.when(is_snapshot, F.lit("0")).otherwise(F.lit("1"))
    image = F.when(raw_op == "d", vget(env, "$.before")).otherwise(vget(env, "$.after"))
    # Snapshot rows share one position: a hash of the row image orders them deterministically.
    tiebreak = F.when(is_snapshot, F.concat(F.lit("."), F.lpad(F.hex(F.xxhash64(F.to_json(image))),
                                                                 16, "0")))
    mysql_seq = F.concat(F.concat_ws(".", pad(binlog_file_number(src_file), 10), pad(pos, 20),
                                     snapshot_rank, pad(row_no, 10)), F.coalesce(tiebreak, F.lit("")))
    tx = F.coalesce(vget(env, "$.source.txId", "bigint"), F.lit(0))
    pg_seq = F.concat(F.concat_ws(".", F.lit("L"), pad(lsn, 20), snapshot_rank, pad(tx, 20)),
                      F.coalesce(tiebreak, F.lit("")))
    has_binlog = src_file.isNotNull() & pos.isNotNull()
    seq = F.when(has_binlog, mysql_seq).when(lsn.isNotNull(), pg_seq)
    # a value its slot cannot hold would order wrongly (cut, or negative): an error instead
    range_error = (F.when(has_binlog, order_range_error(
                        ("source.file number", binlog_file_number(src_file), 10),
                        ("source.pos", pos, 20), ("source.row", row_no, 10)))
                   .when(lsn.isNotNull(), order_range_error(("source.lsn", lsn, 20),
                                                            ("source.txId", tx, 20))))
    src_ts = vget(env, "$.source.ts_ms", "bigint")
    commit_ms = F.coalesce(F.when(src_ts > 0, src_ts), vget(env, "$.ts_ms", "bigint"), src_ts)
    commit_ts, ts_error = commit_time(commit_ms, "ms", "source.ts_ms (else ts_ms)")
    # transaction metadata (provide.transaction.metadata): BEGIN/END records, not data
    tx_marker = (raw_op.isNull() & vget(env, "$.status", "string").isin("BEGIN", "END")
                 & vget(env, "$.id").isNotNull())
    kind = (F.when(F.col("v").isNull(), "row")  # malformed: routed by _error
            .when(F.is_variant_null("v"), "skip")
            .when(tx_marker, "skip")
            .when(ddl.isNotNull(), "ddl")
            .when(raw_op == "t", "ddl")
            .otherwise("row"))
    error = (F.when(F.col("v").isNull(), json_failure(F.col("_line")))
             .when(kind != "row", F.lit(None))
             .when(raw_op.isNull(), F.lit("missing op"))
             .when(op.isNull(), F.concat(F.lit("unknown op "), F.to_json(vget(env, "$.op"))))
             .when(vget(env, "$.source.table", "string").isNull(), F.lit("missing source.table"))
             .when(seq.isNull(),
                   F.lit("missing connector position: need source.file + source.pos (MySQL/"
                         "MariaDB) or source.lsn (PostgreSQL)"))
             .when(has_binlog & binlog_file_number(src_file).isNull(),
                   F.concat(F.lit("source.file does not end in a number (the number orders "
                                  "binlog files): "), F.to_json(vget(env, "$.source.file"))))
             .when(range_error.isNotNull(), range_error)
             .when(ts_error.isNotNull(), ts_error)
             .when(F.coalesce(bad_schema, F.lit(False)),
                   F.concat(F.lit("the schema's after fields list a name twice or a field without "
                                  "a name: "), F.to_json(names)))
             .when(image.isNull() | F.is_variant_null(image),
                   F.concat(F.lit("missing row image for op "), raw_op))
             .when((raw_op != "d") & _unavailable_in(F.col("_line")), _unavailable_reason(image)))
    table_from_ddl = F.regexp_extract(vget(env, "$.tableChanges[0].id", "string"), r"([^.\"`]+)\"?$", 1)
    return select_normalized(df.select(
        "_file", "_line",
        error.alias("_error"),
        kind.alias("_kind"),
        F.coalesce(vget(env, "$.source.db", "string"), vget(env, "$.databaseName", "string")).alias("db"),
        F.coalesce(vget(env, "$.source.table", "string"), F.nullif(table_from_ddl, F.lit(""))).alias("tbl"),
        op.alias("op"),
        seq.alias("seq"),
        commit_ts.alias("commit_ts"),
        image.alias("row"),
        vget(env, "$.before").alias("old"),
        F.lit(None).cast("array<string>").alias("pk_names"),
        hints.alias("type_hints"),
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
