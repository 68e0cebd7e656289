"""Maxwell's Daemon JSON.

Order: rows without ``position`` by (``ts``, ``xid``, ``xoffset``), then rows with ``position``
by (binlog file, offset, ``xoffset``). ``position`` is optional (``output_binlog_position``) and
is typically switched on mid-history: everything written before the switch sorts before
everything after it, and positioned rows keep their exact binlog order. (Switching positions
*off* again is not supported: later rows without a position would sort first.)
Old Maxwell versions write no ``xoffset`` at all (only the transaction's last row says
``"commit": true``): such a row's ``xoffset`` slot is its ordinal among the table's lines of its
landing file with the same (``ts``, ``xid``) or position, i.e. its place in the transaction,
filled in per micro-batch by :func:`cdc_lake.cdc.events.finalize_order` (``"00"`` + 8 digits,
so it sorts like a padded ``xoffset``; the commit row keeps ``9999999999``, the last place).
Rows with ``xoffset`` (current Maxwell) keep their order keys and do not pay that window.
``data`` is the full row (the deleted row for deletes); ``old`` holds previous values
of changed columns only, so a primary-key change shows up as an ``update`` whose ``old`` carries
the old key. DDL types (``table-alter``...) go to the DDL log; ``bootstrap-start``/``-complete``
are markers and are skipped (counted), ``bootstrap-insert`` is a snapshot row.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_lake.cdc.events import (ORDER_COLUMN, ORDINAL, binlog_file_number, commit_time,
                                 json_failure, line_position, order_range_error, pad, parse_line,
                                 select_normalized, vget)

_OPS = {"insert": "insert", "update": "update", "delete": "delete", "bootstrap-insert": "snapshot"}
_MARKERS = ("bootstrap-start", "bootstrap-complete")


def _present(name: str):  # type: ignore[no-untyped-def]
    """The field is in the line and not JSON null."""
    return F.col(name).isNotNull() & ~F.is_variant_null(name)


def parse(lines: DataFrame) -> DataFrame:
    # Two projections: every field is read from the parsed line once, then the derived columns
    # refer to those (Spark keeps the projections apart instead of re-evaluating the reads in
    # every CASE branch that uses them: about 2x faster on the parse than one big projection).
    v = parse_line(F.col("_line"))
    # (the line's read position is taken on the file scan: finalize_order needs it)
    df = lines.select("_file", "_line", line_position().alias(ORDER_COLUMN), v.alias("v")).select(
        "_file", "_line", ORDER_COLUMN, "v", F.col("v").isNull().alias("bad"),
        vget(F.col("v"), "$.type").alias("type_v"),
        vget(F.col("v"), "$.position").alias("position_v"),
        vget(F.col("v"), "$.ts").alias("ts_v"),
        # Maxwell omits xoffset on a transaction's commit row: it is the transaction's last row.
        # (null: no xoffset and no commit flag; see `slot` below)
        F.coalesce(vget(F.col("v"), "$.xoffset", "bigint"),
                   F.when(vget(F.col("v"), "$.commit", "boolean"), F.lit(9_999_999_999))
                   ).alias("xoffset"),
        vget(F.col("v"), "$.xid", "bigint").alias("xid"),
        vget(F.col("v"), "$.data").alias("data"),
        vget(F.col("v"), "$.old").alias("old"),
        vget(F.col("v"), "$.database", "string").alias("db"),
        vget(F.col("v"), "$.table", "string").alias("tbl"),
        vget(F.col("v"), "$.primary_key_columns", "array<string>").alias("pk_names"),
        vget(F.col("v"), "$.sql", "string").alias("ddl_sql"),
    )
    # the typed reads from the two small variants (a value of another type reads as null: the
    # error below tells it from an absent field)
    df = df.select("*", vget(F.col("position_v"), "$", "string").alias("position"),
                   vget(F.col("ts_v"), "$", "bigint").alias("ts"),
                   # a type that is not a JSON string is unknown (as text, an object or a
                   # negative number holding a '-' read as a DDL type: logged, not quarantined)
                   F.when(F.schema_of_variant("type_v") == "STRING",
                          vget(F.col("type_v"), "$", "string")).alias("typ"))
    # The position's parts, once per line: as expressions, the seq, range and error columns
    # below evaluated the two regexes about twenty times per line (a 200k-event batch's parse
    # +50%, 2026-12-01). A third projection, kept apart as the two above are.
    df = df.select("*", F.regexp_extract("position", r"^(.*):(\d+)$", 2).alias("pos_off"),
                   binlog_file_number(F.regexp_extract("position", r"^(.*):(\d+)$", 1)).alias("file_no"))
    typ = F.col("typ")
    op = F.create_map(*[x for k, o in _OPS.items() for x in (F.lit(k), F.lit(o))])[typ]
    pos_off, file_no = F.col("pos_off"), F.col("file_no")
    ts, xoffset = F.col("ts"), F.col("xoffset")
    is_ddl = typ.contains("-") & ~typ.startswith("bootstrap")
    kind = (F.when(F.col("bad"), "row").when(typ.isin(*_MARKERS), "skip")
            .when(is_ddl, "ddl").otherwise("row"))
    # The xoffset slot (10 characters): the padded xoffset; for a row event without one (old
    # Maxwell: every row of a transaction shares ts/xid or position) "00" + the placeholder of
    # its ordinal among the same-prefix lines of its file (finalize_order). DDL and marker lines
    # keep 0 (no placeholder reaches the DDL log).
    slot = (F.when(xoffset.isNotNull(), pad(xoffset, 10))
            .when(kind == "row", F.lit("00" + ORDINAL))
            .otherwise(pad(F.lit(0), 10)))
    # 'V' marks this layout: older layouts began with 'P'/'T' and sort before it.
    seq = (F.when(pos_off != "", F.concat_ws(".", F.lit("V.1"), pad(file_no, 10),
                                              pad(pos_off, 20), slot))
           .when(ts.isNotNull(), F.concat_ws(".", F.lit("V.0"), pad(ts, 12),
                                             pad(F.coalesce(F.col("xid"), F.lit(0)), 20), slot)))
    # a value its slot cannot hold would order wrongly (cut, or negative): an error instead
    by_position = order_range_error(("binlog file number", file_no, 10), ("binlog offset", pos_off, 20),
                                    ("xoffset", xoffset, 10))
    by_ts = order_range_error(("ts", ts, 12), ("xid", F.col("xid"), 20), ("xoffset", xoffset, 10))
    range_error = F.when(pos_off != "", by_position).when(ts.isNotNull(), by_ts)
    commit_ts, ts_error = commit_time(ts, "s", "ts")
    df = df.select("*", op.alias("op"), seq.alias("seq"), kind.alias("_kind"),
                   file_no.isNull().alias("no_file_no"), range_error.alias("range_error"),
                   commit_ts.alias("commit_ts"), ts_error.alias("ts_error"))
    data = F.col("data")
    error = (F.when(F.col("bad"), json_failure(F.col("_line")))
             .when(F.col("_kind") != "row", F.lit(None))
             .when(~_present("type_v"), F.lit("missing type"))
             .when(F.col("op").isNull(), F.concat(F.lit("unknown type "), F.to_json(F.col("type_v"))))
             .when(F.col("tbl").isNull(), F.lit("missing table"))
             # present but unusable: such a row sorted as if it had no position (before every
             # positioned row: the newest update lost) or got no commit time (an SCD2 version
             # without _valid_from), exit 0
             .when(_present("position_v") & (pos_off == ""),
                   F.concat(F.lit("position is not <binlog file>:<offset>: "),
                            F.to_json(F.col("position_v"))))
             .when(_present("ts_v") & ts.isNull(),
                   F.concat(F.lit("ts is not a whole number of seconds: "), F.to_json(F.col("ts_v"))))
             .when((pos_off != "") & F.col("no_file_no"),
                   F.concat(F.lit("position's binlog file name does not end in a number (the "
                                  "number orders binlog files): "), F.to_json(F.col("position_v"))))
             .when(F.col("seq").isNull(), F.lit("missing binlog order (position or ts)"))
             .when(F.col("ts_error").isNotNull(), F.col("ts_error"))
             .when(F.col("range_error").isNotNull(), F.col("range_error"))
             .when(data.isNull() | F.is_variant_null(data), F.lit("missing data")))
    return select_normalized(df.select(
        "_file", "_line", error.alias("_error"), "_kind", "db", "tbl", "op", "seq",
        "commit_ts", data.alias("row"), "old", "pk_names",
        F.lit(None).cast("map<string,string>").alias("type_hints"),
        F.when(F.col("_kind") != "row", typ).alias("ddl_type"), "ddl_sql",
        # only rows waiting for an ordinal need their position (keeps the batch cache small)
        F.when(F.col("seq").contains(ORDINAL), F.col(ORDER_COLUMN)).alias(ORDER_COLUMN)),
        ordered=True)
