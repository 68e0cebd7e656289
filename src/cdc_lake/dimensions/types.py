"""Snapshot column types vs. the types they must be stored as: a stored value is never a changed one.

A snapshot column may arrive with another type than the one it is stored as — a CSV without
``schema:`` is inferred anew each day (``1`` is ``int``, ``1.5`` is ``double``, ``heavy`` is
``string``), a declared ``schema:`` type may not hold the file's values, a Parquet export may
change a column's type. Per column (snapshot type ``S``, stored type ``T``):

* ``S`` fits ``T`` by type (every ``S`` value is held exactly by ``T``: ``int`` into ``bigint``,
  ``double`` or a wide enough decimal, anything into ``string``, an all-NULL column): cast;
* a table column whose type has a **lossless widening** that holds ``S``
  (:func:`cdc_lake.cdc.widening.widen`, the CDC kind's rule: ``int -> bigint``,
  ``int -> double``, ``int -> decimal(p,s)``, ``float -> double``, decimal precision/scale): the
  table column is widened (:meth:`Engine.widen`, one same-rows rewrite commit readers skip) and
  the snapshot cast to the wider type;
* otherwise each value is checked (:func:`misfit`): converted to ``T`` and back it must be the
  same value (numbers from text are compared as ``decimal(38,18)``). Any value that is not
  refuses the whole snapshot (:class:`SnapshotInvalid`, exit 3) naming file, column, up to 5
  example values, both types and the fix; nothing is written. If every value fits, the column
  is cast (``2.0`` into an ``int`` column is ``2``).

Example::

    plan, snap = plan_types(snap, table_schema, where="/snaps/2026-01-02.csv", meta=SCD1_META,
                            fix="declare it in `schema:` of dim.yaml and rebuild the table")
    plan.widen          # {'weight': 'double'}  (table column int, snapshot 1.5)
    engine.widen(table_path, plan.widen)   # then MERGE ``snap`` (already cast)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_lake.cdc.widening import widen

_INTEGERS = ("tinyint", "smallint", "int", "bigint")
_EXAMPLES = 5


def quote(name: str) -> str:
    """``name`` as a Spark column reference: backticks, a backtick inside doubled (``p.id`` is one
    column named ``p.id``, not field ``id`` of ``p``)."""
    return "`" + name.replace("`", "``") + "`"


class SnapshotInvalid(ValueError):
    """The snapshot cannot be applied (duplicate/null keys, a column of the table is missing,
    a value its column's type cannot hold exactly)."""


def refuse_case_twins(names: list[str], where: str) -> None:
    """Raise :class:`SnapshotInvalid` when ``names`` holds one column twice, compared
    case-insensitively as Spark and Delta resolve names (``Name`` and ``name``)."""
    seen: dict[str, str] = {}
    for c in names:
        if c.lower() in seen:
            raise SnapshotInvalid(
                f"{where}: the snapshot names the column {seen[c.lower()]!r} twice (as {c!r} "
                "too; names compared case-insensitively, as Spark and Delta resolve them), so "
                "nothing was written. Rename or drop one of them in the export and re-run this date")
        seen[c.lower()] = c


def _scale(t: str) -> int | None:
    """Fraction digits an exact numeric type holds (integers 0, ``decimal(p,s)`` s); None for
    floating point."""
    if t in _INTEGERS:
        return 0
    m = re.match(r"decimal\((\d+),\s*(\d+)\)$", t)
    return int(m.group(2)) if m else None


def _numeric(t: str) -> bool:
    return t in _INTEGERS or t in ("float", "double") or t.startswith("decimal(")


def fits(s: str, t: str) -> bool:
    """Every value of type ``s`` is held exactly by type ``t`` (Spark simple type strings)."""
    if s == t or s == "void" or t == "string":
        return True
    w = widen(s, t)
    return w is not None and w.replace(" ", "") == t


# Years 1 to 9999 in UTC, in microseconds since 1970: what Spark, Delta readers and Python hold.
_FIRST_MICROS, _LAST_MICROS = -62_135_596_800_000_000, 253_402_300_799_999_999


def beyond_micros(c: Column) -> Column:
    """True for timestamp text with a non-zero fraction digit past the 6th
    (``10:00:00.1234567``, ``10:00:00.0000009``): Spark's cast keeps 6 digits and drops the rest
    silently; ``10:00:00.1234560`` is exact."""
    return F.regexp_extract(c, r":[0-9]{1,2}\.[0-9]{6}([0-9]+)", 1).rlike("[1-9]")


def _far(conv: Column, t: str) -> Column:
    """True for a converted ``timestamp`` / ``timestamp_ntz`` / ``date`` outside years 1-9999
    (UTC): text with an offset can leave the range ("9999-12-31T23:30:00-01:00" is the year
    10000), and no reader of the table loads such a value."""
    if t == "timestamp":
        return ~F.unix_micros(conv).between(F.lit(_FIRST_MICROS), F.lit(_LAST_MICROS))
    return ~F.year(conv).between(F.lit(1), F.lit(9999))


def reasons(c: Column, s: str, t: str) -> dict[str, Column]:
    """Named kinds of :func:`misfit` for the message (``{"outside years 1-9999 (UTC)": ...}``);
    each is True only for a value :func:`misfit` refuses. Empty when there is no named kind."""
    if s != "string" or t not in ("timestamp", "timestamp_ntz", "date"):
        return {}
    conv = c.try_cast(t)
    out = {"outside years 1-9999 (UTC)": conv.isNotNull() & F.coalesce(_far(conv, t), F.lit(False))}
    if t != "date":
        out["with a non-zero digit beyond microseconds (a timestamp holds 6 fraction digits; "
            "Spark would drop the rest)"] = c.isNotNull() & beyond_micros(c)
        out["with a time zone given by name (PST, America/Los_Angeles: no fixed offset; give Z, "
            "UTC or a numeric offset such as +08:00)"] = c.isNotNull() & named_zone(c)
    return out


def named_zone(c: Column) -> Column:
    """True for timestamp text naming its zone (:data:`cdc_lake.cdc.column_types.NAMED_ZONE_RE`):
    Spark reads ``PST`` as America/Los_Angeles, which follows daylight saving, ``CST`` as US
    Central, and picks an instant for a local time a region skips or repeats (tester: stored
    1 h or 13 h off, exit 0)."""
    from cdc_lake.cdc.column_types import NAMED_ZONE_RE

    return c.rlike(NAMED_ZONE_RE)


def misfit(c: Column, s: str, t: str) -> Column:
    """True for a present value of type ``s`` that type ``t`` cannot hold exactly (not
    convertible, out of range, rounded or truncated)."""
    conv = c.try_cast(t)
    if s == "string" and _numeric(t):
        dec = c.try_cast("decimal(38,18)")
        same = F.when(dec.isNotNull(), conv.try_cast("decimal(38,18)") == dec) \
            .otherwise(conv.try_cast("double") == c.try_cast("double"))
        scale = _scale(t)
        if scale is not None:
            # decimal(38,18) itself rounds past 18 places: 2.0000000000000000001 compared equal
            # to 2.00 (stored rounded, exit 0; tester). Plain text: its significant fraction
            # digits must fit the scale; exponent text: the stored value must be the same double
            digits = F.regexp_extract(F.trim(c), r"^[+-]?[0-9]*\.([0-9]*?)0*$", 1)
            exp = F.lower(c).contains("e") & (conv.try_cast("double") != c.try_cast("double"))
            same = same & (F.length(digits) <= scale) & ~F.coalesce(exp, F.lit(False))
    elif s == "string" and t in ("timestamp", "timestamp_ntz"):  # in years 1-9999 and no
        # digit past microseconds ("...00.0000009" was stored as "...00", exit 0; tester)
        same = ~_far(conv, t) & ~beyond_micros(c) & ~named_zone(c)
    elif s == "string" and t == "date":  # and no time of day: "2026-01-01 13:45:00" was stored
        # as 2026-01-01 under a declared date (exit 0; tester K); midnight text is exact
        ts = c.try_cast("timestamp")
        same = ~_far(conv, t) & ~F.coalesce(ts.isNotNull() & (ts != conv.cast("timestamp")),
                                             F.lit(False))
    elif s == "string":
        same = F.lit(True)  # booleans from text: convertible is exact enough
    else:
        same = conv.try_cast(s).eqNullSafe(c)
    return c.isNotNull() & (conv.isNull() | ~F.coalesce(same, F.lit(False)))


def out_of_range(c: Column, t: str) -> Column | None:
    """True for a present ``timestamp`` / ``timestamp_ntz`` / ``date`` value outside years 1-9999
    (UTC): a Parquet export or Spark's CSV type inference can hold one, no reader of the table
    loads it back. None for any other type."""
    if t in ("timestamp", "timestamp_ntz"):
        micros = F.unix_micros(c.cast("timestamp"))
        return c.isNotNull() & ~micros.between(F.lit(_FIRST_MICROS), F.lit(_LAST_MICROS))
    if t == "date":
        return c.isNotNull() & ~F.year(c).between(F.lit(1), F.lit(9999))
    return None


def conform(df: DataFrame, targets: dict[str, str], *, where: str, against: str, fix: str) -> DataFrame:
    """Cast ``df``'s columns to ``targets`` (column -> type) after checking that every value
    converts exactly; raises :class:`SnapshotInvalid` naming each column that does not, with up
    to 5 example values per kind of problem (:func:`reasons`; one Spark job for the check, one
    more per problem found for its examples)."""
    src = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    checks = {c: t for c, t in targets.items() if c in src and not fits(src[c], t)}
    shapes = _other_shapes(df, {c: t for c, t in checks.items()}, src, against)
    if shapes:
        raise SnapshotInvalid(f"{where}: " + "; ".join(shapes) + ". Nested fields are not added, "
                              f"removed or renamed in a stored column, so nothing was written. {fix}")
    if checks:
        kinds = {c: _kinds(F.col(quote(c)), src[c], t) for c, t in checks.items()}
        flat = [(c, why, bad) for c, ks in kinds.items() for why, bad in ks.items()]
        row = df.agg(*[F.count_if(b).alias(f"n{i}") for i, (_, _, b) in enumerate(flat)]).first()
        problems = []
        for i, (c, why, bad) in enumerate(flat):
            n = int(row[f"n{i}"] or 0)  # type: ignore[index]
            if not n:
                continue
            ex = [r[0] for r in df.where(bad).select(F.col(quote(c)).cast("string"))
                  .distinct().limit(_EXAMPLES).collect()]
            what = why or (f"that {against} type {checks[c]} cannot hold exactly (the snapshot's "
                           f"values are {src[c]})")
            if why:
                what += f" for {against} type {checks[c]}"
            problems.append(f"column {c!r}: {n} value(s) {what}, e.g. {ex}")
        if problems:
            raise SnapshotInvalid(
                f"{where}: " + "; ".join(problems) + ". Stored they would be changed (rounded, "
                f"truncated or lost), so nothing was written. {fix}")
    return df.select(*[F.col(quote(c)).cast(targets[c]).alias(c) if c in targets
                       and src[c] != targets[c] else F.col(quote(c)) for c in df.columns])


def _other_shapes(df: DataFrame, checks: dict[str, str], src: dict[str, str], against: str) -> list[str]:
    """Columns of a nested type (struct, array, map) whose target has other nested fields — a
    struct field added, removed, renamed or moved in an export — named with both types. Spark
    casts a struct to another by position: a renamed field was stored under the old name, and
    one added failed the value check with ``DATATYPE_MISMATCH`` (exit 1, which Airflow retries
    in vain; tester, Parquet). No Spark job."""
    from pyspark.sql.types import DataType

    nested = ("struct<", "array<", "map<")
    found = []
    for c, t in checks.items():
        if not (src[c].startswith(nested) or t.replace(" ", "").lower().startswith(nested)):
            continue
        try:
            target = DataType.fromDDL(t)
        except Exception:  # noqa: BLE001 - a type text Spark's parser does not read back: unchecked
            continue
        if _shape(df.schema[c].dataType) != _shape(target):
            found.append(f"column {c!r} is {src[c]} in the snapshot, which {against} type {t} "
                         "cannot hold (other nested fields, or in another order)")
    return found


def _shape(t: object) -> object:
    """A data type's nesting with its struct field names (lower case: Delta's column names are
    case-insensitive) and no leaf types: what a positional cast keeps or breaks."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(t, StructType):
        return ("struct", tuple((f.name.lower(), _shape(f.dataType)) for f in t.fields))
    if isinstance(t, ArrayType):
        return ("array", _shape(t.elementType))
    if isinstance(t, MapType):
        return ("map", _shape(t.keyType), _shape(t.valueType))
    return "leaf"


def _kinds(c: Column, s: str, t: str) -> dict[str, Column]:
    """The values of ``c`` that ``t`` cannot hold, split by :func:`reasons` (key ``""``: any
    other misfit); every misfit value is in exactly one kind."""
    kinds: dict[str, Column] = {}
    claimed = F.lit(False)
    for why, bad in reasons(c, s, t).items():  # the first kind that applies claims the value
        bad = F.coalesce(bad, F.lit(False))
        kinds[why] = bad & ~claimed
        claimed = claimed | bad
    kinds[""] = misfit(c, s, t) & ~claimed
    return kinds


@dataclass
class TypePlan:
    """What one snapshot needs against the table: columns to widen in the table first, and the
    type each snapshot column is cast to (checked by :func:`conform`)."""

    widen: dict[str, str] = field(default_factory=dict)  # table column -> wider type
    before: dict[str, str] = field(default_factory=dict)  # its type before widening
    cast: dict[str, str] = field(default_factory=dict)  # snapshot column -> stored type

    def describe(self) -> dict[str, str]:
        return {c: f"{self.before[c]} -> {t}" for c, t in self.widen.items()}


def check_columns(snap: DataFrame, table: StructType | None, meta: tuple[str, ...], where: str) -> None:
    """Refuse a snapshot that lacks a column of the table (a refresh would keep stale values)."""
    if table is None:
        return
    lost = [f.name for f in table.fields if f.name not in meta and f.name not in snap.columns]
    if lost:
        raise SnapshotInvalid(f"{where}: column(s) {lost} of the dimension table are missing from "
                              "the snapshot; a refresh would keep stale values. Restore the "
                              "column(s) in the export (or rebuild the table without them)")


def plan_types(snap: DataFrame, table: StructType | None, *, meta: tuple[str, ...], where: str,
               fix: str) -> tuple[TypePlan, DataFrame]:
    """Decide widening and casts for ``snap`` against the table schema ``table`` (None: no table
    yet) and check every value that needs it; returns the plan and the snapshot cast to the
    types it is stored as (the table's, widened). Raises :class:`SnapshotInvalid` before
    anything is written."""
    check_columns(snap, table, meta, where)
    plan = TypePlan()
    if table is None:
        return plan, snap
    stored = {f.name: f.dataType.simpleString() for f in table.fields}
    for f in snap.schema.fields:
        t, s = stored.get(f.name), f.dataType.simpleString()
        if t is None or s == t:
            continue
        if fits(s, t):
            plan.cast[f.name] = t
            continue
        w = widen(t, s)
        if w is not None and fits(s, w.replace(" ", "")):
            plan.widen[f.name] = plan.cast[f.name] = w.replace(" ", "")
            plan.before[f.name] = t
        else:
            plan.cast[f.name] = t
    return plan, conform(snap, plan.cast, where=where, against="the dimension table's", fix=fix)
