"""The values of an events line that the job types itself instead of Spark's JSON reader.

Spark's JSON reader changes some values without a word when it reads them into the
``fact.events.schema`` types (checked here, 2026-11-30; testers for the CDC job's equivalents):

* a decimal with more fraction digits than its scale is rounded (``1.234`` into
  ``decimal(5,2)``: ``1.23``; ``"1.235"``: ``1.24``) — sums of prices drift;
* a date-time for a ``date`` column loses its time (``"2026-01-01T10:00:00"``: ``2026-01-01``);
* a timestamp naming its zone is read by a region's rules (``PST``: Los Angeles time with daylight
  saving, ``CST``: US Central), a year past 9999 is stored (the table is then unreadable), a too
  large epoch number wraps to 1969.

So the event time and every ``decimal``, ``date`` and ``timestamp`` column are read as text
(:func:`read_ddl`: Spark's reader gives a JSON string's text and a number's digits as they
are) and typed here (:func:`with_checked_values`): a value that is taken is the same value; one
that is not marks the line corrupt — kept apart from the dedup and quarantined with its reason
(:func:`corrupt_reason`), its ``raw_line`` the schema's columns as JSON with those values as
text. An event without its time is refused the same way (the watermark and the dedup need it).
The other types keep Spark's reading (a value it cannot read marks the line corrupt itself,
with the line's own text). Text, not ``variant``: typing variants cost about five times the
read of a 200k-event batch (``schema_of_variant`` per value), text about as much as the read.

The lines are read as text and parsed by ``from_json`` (:func:`parse_lines`) rather than by
Spark's JSON file reader, so that the job sees each line's field names: a line naming a
field twice (``{"qty": 1, "qty": 500}``: the reader kept 500; also ``qty`` and ``QTY``) or a
schema column only in another case (``"Qty"`` for ``qty``: stored as null) was stored changed,
exit 0; it is now quarantined with its own text. Only the top-level names are checked (a struct
column's inner names are not); a field named twice is refused even when the schema does not
list it (the line is ambiguous JSON).

Example::

    lines = spark.read.text(path).select("value", F.col("_metadata.file_path").alias(SOURCE_FILE))
    df = with_checked_values(parse_lines(lines, ev), ev)
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_lake.enrich.columns import CORRUPT, SOURCE_FILE
from cdc_lake.enrich.config import EventSource

LINE = "__event_line"  # the line as read (parse_lines), until with_checked_values

_TIMESTAMPS = ("timestamp", "timestamp_ltz")
_KEPT = "(the line is kept as raw_line)"


def _c(name: str) -> Column:
    return F.col(f"`{name}`")


def checked_columns(ev: EventSource) -> dict[str, str]:
    """Column -> declared type (lower case) of the columns typed here: the event time first,
    then every ``decimal(p,s)``, ``date`` and ``timestamp`` column."""
    from cdc_lake.config import spark_type

    out = {ev.time: ev.schema[ev.time].strip().lower()}
    for c, t in ev.schema.items():
        t = spark_type(t) or t.strip().lower().replace(" ", "")  # numeric(10, 2) -> decimal(10,2)
        if c != ev.time and (t.startswith("decimal") or t == "date" or t in _TIMESTAMPS):
            out[c] = t
    return out


def read_ddl(ev: EventSource) -> str:
    """The schema the events are read with: ``fact.events.schema`` with :func:`checked_columns`
    as ``string`` (the values as sent), and the corrupt-record column."""
    checked = checked_columns(ev)
    return ", ".join(f"`{c}` {'string' if c in checked else t}" for c, t in ev.schema.items()) + (
        f", `{CORRUPT}` string")


def event_time(text: Column) -> Column:
    """The instant of a timestamp sent as ``text`` (a JSON string's text or a number's digits),
    or null when it is not taken: whole seconds since the epoch (as Spark's reader took a JSON
    integer), or text Spark's cast reads (ISO-8601 and the forms Spark's JSON reader took:
    ``Z``, ``+08:00``, ``UTC``, ``GMT+08:00``, none = UTC; digits beyond microseconds are cut,
    as Spark's reader did) except one naming its zone (``PST``, ``America/Los_Angeles``:
    :data:`~cdc_lake.cdc.column_types.NAMED_ZONE_RE`); in both cases within the years 1 to 9999
    (a later year made the table unreadable, a too large number wrapped to 1969).

    Example::

        event_time(F.lit("2026-11-01 01:30:00 PST"))  # null: names a zone
    """
    from cdc_lake.cdc.column_types import NAMED_ZONE_RE
    from cdc_lake.cdc.events import FIRST_SECOND, LAST_SECOND

    seconds = F.when(text.rlike(r"^-?\d{1,19}$"), text.try_cast("bigint"))
    t = (F.when(seconds.between(FIRST_SECOND, LAST_SECOND), F.timestamp_seconds(seconds))
         .when(seconds.isNull() & ~text.rlike(NAMED_ZONE_RE), text.try_cast("timestamp")))
    return F.when(F.year(t).between(1, 9999), t).cast("timestamp")


def typed_value(text: Column, t: str) -> Column:
    """``text`` (a JSON string's text or a number's digits) as the declared type ``t`` of a
    checked column, or null when it is not that value exactly: a timestamp by
    :func:`event_time`; a decimal that ``t`` holds without rounding (compared as
    ``decimal(38,18)``, or as double beyond it); a date from text holding a date and nothing
    else, in the years 1 to 9999."""
    from cdc_lake.cdc.column_types import EXACT_DATE_RE

    if t in _TIMESTAMPS:
        return event_time(text)
    if t == "date":
        d = F.when(text.rlike(EXACT_DATE_RE), text.try_cast("date"))
        return F.when(F.year(d).between(1, 9999), d).cast("date")
    v = text.try_cast(t)
    same = F.coalesce(v.cast("decimal(38,18)") == text.try_cast("decimal(38,18)"),
                      v.cast("double") == text.try_cast("double"))
    return F.when(same, v).cast(t)


def parse_lines(lines: DataFrame, ev: EventSource) -> DataFrame:
    """Lines of the events files (Spark's ``text`` source: ``value``, plus
    :data:`~cdc_lake.enrich.columns.SOURCE_FILE`) read into :func:`read_ddl` as Spark's JSON
    reader reads them (``from_json`` in its permissive mode: a line it cannot read keeps its text
    in :data:`~cdc_lake.enrich.columns.CORRUPT`; blank lines skipped), with the line itself in
    :data:`LINE` for :func:`with_checked_values`. A line holding a JSON array is corrupt (the
    JSON reader made one event of each element)."""
    text = F.col("value")
    return (lines.where(~text.rlike(r"^\s*$"))
            .select(F.from_json(text, read_ddl(ev), {"columnNameOfCorruptRecord": CORRUPT})
                    .alias("__event"), text.alias(LINE), SOURCE_FILE)
            .select("__event.*", LINE, SOURCE_FILE))


_SEP = "\u0001"  # joins a line's field names to lower-case them at once (no name holds it)
_KEYS, _LOWERED = "__event_keys", "__event_keys_lower"


def _misnamed(keys: Column, lowered: Column, ev: EventSource) -> Column:
    """Whether a JSON object with the field names ``keys`` (``json_object_keys``; ``lowered``:
    the same in lower case) names a field twice (in any case: ``qty`` and ``QTY`` are one column
    for Spark; its reader kept the last value) or a column of ``fact.events.schema`` only in
    another case (JSON names are case-sensitive: the column was stored null); false when the line
    is not a JSON object. Array functions only (no lambdas: those run interpreted, 10x the cost
    of the whole read)."""
    exact = F.array(*[F.lit(c) for c in ev.schema])
    lower = F.array(*[F.lit(c.lower()) for c in ev.schema])
    twice = F.size(F.array_distinct(lowered)) != F.size(keys)
    other_case = F.size(F.array_intersect(lowered, lower)) != F.size(F.array_intersect(keys, exact))
    return F.coalesce(twice | other_case, F.lit(False))


def _names(line: Column, ev: EventSource) -> tuple[Column, Column]:
    """For the reason of a line :func:`_misnamed` refused: its fields named more than once (in
    any case), and those naming a column of ``fact.events.schema`` only in another case."""
    lower = F.array(*[F.lit(c.lower()) for c in ev.schema])
    exact = F.array(*[F.lit(c) for c in ev.schema])
    keys = F.json_object_keys(line)
    twice = F.array_distinct(F.filter(keys, lambda k: F.size(
        F.filter(keys, lambda x: F.lower(x) == F.lower(k))) > 1))
    other_case = F.filter(keys, lambda k: F.array_contains(lower, F.lower(k))
                          & ~F.array_contains(exact, k))
    return twice, other_case


def with_checked_values(df: DataFrame, ev: EventSource) -> DataFrame:
    """The events read by :func:`parse_lines`, their checked columns typed by
    :func:`typed_value`; an event with a value sent but not taken, or without its time, is
    marked corrupt (:data:`~cdc_lake.enrich.columns.CORRUPT`: kept apart from the dedup, so its
    id does not drop the correct event of that id, and quarantined), its line the schema's
    columns as JSON with the checked values as text (a line Spark could not read keeps its own
    text). A line naming a field twice or a column only in another case (:func:`_misnamed`) is
    corrupt with its own text."""
    # Each value typed once, and the names listed once, in projections of their own: inside the
    # corrupt column's coalesce Spark evaluates a repeated expression once per use (a line's
    # names were parsed four times: the whole run 7 s slower at 200k events).
    checked = checked_columns(ev)
    typed = {f"__typed_{i}": typed_value(_c(c), t) for i, (c, t) in enumerate(checked.items())}
    names = dict(zip(checked, typed))
    df = (df.withColumns({**typed, _KEYS: F.json_object_keys(_c(LINE))})
          .withColumn(_LOWERED, F.split(F.lower(F.array_join(_c(_KEYS), _SEP)), _SEP)))
    refused = reduce(lambda a, b: a | b, [_c(c).isNotNull() & _c(v).isNull() for c, v in names.items()],
                     _c(names[ev.time]).isNull())
    misnamed = _misnamed(_c(_KEYS), _c(_LOWERED), ev)
    line = F.to_json(F.struct(*[_c(c) for c in ev.schema]))
    return (df.withColumn(CORRUPT, F.coalesce(_c(CORRUPT), F.when(misnamed, _c(LINE)),
                                              F.when(refused, line)))
            .withColumns({c: _c(v) for c, v in names.items()})
            .drop(LINE, _KEYS, _LOWERED, *typed))


def corrupt_reason(ev: EventSource) -> Column:
    """Why a corrupt event (:data:`~cdc_lake.enrich.columns.CORRUPT` set) is quarantined: the
    first checked value not taken (the event time first; a time naming a zone says so), its time
    missing from a JSON object, else the line not read into the schema."""
    from pyspark.sql.types import StringType, StructField, StructType

    from cdc_lake.cdc.column_types import NAMED_ZONE_RE

    checked = checked_columns(ev)
    parsed = F.from_json(_c(CORRUPT), StructType([StructField(c, StringType()) for c in checked]))
    twice, other_case = _names(_c(CORRUPT), ev)
    whys = [F.when(F.size(twice) > 0, F.concat(
                F.lit("field(s) "), F.array_join(twice, ", "), F.lit(
                    " name one field more than once (in one or more cases; Spark takes names in "
                    "any case for one column): JSON names must be unique, and Spark's reader "
                    f"would keep the last value {_KEPT}"))),
            F.when(F.size(other_case) > 0, F.concat(
                F.lit("field(s) "), F.array_join(other_case, ", "), F.lit(
                    " match a column of fact.events.schema only in another case: JSON names are "
                    f"case-sensitive, so the value would be stored as null {_KEPT}")))]
    for c, t in checked.items():
        text = parsed[c]
        label = F.concat(F.lit(f"event time {c} \"" if c == ev.time else f"column {c} \""), text,
                         F.lit('"'))
        bad = text.isNotNull() & typed_value(text, t).isNull()
        if t in _TIMESTAMPS:
            # a zone only where Spark reads the text ("garbage" holds letters too)
            zone = text.rlike(NAMED_ZONE_RE) & text.try_cast("timestamp").isNotNull()
            whys.append(F.when(bad & zone, F.concat(label, F.lit(
                " names a time zone, which gives no fixed offset (Spark reads PST as Los Angeles "
                f"time with daylight saving, CST as US Central): send an offset (Z, +08:00) {_KEPT}"))))
            what = "an event time" if c == ev.time else "a timestamp"
            whys.append(F.when(bad, F.concat(label, F.lit(
                f" is not {what}: ISO-8601 text (an offset or none = UTC) or epoch seconds, in the "
                f"years 1 to 9999 {_KEPT}"))))
        elif t == "date":
            whys.append(F.when(bad, F.concat(label, F.lit(
                f" is not a date: text holding YYYY-MM-DD and nothing else, in the years 1 to 9999 "
                f"(Spark would drop a time of day) {_KEPT}"))))
        else:
            whys.append(F.when(bad, F.concat(label, F.lit(
                f" is not a {t} value exactly (Spark would round it, or it is no number): declare "
                f"a wider scale in fact.events.schema {_KEPT}"))))
    is_object = F.schema_of_variant(F.try_parse_json(_c(CORRUPT))).startswith("OBJECT")
    whys.append(F.when(parsed[ev.time].isNull() & is_object, F.lit(
        f"event time {ev.time} is missing or null (fact.events.time; names are case-sensitive): "
        f"an event needs its time for the watermark and the deduplication {_KEPT}")))
    return F.coalesce(*whys, F.lit("malformed JSON line, or a value not of its fact.events.schema "
                                   f"type {_KEPT}"))
