"""Column types: which Spark type each source column gets, and how to decode it from a variant.

Precedence (first match wins): ``tables.<t>.types`` in config, the existing Delta column type,
format metadata (Canal ``mysqlType``, Debezium schema wrapper), the JSON value kind seen in the
batch. Decoding stays in Spark SQL expressions (no Python UDFs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from cdc_lake.cdc.events import FIRST_SECOND, LAST_SECOND

DATE_RE = r"^\d{4}-\d{2}-\d{2}$"
TIMESTAMP_RE = r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:?\d{2})?$"
INFERRED_DECIMAL = "decimal(38,10)"


@dataclass(frozen=True)
class ColumnType:
    """A Spark SQL type plus the decoder that turns the raw variant value into it."""

    sql: str
    decoder: str = "plain"  # plain | json | epoch_* | time_ms | time_us | time_ns | b64_decimal | refuse
    scale: int = 0
    # (hint, decoder, scale) per type hint, when a batch's events state the column's type in
    # ways decoded differently (a source-side ALTER inside the batch): each value is decoded
    # by its own event's hint (cdc_lake.cdc.type_hints.hinted), then held as ``sql``
    by_hint: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True)
class ObservedColumn:
    """What one batch says about a column: variant kind, format hint, temporal look."""

    name: str
    variant_type: str  # e.g. BIGINT, DECIMAL(19,2), STRING, VOID, OBJECT<...>
    hint: str | None
    all_dates: bool
    all_timestamps: bool
    # merged kind of the column's numeric values alone, when the batch also holds values of
    # other kinds (10.5 and "n/a"): decides a widening of an existing numeric column only
    numeric_type: str | None = None
    # every hint the batch's events carry for the column (``hint`` is the first of them)
    hints: tuple[str, ...] = ()


def from_variant(obs: ObservedColumn, infer_temporal: bool) -> ColumnType | None:
    t = obs.variant_type.upper()
    if t in ("VOID", ""):
        return None  # all nulls so far: create the column once a value tells its type
    if t in ("BIGINT", "INT", "SMALLINT", "TINYINT"):
        return ColumnType("bigint")
    if t.startswith("DECIMAL"):
        m = re.match(r"DECIMAL\((\d+),(\d+)\)", t)
        scale = int(m.group(2)) if m else 10
        return ColumnType(INFERRED_DECIMAL if scale <= 10 else f"decimal(38,{scale})")
    if t in ("DOUBLE", "FLOAT"):
        return ColumnType("double")
    if t == "BOOLEAN":
        return ColumnType("boolean")
    if t == "STRING":
        if infer_temporal and obs.all_dates:
            return ColumnType("date")
        if infer_temporal and obs.all_timestamps:
            return ColumnType("timestamp")
        return ColumnType("string")
    if t in ("DATE", "TIMESTAMP", "TIMESTAMP_NTZ"):
        return ColumnType("timestamp" if t.startswith("TIMESTAMP") else "date")
    return ColumnType("string", "json")  # OBJECT / ARRAY / anything exotic: keep JSON text


def resolve(obs: ObservedColumn, *, configured: str | None, existing: str | None,
            fmt: str, infer_temporal: bool) -> ColumnType | None:
    """Pick the column's type; ``None`` means "not yet knowable" (only nulls seen)."""
    from cdc_lake.cdc.type_hints import hinted

    stated = hinted(obs.hints or ((obs.hint,) if obs.hint else ()), fmt)
    natural = stated or from_variant(obs, infer_temporal)
    target = configured or existing
    if target is None:
        return natural
    if natural is not None and natural.sql == target:
        return natural
    # Keep the format's decoder (e.g. epoch days -> date) when it produces the target type family.
    if natural is not None and natural.decoder != "plain" and _family(natural.sql) == _family(target):
        return ColumnType(target, natural.decoder, natural.scale, natural.by_hint)
    return ColumnType(target)


def _family(sql: str) -> str:
    return re.sub(r"\(.*", "", sql)


def variant_path(column: str) -> str | None:
    """The variant path of top-level key ``column``, or ``None`` when Spark's path syntax cannot
    spell it. The syntax has no escapes: ``$['...']`` takes any name without ``'``,
    ``$["..."]`` any name without ``"`` (escaping a quote or backslash made ``it's`` fail the
    run and ``b\\s`` read as absent: the tester's findings)."""
    if "'" not in column:
        return "$['" + column + "']"
    if '"' not in column:
        return '$["' + column + '"]'
    return None


def vfield(v: Column, column: str, sql: str) -> Column:
    """``try_variant_get`` of top-level key ``column`` of object ``v`` as ``sql``, for any name."""
    path = variant_path(column)
    if path is not None:
        return F.try_variant_get(v, path, sql)
    # both quote kinds in the name: through a map of the object's fields (slower, rare)
    field = F.try_element_at(F.try_variant_get(v, "$", "map<string,variant>"), F.lit(column))
    return field if sql == "variant" else F.try_variant_get(field, "$", sql)


def qcol(name: str) -> Column:
    """``F.col`` of a column named exactly ``name`` (quoted: a source column name may hold dots,
    backticks, blanks... which ``F.col`` would otherwise parse as a nested field reference)."""
    return F.col("`" + name.replace("`", "``") + "`")


def source_value(v: Column, column: str, spellings: tuple[str, ...] = ()) -> Column:
    """The variant value of ``column`` in row image ``v`` (SQL null when absent).

    ``spellings``: the names the column carries in the events when they differ only in case
    (``Name`` before a source-side rename, ``name`` after): one column for Spark and Delta, read
    from whichever spelling the event carries (an event carrying two of them is quarantined by
    :func:`cdc_lake.cdc.changes.typed_changes`)."""
    names = spellings or (column,)
    vals = [vfield(v, s, "variant") for s in names]
    return vals[0] if len(vals) == 1 else F.coalesce(*vals)


def raw_present(v: Column, column: str, spellings: tuple[str, ...] = ()) -> Column:
    """True when the event carries a non-null value for the column."""
    raw = source_value(v, column, spellings)
    return raw.isNotNull() & ~F.is_variant_null(raw)


def decode(v: Column, column: str, ct: ColumnType, spellings: tuple[str, ...] = (),
           hints: Column | None = None) -> Column:
    """Typed value of ``column`` from variant ``v``; null if absent, null or not castable.
    ``spellings``: see :func:`source_value`. ``hints``: the event's type hints (map column
    ``type_hints``), needed when ``ct.by_hint`` decodes each event by its own hint."""
    if ct.by_hint and hints is not None:
        names = spellings or (column,)
        own = F.coalesce(*[F.try_element_at(hints, F.lit(n)) for n in names])
        out = decode(v, column, ColumnType(ct.sql, ct.decoder, ct.scale), spellings)
        for hint, decoder, scale in ct.by_hint:
            out = F.when(own == F.lit(hint),
                         decode(v, column, ColumnType(ct.sql, decoder, scale), spellings)).otherwise(out)
        return out
    name = spellings[0] if len(spellings) == 1 else column
    p = variant_path(name)
    if len(spellings) > 1 or p is None:
        v, p = source_value(v, column, spellings), "$"
    if ct.decoder == "refuse":  # (type_hints.hinted): null, so the value is quarantined
        return F.lit(None).cast(ct.sql)
    if ct.decoder == "json":
        raw = F.try_variant_get(v, p, "variant")
        val = F.when(F.is_variant_null(raw), F.lit(None)).otherwise(
            F.coalesce(F.try_variant_get(v, p, "string"), F.to_json(raw)))
        return val.cast(ct.sql)
    # Epoch numbers outside years 1 to 9999 decode to null (quarantined as not valid): Spark's
    # conversion fails the whole run past its range (ANSI long overflow), and a year past 9999
    # would be stored where no reader of the table can load it.
    if ct.decoder == "epoch_days":
        days = F.try_variant_get(v, p, "int")
        return F.when(_within(days, "d"),
                      F.date_add(F.lit("1970-01-01").cast("date"), days)).cast(ct.sql)
    if ct.decoder == "epoch_ms":
        ms = F.try_variant_get(v, p, "bigint")
        return F.when(_within(ms, "ms"), F.timestamp_millis(ms)).cast(ct.sql)
    if ct.decoder == "epoch_us":
        us = F.try_variant_get(v, p, "bigint")
        return F.when(_within(us, "us"), F.timestamp_micros(us)).cast(ct.sql)
    if ct.decoder == "epoch_ns":  # truncated to µs, in integers (a double rounds 1e18 values)
        us = _floor_div(F.try_variant_get(v, p, "bigint"), 1000)
        return F.when(_within(us, "us"), F.timestamp_micros(us)).cast(ct.sql)
    if ct.decoder in _TIME_UNITS:
        return _time_of_day(F.try_variant_get(v, p, "bigint"), _TIME_UNITS[ct.decoder])
    if ct.decoder == "b64_decimal":
        as_str = F.try_variant_get(v, p, "string")
        # precise mode lands base64 strings; a JSON number (double/string modes) casts directly
        is_number = F.schema_of_variant(F.try_variant_get(v, p, "variant")) != F.lit("STRING")
        return F.when(is_number, F.try_variant_get(v, p, ct.sql)).otherwise(
            _b64_decimal(as_str, ct.scale, ct.sql))
    return F.try_variant_get(v, p, ct.sql)


# Epoch numbers of years 1 to 9999, by unit (days, ms, µs since 1970).
_EPOCH_RANGE = {"d": (FIRST_SECOND // 86_400, LAST_SECOND // 86_400),
                "ms": (FIRST_SECOND * 1000, LAST_SECOND * 1000 + 999),
                "us": (FIRST_SECOND * 1_000_000, LAST_SECOND * 1_000_000 + 999_999)}


def _within(n: Column, unit: str) -> Column:
    """Whether epoch number ``n`` (unit ``d``, ``ms`` or ``us``) falls in years 1 to 9999."""
    first, last = _EPOCH_RANGE[unit]
    return n.between(F.lit(first), F.lit(last))


def _floor_div(n: Column, d: int) -> Column:
    """``floor(n / d)`` for a bigint ``n``, exactly (``n / d`` is a double: 1704105000123456999
    / 1000 rounds to ...457)."""
    return F.floor(n.cast("decimal(20,0)") / F.lit(d)).cast("bigint")  # decimals: exact


# A date column takes a full date, nothing dropped (no time part): Spark's string -> date cast
# would also take "2024-01-01 10:30:00" or "2024-01-01T..." (time dropped) and "2024" / "2024-05"
# (day made up).
_EXACT_DATE_RE = r"^\s*[+-]?\d{4,}-\d{1,2}-\d{1,2}\s*$"
EXACT_DATE_RE = _EXACT_DATE_RE  # (the enrichment's events source checks dates alike)
# A timestamp string with sub-microsecond digits that are not all zero (stored truncated to µs).
_BEYOND_MICROS_RE = r":\d{2}[.,]\d{6}0*[1-9]"
# A timestamp string naming its time zone (two letters or more other than UTC / GMT / UT: an
# abbreviation such as PST or CST, a region such as America/Los_Angeles). Spark maps an
# abbreviation to a region that follows daylight saving (PST -> America/Los_Angeles: "01:30
# PST" on the night DST ends was stored as the PDT instant, CST as US Central instead of China
# Standard Time) and silently picks an instant for a local time a region skips or repeats
# (tester): such a value names no fixed offset, so it is not taken.
NAMED_ZONE_RE = r"(?i)(?<![A-Z])(?!(?:UTC|GMT|UT)(?![A-Z]))[A-Z]{2,}"


def kind_checked(sql: str) -> bool:
    """Whether values decoded (plain decoder) into ``sql`` need :func:`kind_exact`: boolean,
    date, timestamp and double columns (integers and decimals: ``widening.exact``)."""
    return sql.strip().lower() in ("boolean", "date", "timestamp", "double", "float")


def kind_exact(raw: Column, decoded: Column, sql: str) -> Column:
    """True unless the stored ``decoded`` value would be a changed form of the source ``raw``
    (variant) in a boolean, date or timestamp column (a null ``decoded``: true, the caller
    quarantines it as not valid).

    * ``boolean``: JSON ``true``/``false``, the strings ``"true"``/``"false"`` and the numbers
      0 and 1 are exact; anything else Spark would cast (``2``, ``"yes"``, ``"t"``) is not.
    * ``date``: a string holding a full date and nothing else (``"2024-01-01"``, surrounding
      blanks allowed); ``"2024-01-01 10:30:00"``, ``"2024-01-01T00:00:00"``, ``"2024-05"`` and
      non-strings are not.
    * ``timestamp``: a string Spark parses, except one with non-zero digits beyond
      microseconds (``"... 10:30:00.1234567"`` would be stored truncated), one outside years
      1 to 9999 in UTC, or one naming its time zone (``PST``, ``America/Los_Angeles``: no fixed
      offset, see ``NAMED_ZONE_RE``); not a number (Spark would read it as seconds). A
      date-only string is midnight, an offset (``Z``, ``UTC``, ``+08:00``) is converted to UTC:
      the same instant, exact.
    * ``double``: any finite value; an infinite or NaN one only from a string spelling it
      (``"Infinity"``, ``"NaN"``: PostgreSQL floats); a number beyond the double range (``1e400``,
      parsed as Infinity) is not.

    Example::

        kind_exact(raw, decoded, "boolean")  # F.lit(2) -> false (would be stored as true)
    """
    t = sql.strip().lower()
    text = F.try_variant_get(raw, "$", "string")
    if t == "boolean":
        kind = F.schema_of_variant(raw)
        ok = (F.when(kind == "BOOLEAN", F.lit(True))
              .when(kind == "STRING", text.isin("true", "false"))
              .otherwise(F.try_variant_get(raw, "$", "decimal(38,18)")
                         == decoded.cast("int").cast("decimal(38,18)")))
    elif t == "date":  # (a JSON number does not cast to a date: null, quarantined as not valid)
        ok = (F.schema_of_variant(raw) == "STRING") & text.rlike(_EXACT_DATE_RE)
    elif t == "timestamp":  # cheap first: only strings longer than "...:SS.ffffff" can lose digits
        # a number is not exact: Spark reads it as seconds (an epoch-day, ms or µs number landed
        # in 1970 or far future: tester); its unit is the schema's business (Debezium decoders).
        # A string must also fall in years 1 to 9999 once converted to UTC, as the epoch
        # decoders require: "9999-12-31T23:30:00-01:00" was stored as the year 10000, which no
        # reader of the table could load (tester)
        first, last = _EPOCH_RANGE["us"]
        ok = (F.schema_of_variant(raw) == "STRING") & (
            ~(F.length(text) > 26) | ~text.rlike(_BEYOND_MICROS_RE)) & (
            F.unix_micros(decoded.cast("timestamp")).between(F.lit(first), F.lit(last))) & (
            ~text.rlike(NAMED_ZONE_RE))
    elif t in ("double", "float"):  # a number beyond the double range parses as +-Infinity
        ok = (~(F.isnan(decoded) | decoded.isin(float("inf"), float("-inf")))
              | ((F.schema_of_variant(raw) == "STRING")
                 & text.rlike(r"(?i)^\s*[+-]?(inf|infinity|nan)\s*$")))
    else:
        return F.lit(True)
    return F.when(decoded.isNull(), F.lit(True)).otherwise(F.coalesce(ok, F.lit(False)))


def kind_proven(obs: ObservedColumn, sql: str) -> bool:
    """Whether the batch's survey already proves :func:`kind_exact` for every value of the
    column (so the per-value check is skipped, like ``widening.proven_exact``): a boolean column
    whose values are all JSON booleans (``BOOLEAN``); a date column whose values all look like
    ``YYYY-MM-DD`` (the survey's ``all_dates``); a double column of integers or decimals; a
    column with only nulls (``VOID``)."""
    v, t = obs.variant_type.strip().upper(), sql.strip().lower()
    if v == "VOID":
        return True
    if t == "boolean":
        return v == "BOOLEAN"
    if t == "date":
        return v == "STRING" and obs.all_dates
    if t in ("double", "float"):  # integers and decimals never parse beyond the double range
        return v in ("TINYINT", "SMALLINT", "INT", "BIGINT") or v.startswith("DECIMAL")
    return False


_TIME_UNITS = {"time_ms": 1000, "time_us": 1, "time_ns": -1000}  # factor to microseconds


def _time_of_day(n: Column, unit: int) -> Column:
    """Connect/Debezium TIME (ms/us/ns since midnight; MySQL TIME may exceed 24h or be negative)
    -> ``[-]HH:MM:SS[.ffffff]``, the text Canal and Maxwell deliver for TIME columns."""
    us = _floor_div(n, -unit) if unit < 0 else n * F.lit(unit)
    mag = F.abs(us)
    secs = F.floor(mag / 1_000_000)
    frac = (mag % 1_000_000).cast("bigint")
    # %02d pads and never cuts: lpad(.., 2) cut 100:00:00 to 10:00:00 (MySQL TIME reaches
    # 838:59:59; tester)
    text = F.concat(F.when(us < 0, F.lit("-")).otherwise(F.lit("")),
                    F.format_string("%02d:%02d:%02d", F.floor(secs / 3600).cast("bigint"),
                                    F.floor((secs % 3600) / 60).cast("bigint"),
                                    (secs % 60).cast("bigint")),
                    F.when(frac != 0, F.concat(F.lit("."), F.regexp_replace(
                        F.lpad(frac.cast("string"), 6, "0"), "0+$", ""))).otherwise(F.lit("")))
    return F.when(n.isNotNull(), text)


def _b64_decimal(b64: Column, scale: int, sql: str) -> Column:
    """Kafka Connect ``Decimal`` (big-endian two's complement, base64) -> decimal, up to 16
    bytes: every value Spark's decimal(38) holds (a value beyond it decodes to null and is
    quarantined as not valid; Debezium's ``decimal.handling.mode=string`` keeps such values)."""
    hx = F.hex(F.unbase64(b64))
    negative = F.substring(hx, 1, 1) >= F.lit("8")
    # two's complement: a negative value is -(complement + 1); complement the hex digits
    bits = F.lpad(F.when(negative, F.translate(hx, "0123456789ABCDEF", "FEDCBA9876543210"))
                  .otherwise(hx), 32, "0")
    big = "decimal(38,0)"
    high = F.conv(F.substring(bits, 1, 16), 16, 10).cast(big)  # conv: unsigned 64 bits
    low = F.conv(F.substring(bits, 17, 16), 16, 10).cast(big)
    unsigned = F.try_add(F.try_multiply(high, F.lit(str(2 ** 64)).cast(big)), low)  # null: > 38 digits
    magnitude = F.when(negative, F.try_add(unsigned, F.lit(1).cast(big))).otherwise(unsigned).cast("string")
    sign = F.when(negative, F.lit("-")).otherwise(F.lit(""))
    # lpad also truncates longer strings: pad only short ones (0.05 -> "005")
    digits = F.when(F.length(magnitude) < scale + 1, F.lpad(magnitude, scale + 1, "0")).otherwise(magnitude)
    if scale:
        pattern = rf"^(\d+)(\d{{{scale}}})$"
        text = F.concat(sign, F.regexp_extract(digits, pattern, 1), F.lit("."),
                        F.regexp_extract(digits, pattern, 2))
    else:
        text = F.concat(sign, digits)
    # empty bytes are no Connect Decimal (BigInteger rejects them); a value the column's type
    # would round (scale 4 into decimal(38,2)) is refused, not stored changed (tester). Checked
    # on the text: Spark compares decimal(38,2) with decimal(38,4) at scale 2 (1.23 == 1.2345).
    m = re.match(r"decimal\(\d+,\s*(\d+)\)", sql.strip().lower())
    dropped = scale - int(m.group(1)) if m else 0
    ok = (F.length(hx) > 0) & (F.length(hx) <= 32)
    if dropped > 0:
        ok = ok & F.substring(text, -dropped, dropped).rlike("^0+$")
    return F.when(ok, text.try_cast(sql))


def parse_object_schema(text: str | None) -> dict[str, str]:
    """Fields of a ``schema_of_variant_agg`` result: ``OBJECT<a: BIGINT, `b c`: STRING>``.

    Non-object results (a row image that is not a JSON object) give no columns.
    """
    if not text or not text.startswith("OBJECT<") or not text.endswith(">"):
        return {}
    body, fields, i = text[len("OBJECT<"):-1], {}, 0
    while i < len(body):
        if body[i] == "`":  # quoted name, `` escapes a backtick
            j, name = i + 1, []
            while True:
                if body[j] == "`" and body[j + 1:j + 2] == "`":
                    name.append("`")
                    j += 2
                elif body[j] == "`":
                    break
                else:
                    name.append(body[j])
                    j += 1
            key, i = "".join(name), j + 1
        else:
            j = body.index(":", i)
            key, i = body[i:j], j
        i += 2  # ": "
        depth, start = 0, i
        while i < len(body) and not (depth == 0 and body[i] == ","):
            depth += body[i] in "<(" or -(body[i] in ">)")
            i += 1
        fields[key] = body[start:i].strip()
        i += 2  # ", "
    return fields
