"""The job's own tables follow the types of what it writes into them.

Upstream types change: the CDC kind widens a column (``int -> bigint``, ``bigint ->
decimal(38,10)`` when a fraction arrives), a dimension attribute gets a wider type, a dimension
that had no table yet (its outputs written as null strings) appears with its real types. Casting
a batch's rows to a table's old types would store changed values (``2.5`` as ``2``), so before
a batch writes, each MERGE target is fitted to its source (:func:`fit_table`):

* the table's type already holds every value of the source's type exactly (``bigint`` for
  ``int``, ``double`` for ``float``): nothing to do;
* a lossless widening exists (:func:`cdc_lake.cdc.widening.widen`, the CDC kind's rules): the
  table is rewritten once with the wider type (``Engine.widen``: same rows, a commit that
  change-feed readers skip);
* every value the column holds is held exactly by the source's type (it survives the cast and
  back unchanged: ``bigint`` values within 2^53 as ``double``, only nulls — the outputs of a
  dimension that had no table yet): the table is rewritten with the source's type;
* otherwise — a stored value the new type would change, or an aggregate ``group_by`` column
  holding values whose new type would change the stored group keys (``5`` -> ``5.0``) — the run
  stops before any write of the batch
  with :class:`~cdc_lake.enrich.state.EnrichNeedsReprocess` (exit 3) naming table, column and
  both types; ``--reprocess`` rebuilds the outputs in the current types.

Example::

    schema = fit_table(engine, cfg, "enriched", str(cfg.outputs.enriched), source.schema)
    source = align(source, schema)     # now a cast only ever widens
"""

from __future__ import annotations

from collections.abc import Collection

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import NullType, StructType

from cdc_lake.cdc.widening import widen
from cdc_lake.engines import Engine
from cdc_lake.enrich.config import EnrichConfig
from cdc_lake.enrich.state import EnrichNeedsReprocess, recovery_command

_INTEGERS = ("tinyint", "smallint", "int", "bigint")


def holds(existing: str, incoming: str) -> bool:
    """Whether every value of type ``incoming`` is stored exactly in a column of ``existing``."""
    return existing == incoming or widen(incoming, existing) == existing


def fit_table(engine: Engine, cfg: EnrichConfig, table: str, path: str, incoming: StructType,
              *, group_columns: Collection[str] = ()) -> StructType | None:
    """Widen ``path``'s columns where ``incoming`` needs it (see the module docstring); the
    table's schema after that, None when the table does not exist."""
    existing = engine.schema(path)
    if existing is None:
        return None
    have = {f.name: f.dataType.simpleString() for f in existing.fields}
    change: dict[str, str] = {}
    problems: list[str] = []
    for f in incoming.fields:
        old = have.get(f.name)
        new = f.dataType.simpleString()
        if old is None or isinstance(f.dataType, NullType) or holds(old, new):
            continue
        wider = widen(old, new)
        group = f.name in group_columns
        if wider is not None and (not group or wider in _INTEGERS):
            change[f.name] = wider
        elif _all_held(engine.read(path), f.name, new, nulls_only=group):
            change[f.name] = new
        else:
            why = ("a group_by column holding values: a new type would change its stored group "
                   "keys" if group else f"a value of the table is not held exactly by {new}")
            problems.append(f"column {f.name!r} is {old} in the table, {new} in this batch ({why})")
    if problems:
        raise EnrichNeedsReprocess(
            f"pipeline {cfg.name}: output {table} ({path}): " + "; ".join(problems) + ". The "
            "batch was not written (casting would store changed values). The upstream type "
            f"changed: rebuild the outputs in the new types with: {recovery_command(cfg)}")
    if not change:
        return existing
    print(f"[enrich] widening {table}: " + ", ".join(
        f"{c} {have[c]} -> {t}" for c, t in change.items()), flush=True)
    engine.widen(path, change)
    return engine.schema(path)


def _all_held(df: DataFrame | None, column: str, new: str, *, nulls_only: bool) -> bool:
    """Whether every value of ``column`` survives a cast to ``new`` and back unchanged (e.g.
    ``bigint`` values within 2^53 as ``double``; nulls always); with ``nulls_only``, whether it
    holds only nulls."""
    if df is None:
        return True
    c = F.col("`" + column.replace("`", "``") + "`")
    bad = c.isNotNull()
    if not nulls_only:
        there = c.try_cast(new)
        bad = bad & (there.isNull() | ~there.cast(df.schema[column].dataType).eqNullSafe(c))
    return df.where(bad).limit(1).count() == 0


def as_types(df: DataFrame, schema: StructType) -> DataFrame:
    """``df`` with each column ``schema`` also has cast to ``schema``'s type (an own table read
    at an older version, before a widening, combined with this batch's rows)."""
    types = {f.name: f.dataType for f in schema.fields}
    return df.select(*[F.col(f"`{f.name}`").cast(types[f.name]).alias(f.name)
                       if f.name in types and types[f.name].simpleString() != f.dataType.simpleString()
                       and not isinstance(types[f.name], NullType)
                       else F.col(f"`{f.name}`") for f in df.schema.fields])
