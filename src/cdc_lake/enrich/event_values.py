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

Example::

    df = with_checked_values(spark.read.schema(read_ddl(ev))
                             .option("columnNameOfCorruptRecord", CORRUPT).json(path), ev)
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_lake.enrich.columns import CORRUPT
from cdc_lake.enrich.config import EventSource

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


def with_checked_values(df: DataFrame, ev: EventSource) -> DataFrame:
    """The events read with :func:`read_ddl`, their checked columns typed by
    :func:`typed_value`; an event with a value sent but not taken, or without its time, is
    marked corrupt (:data:`~cdc_lake.enrich.columns.CORRUPT`: kept apart from the dedup, so its
    id does not drop the correct event of that id, and quarantined), its line the schema's
    columns as JSON with the checked values as text (a line Spark could not read keeps its own
    text)."""
    typed = {c: typed_value(_c(c), t) for c, t in checked_columns(ev).items()}
    refused = reduce(lambda a, b: a | b, [_c(c).isNotNull() & v.isNull() for c, v in typed.items()],
                     typed[ev.time].isNull())
    line = F.to_json(F.struct(*[_c(c) for c in ev.schema]))
    return (df.withColumn(CORRUPT, F.coalesce(_c(CORRUPT), F.when(refused, line)))
            .withColumns(typed))


def corrupt_reason(ev: EventSource) -> Column:
    """Why a corrupt event (:data:`~cdc_lake.enrich.columns.CORRUPT` set) is quarantined: the
    first checked value not taken (the event time first; a time naming a zone says so), its time
    missing from a JSON object, else the line not read into the schema."""
    from pyspark.sql.types import StringType, StructField, StructType

    from cdc_lake.cdc.column_types import NAMED_ZONE_RE

    checked = checked_columns(ev)
    parsed = F.from_json(_c(CORRUPT), StructType([StructField(c, StringType()) for c in checked]))
    whys = []
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
