"""The normalized change event: the one data contract between format parsers and writers.

Every parser (``cdc_lake.cdc.formats.*``) turns raw landing lines into rows with exactly these
columns; nothing downstream knows which format a row came from.

=============  ===================  ======================================================
column         type                 meaning
=============  ===================  ======================================================
_file          string               landing file the line came from
_line          string               the raw line (kept for quarantine)
_error         string               why the line/row is unusable, else null
_kind          string               ``row`` (data change), ``ddl``, ``skip`` (not data)
db             string               source database
tbl            string               source table
op             string               ``insert`` | ``update`` | ``delete`` | ``snapshot``
seq            string               binlog order; sorts lexically; unique per row change
commit_ts      timestamp            source commit time (UTC)
row            variant              row image: after-image, or before-image for deletes
old            variant              previous values: full before-image or changed columns only
pk_names       array<string>        primary-key columns the format carries (else null)
type_hints     map<string,string>   per-column type metadata the format carries (else null)
ddl_type       string               DDL kind for ``_kind = 'ddl'``/``'skip'``
ddl_sql        string               DDL statement text
=============  ===================  ======================================================

Optional column :data:`ORDER_COLUMN` (``_pos``, string): a parser whose format cannot order
two changes from the line alone (Canal: messages of one client batch share ``id`` and ``es``;
Maxwell without ``xoffset``: rows of one transaction share ``ts``/``xid`` or position) writes the
line's read position there and puts :data:`ORDINAL` in ``seq`` where the message's ordinal among
same-prefix messages of its file goes; :func:`finalize_order` fills it in per micro-batch (a
window: not possible on the stream itself). The batch survey reports which tables have such rows
(``discovery.Survey.ordinal_tables``); only those pay the window.

Lines that do not parse get a reason from :func:`json_failure` that tells parser limits from
malformed JSON.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

COLUMNS = ("_file", "_line", "_error", "_kind", "db", "tbl", "op", "seq", "commit_ts", "row",
           "old", "pk_names", "type_hints", "ddl_type", "ddl_sql")

OPS = ("insert", "update", "delete", "snapshot")
ORDER_COLUMN = "_pos"
ORDINAL = "#"  # placeholder in ``seq`` for the per-file message ordinal (see finalize_order)

# Limits of Spark's JSON -> variant parser (Spark 4.x; Jackson StreamReadConstraints defaults):
VARIANT_SIZE_LIMIT = 128 * 1024 * 1024  # bytes of one parsed value (16 MiB in Spark's own tests)
MAX_STRING_CHARS = 20_000_000  # characters of one JSON string value
MAX_NUMBER_CHARS = 1000  # characters of one JSON number
MAX_NESTING = 1000  # nesting depth of objects/arrays


def pad(col: Column, width: int) -> Column:
    """Left-pad a non-negative integer column so lexical order equals numeric order.

    Only values from 0 to ``10**width - 1`` order right (``lpad`` cuts longer text, and a
    negative value sorts backwards as text): a parser puts the fields it pads into
    :func:`order_range_error` and quarantines the rest. ``try_cast``: a value beyond
    ``decimal(38,0)`` must become that error, not fail the whole run (ANSI overflow).
    """
    return F.lpad(col.try_cast("decimal(38,0)").cast("string"), width, "0")


def order_range_error(*fields: tuple[str, Column, int]) -> Column:
    """Null, or the error naming the first ordering value that its :func:`pad` slot cannot hold.

    ``fields``: ``(label, column, width)`` as passed to :func:`pad` (integer or digit-string
    columns). Example::

        error = F.when(..., ...).when(order_range_error(("es", es, 16)).isNotNull(), ...)
    """
    out = None
    for label, col, width in fields:
        text = col.cast("string")
        digits = F.regexp_replace(text, r"^0+(?=\d)", "")  # for the message (bad rows only)
        # leading zeros do not count: ltrim, not the regex, on every row (regexes per row and
        # field cost a large batch's parse seconds)
        bad = text.startswith("-") | (F.length(F.ltrim(text, F.lit("0"))) > width)
        msg = F.format_string(f"{label} %s does not fit the order key (0 to {'9' * width})", digits)
        out = F.when(bad, msg) if out is None else out.when(bad, msg)
    assert out is not None, "order_range_error needs at least one field"
    return out


# Times a table can hold: years 1 to 9999 (Spark's, Delta's and Python's common range), as
# seconds since 1970 (0001-01-01T00:00:00 and 9999-12-31T23:59:59 UTC).
FIRST_SECOND, LAST_SECOND = -62_135_596_800, 253_402_300_799
_PER_SECOND = {"s": 1, "ms": 1000}


def commit_time(value: Column, unit: str, label: str) -> tuple[Column, Column]:
    """``(timestamp, error)`` of an epoch commit-time column in ``unit`` (``s`` or ``ms``).

    Outside years 1 to 9999 the timestamp is null and the error names the value (Spark's
    conversion fails the whole run past the microsecond range: ANSI ``long overflow``).
    Example::

        ts, ts_error = commit_time(vget(v, "$.es", "bigint"), "ms", "es")
    """
    per = _PER_SECOND[unit]
    ok = value.between(F.lit(FIRST_SECOND * per), F.lit(LAST_SECOND * per + per - 1))
    ts = F.when(ok, F.timestamp_millis(value) if unit == "ms" else F.timestamp_seconds(value))
    error = F.when(value.isNotNull() & ~ok, F.format_string(
        f"{label} %d is not a commit time in years 1 to 9999 (read as "
        f"{'milliseconds' if unit == 'ms' else 'seconds'} since 1970)", value))
    return ts, error


def binlog_file_number(file_col: Column) -> Column:
    """``mysql-bin.000123`` -> ``"000123"``: the numeric suffix that orders binlog files, as
    digits (for :func:`pad` and :func:`order_range_error`; a cast to a number would fail the
    run on 20 digits), or null when the name does not end in digits."""
    return F.nullif(F.regexp_extract(file_col, r"(\d+)$", 1), F.lit(""))


def vget(v: Column, path: str, type_: str = "variant") -> Column:
    """Null-tolerant typed read from a variant (``try_variant_get``)."""
    return F.try_variant_get(v, path, type_)


def select_normalized(df, *, ordered: bool = False):  # type: ignore[no-untyped-def]
    """Project a parser's output onto :data:`COLUMNS` (fails fast if a parser forgot one).

    ``ordered=True`` keeps :data:`ORDER_COLUMN` too (formats that need :func:`finalize_order`).
    """
    return df.select(*COLUMNS, *([ORDER_COLUMN] if ordered else []))


def parse_line(line: Column) -> Column:
    """The line as a variant, or null: not valid UTF-8, not JSON, or beyond a parser limit.

    Spark's text source keeps a line's bytes as they are; decoding invalid UTF-8 would put
    U+FFFD replacement characters into the values, i.e. store changed values. Such lines are
    refused here (:func:`json_failure` names the reason). Example::

        v = parse_line(F.col("_line"))  # in every format parser instead of try_parse_json
    """
    return F.when(F.is_valid_utf8(line), F.try_parse_json(line))


def json_failure(line: Column) -> Column:
    """Why :func:`parse_line` gave null: invalid UTF-8, a parser limit (named, with the sizes)
    or malformed JSON.

    Evaluate only for lines that did not parse (inside ``when(v.isNull(), ...)``).
    """
    nbytes = F.octet_length(line)
    longest_string = F.array_max(F.transform(F.split(line, '"'), lambda x: F.length(x)))
    mib = F.format_number(nbytes / (1024 * 1024), 1)
    return (F.when(~F.is_valid_utf8(line), F.concat(
                F.lit("line is not valid UTF-8 (line of "), nbytes.cast("string"),
                F.lit(" bytes): not parsed, since decoding it would store changed values; "
                      "raw_line shows the invalid bytes as U+FFFD; land UTF-8 (the producer's "
                      "or the transfer's encoding)")))
            .when(nbytes > VARIANT_SIZE_LIMIT, F.concat(
                F.lit("line too large: "), nbytes.cast("string"), F.lit(" bytes ("), mib,
                F.lit(f" MiB) is above Spark's variant size limit of {VARIANT_SIZE_LIMIT} bytes "
                      "(128 MiB); not parsed (JSON validity unknown)")))
            .when(longest_string > MAX_STRING_CHARS, F.concat(
                F.lit("line of "), nbytes.cast("string"), F.lit(" bytes ("), mib,
                F.lit(" MiB) holds a JSON string value of about "), longest_string.cast("string"),
                F.lit(f" characters, above the parser limit of {MAX_STRING_CHARS} characters "
                      "per string value (Jackson maxStringLength in Spark's JSON parser); "
                      "not parsed (JSON validity unknown)")))
            .otherwise(F.concat(
                F.lit("malformed JSON (or beyond a parser limit: a number longer than "
                      f"{MAX_NUMBER_CHARS} digits or nesting deeper than {MAX_NESTING}); line of "),
                nbytes.cast("string"), F.lit(" bytes"))))


def line_position() -> Column:
    """The start offset of the file split the line was read from (see ``_pos``).

    Evaluated on the file scan. Lines of one split keep their file order through the narrow
    transformations up to :func:`finalize_order`, which numbers them there (row ids are not
    available on a streaming DataFrame).
    """
    return pad(F.input_file_block_start(), 20)


def finalize_order(df: DataFrame) -> DataFrame:
    """Replace :data:`ORDINAL` in ``seq`` by the message's ordinal within its file.

    The ordinal counts distinct lines (``_pos``) of the same file whose ``seq`` has the same
    prefix (the part before the placeholder), in line order. It depends only on the file's
    content, so a re-delivered copy of a file gets the same ``seq`` values. No-op when the
    format does not write :data:`ORDER_COLUMN`. Must run on the micro-batch before any shuffle
    (only filters/projections since the file scan), so rows are still in file order.

    Callers skip it for tables whose rows hold no :data:`ORDINAL` (the survey says which:
    ``discovery.Survey.ordinal_tables``): it adds two windows (shuffles) over the rows.

    Example::

        events = finalize_order(batch_events)  # Canal: 'es.id.#.row' -> 'es.id.00000002.row'
        # Maxwell without xoffset: 'V.0.<ts>.<xid>.00#' -> 'V.0.<ts>.<xid>.0000000003'
    """
    if ORDER_COLUMN not in df.columns:
        return df
    seq = F.col("seq")
    needs = seq.contains(ORDINAL)
    # Row ids follow the scan order of each partition: call this before any shuffle of the batch.
    # A line's place: the first row id of that exact line in the file (the rows a message
    # explodes into share it; a repeated identical line counts once: duplicates change nothing).
    df = df.withColumn("__line_id", F.monotonically_increasing_id()).withColumn(
        "__line_id", F.min("__line_id").over(Window.partitionBy("_file", "_line")))
    w = (Window.partitionBy("_file", F.substring_index(seq, ORDINAL, 1))
         .orderBy(ORDER_COLUMN, "__line_id"))
    ordinal = pad(F.dense_rank().over(w), 8)
    return df.withColumn("seq", F.when(needs, F.replace(seq, F.lit(ORDINAL), ordinal))
                         .otherwise(seq)).drop("__line_id")
