"""Column type widening and the exactness guard: a stored value is never a changed value.

A column's type is fixed by the first batch that had values for it. When a later batch needs a
wider type, the column is widened if every value the old type can hold is held exactly by the
new one (:func:`widen`); otherwise each value is checked on its own (:func:`exact`) and a value
the column cannot hold exactly goes to quarantine with a reason naming table, column, value and
type — never stored rounded or truncated.

Lossless widenings (the only ones done; the existing type on the left):

======================  ======================================================================
tinyint/smallint/int    a wider integer (``int -> bigint``), ``double`` (exact for 32 bits),
                        or ``decimal(p,s)`` with ``p - s`` >= the integer's digits (3/5/10/20)
bigint                  ``decimal(p,s)`` with ``p - s >= 20`` — e.g. ``decimal(38,10)``,
                        the type JSON fractions get, so ``10`` then ``10.5`` gives the same
                        type whether they arrived in one batch or two
float                   ``double``
decimal(p,s)            ``decimal(p',s')`` with ``s' >= s`` and ``p'-s' >= p-s`` (``p' <= 38``)
======================  ======================================================================

Not widened (values checked one by one instead): ``bigint``/``decimal`` to ``double`` (not
exact above 2^53 / for most decimals), a decimal whose integer digits would shrink, anything
to or from non-numeric types. Columns with a type in config (``tables.<t>.types``) are never
widened.

Example::

    widen("bigint", "decimal(38,10)")   # -> "decimal(38,10)"
    widen("bigint", "int")              # -> None (int values fit bigint: nothing to do)
    widen("decimal(38,10)", "double")   # -> None (values are checked with exact())
"""

from __future__ import annotations

import re

from pyspark.sql import Column
from pyspark.sql import functions as F

_INT_DIGITS = {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 20}
_INT_ORDER = ["tinyint", "smallint", "int", "bigint"]
_ALIASES = {"byte": "tinyint", "short": "smallint", "integer": "int", "long": "bigint",
            "float": "float", "real": "float", "double": "double"}
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_CHECK_SCALE = 18  # exactness is compared at this many fractional digits


def _norm(sql: str) -> str:
    t = sql.strip().lower()
    return _ALIASES.get(t, t)


def _decimal(t: str) -> tuple[int, int] | None:
    m = _DECIMAL.match(t)
    return (int(m.group(1)), int(m.group(2))) if m else None


def same_type(a: str, b: str) -> bool:
    """Whether two Spark / Delta type names name one type (``long`` and ``bigint``)."""
    return _norm(a).replace(" ", "") == _norm(b).replace(" ", "")


def pin_fits(stored: str, pin: str) -> bool:
    """Whether a ``types`` pin can apply to a column stored as ``stored``: the same type, or a
    lossless widening of it to exactly the pin (``decimal(10,2)`` -> ``decimal(12,4)``,
    ``int`` -> ``bigint``; not ``bigint`` -> ``double``, nor anything narrower)."""
    if same_type(stored, pin):
        return True
    s, p = _norm(stored).replace(" ", ""), _norm(pin).replace(" ", "")
    w = widen(s, p)
    return w is not None and w.replace(" ", "") == p


def widen(existing: str, incoming: str) -> str | None:
    """The type ``existing`` must become to hold ``incoming``'s values exactly, if a lossless
    widening does it; ``None`` when nothing changes (already wide enough) or none is lossless."""
    e, i = _norm(existing), _norm(incoming)
    if e == i:
        return None
    if e in _INT_DIGITS:
        if i in _INT_DIGITS:
            return i if _INT_ORDER.index(i) > _INT_ORDER.index(e) else None
        if i == "double":
            return "double" if e != "bigint" else None
        d = _decimal(i)
        if d is not None:
            p, s = d
            need = max(p - s, _INT_DIGITS[e]) + s
            return f"decimal({need},{s})" if need <= 38 else None
        return None
    if e == "float":
        return "double" if i in ("double", *_INT_DIGITS, ) or _decimal(i) else None
    de = _decimal(e)
    if de is not None:
        p, s = de
        di = _decimal(i) or ((_INT_DIGITS[i], 0) if i in _INT_DIGITS else None)
        if di is None:
            return None
        p2, s2 = di
        scale = max(s, s2)
        need = max(p - s, p2 - s2) + scale
        if need > 38 or (need, scale) == (p, s):
            return None
        return f"decimal({need},{scale})"
    return None


def checked(sql: str) -> bool:
    """Whether values decoded into ``sql`` need the exactness guard (integers and decimals)."""
    t = _norm(sql)
    return t in _INT_DIGITS or _decimal(t) is not None


_VARIANT_DECIMAL = re.compile(r"^DECIMAL\((\d+),\s*(\d+)\)$")


def proven_exact(variant_type: str, sql: str) -> bool:
    """Whether a batch's values of a column decode into ``sql`` exactly or not at all, judged
    from their merged variant type alone (what the survey's ``schema_of_variant_agg`` reports),
    so that :func:`exact` need not run on each value.

    True for: a column with only nulls (``VOID``); integer targets when every value is a JSON
    integer (``BIGINT``, or ``DECIMAL(p,0)`` beyond 64 bits); decimal targets when every value
    is an integer or a decimal with at most the target's scale. A value out of the target's
    range then decodes to null and is quarantined as not valid, as with the check. Anything
    else (doubles, strings, mixed kinds: ``DOUBLE``, ``STRING``, ``VARIANT``; a decimal with
    more fractional digits) keeps the per-value check. Merged decimals too wide for 38 digits
    come out as ``DOUBLE`` (Spark's JSON type merge), so they are never taken as proven.

    Example::

        proven_exact("DECIMAL(8,2)", "decimal(12,2)")   # True
        proven_exact("DECIMAL(8,3)", "decimal(12,2)")   # False: 1.234 would be rounded
        proven_exact("BIGINT", "int")                   # True: too big -> null -> quarantined
    """
    v, t = variant_type.strip().upper(), _norm(sql)
    if v == "VOID":
        return True
    dv = _VARIANT_DECIMAL.match(v)
    scale = 0 if v == "BIGINT" else int(dv.group(2)) if dv else None
    if scale is None:
        return False
    if t in _INT_DIGITS:
        return scale == 0
    dt = _decimal(t)
    return dt is not None and scale <= dt[1]


def exact(raw: Column, decoded: Column) -> Column:
    """True unless ``decoded`` (the stored value) differs from the source value ``raw`` (variant).

    Both sides are compared as ``decimal(38,18)``, or as double when the source is beyond that
    range. A non-numeric source (e.g. a string that does not parse) gives true here: the cast
    already nulled it and the caller quarantines nulls from present values.
    """
    as_dec = F.try_variant_get(raw, "$", f"decimal(38,{_CHECK_SCALE})")
    as_dbl = F.try_variant_get(raw, "$", "double")
    return (F.when(decoded.isNull(), F.lit(True))
            .when(as_dec.isNotNull(), decoded.try_cast(f"decimal(38,{_CHECK_SCALE})") == as_dec)
            .when(as_dbl.isNotNull(), decoded.try_cast("double") == as_dbl)
            .otherwise(F.lit(True)))
