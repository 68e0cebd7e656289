"""Incremental aggregates from signed deltas: new contribution minus old, MERGEd; never recomputed.

For each fact whose enriched row changes in a batch, its old enriched row (the truth of what was
counted before) contributes with sign -1 and its new row with sign +1. The deltas are grouped
by the aggregate's groups and merged: ``count`` and each sum add up; a group whose ``count``
reaches 0 is deleted. Null group values (unknown members) are a group of their own until the
fact is restated. Groups are matched on ``_group_key`` (the group values as JSON), so null group
values match null-safely.

Numbers (tester, 2026-11-27): an integer sum is added up exactly in each batch and checked
against its column's range before anything is written (:func:`check_ranges`: the stored value
plus the batch's delta), so a ``bigint`` sum that would pass 2^63-1 stops the run (exit 3,
:class:`AggregateOverflow` naming aggregate, column, group and values) instead of wrapping round
to a negative number in the MERGE; a NaN or ±Infinity contribution to a floating-point sum
counts as 0, since a signed delta could never withdraw it (NaN - NaN is NaN: the group kept NaN
for good after the fact changed).

Example::

    deltas = aggregate_deltas(old_rows, new_rows, agg_cfg, event_time="order_time")
    engine.merge(agg_cfg.path, deltas, merge_spec(agg_cfg, deltas), txn=txn)
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_lake.checkpoint_log import PipelineStateError
from cdc_lake.engines import Computed, Engine, MergeSpec
from cdc_lake.enrich.config import AggregateConfig, EnrichConfig

COUNT = "count"
GROUP_KEY = "_group_key"
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_BIGINT_MAX = 2**63 - 1
_TAG = "cdc_lake.aggregate_overflow"


class AggregateOverflow(PipelineStateError):
    """An aggregate sum would leave its column's type (exit 3): nothing of the batch was
    written; the recovery widens the sum and rebuilds."""

    def __init__(self, cfg: EnrichConfig, aggregate: str, column: str, detail: str,
                 scale: int = 0, decimal: bool = False) -> None:
        expr = dict(next(a for a in cfg.outputs.aggregates if a.name == aggregate).sums)[column]
        if decimal and scale == 0:
            widen = (f"no decimal holds more than 38 digits: sum CAST({expr} AS DOUBLE) (about 16 "
                     "significant digits, not exact)")
        elif scale > 0:  # a decimal sum: no wider decimal exists; a cast to fewer decimals rounds
            # (the advice DECIMAL(38,0) summed whole numbers, exit 0: tester)
            widen = (f"a decimal sum keeps at most {38 - scale} integer digits with its "
                     f"{scale} decimals and Spark has no wider decimal: keep fewer decimals, "
                     f"e.g. sums: {{{column}: \"CAST({expr} AS DECIMAL(38,{max(scale // 2, 0)}))\"}} "
                     f"(each value is ROUNDED to that many decimals before it is summed; "
                     f"DECIMAL(38,0) sums whole numbers), or CAST({expr} AS DOUBLE) (about 16 "
                     "significant digits, not exact)")
        else:
            widen = (f"sum a wider type, e.g. sums: {{{column}: \"CAST({expr} AS DECIMAL(38,0))\"}} "
                     "(exact for integers)")
        super().__init__(
            f"pipeline {cfg.name!r}: outputs.aggregates.{aggregate}.sums.{column} "
            f"({expr!r}) {detail}; nothing of this batch was written. Recovery: {widen}, then "
            f"spark-submit spark_jobs/enrich.py --pipeline {cfg.file} --reprocess (a changed "
            "aggregate is rebuilt)")


class ExpressionOverflow(PipelineStateError):
    """Spark's arithmetic overflowed in the batch outside the sums' totals, most likely in a
    sums expression evaluated per fact (``qty * 2`` beyond bigint): the same data stops every
    retry the same way (exit 3, not Spark's exit 1, retried for ever: tester)."""

    def __init__(self, cfg: EnrichConfig, spark_message: str) -> None:
        exprs = "; ".join(f"{a.name}.{n} = {e!r}" for a in cfg.outputs.aggregates for n, e in a.sums)
        super().__init__(
            f"pipeline {cfg.name!r}: Spark's arithmetic overflowed while computing a batch "
            f"({spark_message}); nothing of this batch was written, and every retry stops the "
            f"same way. The sums expressions of outputs.aggregates: {exprs or 'none'}. Recovery: "
            "make the expression that overflows compute in a wider type (e.g. "
            "\"CAST(qty AS DECIMAL(38,0)) * 2\" instead of \"qty * 2\"), then spark-submit "
            f"spark_jobs/enrich.py --pipeline {cfg.file} --reprocess (a changed aggregate is "
            "rebuilt)")


def overflow_in(cfg: EnrichConfig, error: BaseException) -> PipelineStateError | None:
    """The overflow a batch's Spark job raised for a sum (tagged by :func:`aggregate_deltas`),
    found in the error's text; any other arithmetic overflow of Spark as an
    :class:`ExpressionOverflow`; else None."""
    m = re.search(r"\[" + re.escape(_TAG) + r" (\{.*?\})\]", str(error))
    if m is None:
        spark = re.search(r"\[ARITHMETIC_OVERFLOW\][^\n]*", str(error))
        if spark is None:
            return None
        text = re.sub(r"\s*If necessary set .*$|\s*SQLSTATE.*$", "", spark.group(0))[:300]
        return ExpressionOverflow(cfg, text)
    info = json.loads(m.group(1))
    where = re.search(re.escape(m.group(0)) + r" group (.*?) batch total (.*?) \.", str(error))
    detail = f"adds up to more than {'its ' + info['type'] if 'type' in info else 'a bigint'} " \
             "holds within one batch" + ("" if where is None else f" (batch total "
                                         f"{where.group(2)}) in group {where.group(1)}")
    return AggregateOverflow(cfg, info["aggregate"], info["column"], detail + (
        " (a batch stops at the first sum found too large: check the other sums of "
        "the pipeline's aggregates before the --reprocess)"), scale=int(info.get("scale", 0)),
        decimal="type" in info)


def _bucket(agg: AggregateConfig, event_time: str | None) -> list[Column]:
    if agg.time_bucket == "none":
        return []
    et = F.col(f"`{event_time}`")
    if agg.time_bucket == "day":
        return [F.to_date(et).alias("day")]
    return [F.date_trunc("hour", et).alias("hour")]


def _sum_types(rows: DataFrame, agg: AggregateConfig) -> dict[str, T.DataType]:
    """The type of each sum expression over ``rows`` (analysis only, no Spark job)."""
    return {f.name: f.dataType for f in rows.select(
        *[F.expr(expr).alias(name) for name, expr in agg.sums]).schema.fields}


def _contributions(rows: DataFrame, agg: AggregateConfig, event_time: str | None,
                   negative: bool, kinds: dict[str, T.DataType]) -> DataFrame:
    def signed(c: Column) -> Column:
        return -c if negative else c

    cols = [F.col(f"`{g}`") for g in agg.group_by] + _bucket(agg, event_time)
    for name, expr in agg.sums:
        value = F.expr(expr)
        if isinstance(kinds[name], (T.FloatType, T.DoubleType)):
            value = F.when(F.isnan(value) | (F.abs(value) == float("inf")), None).otherwise(value)
        if isinstance(kinds[name], _INTEGRAL):  # summed exactly, checked against bigint
            value = value.cast("decimal(38,0)")
        cols.append(signed(F.coalesce(value, F.lit(0))).alias(name))
    cols.append(F.lit(-1 if negative else 1).cast("bigint").alias(COUNT))
    return rows.select(*cols)


def check_columns(rows: DataFrame, agg: AggregateConfig, yaml_file: str) -> None:
    missing = [g for g in agg.group_by if g not in rows.columns]
    if missing:
        raise ValueError(f"{yaml_file}: outputs.aggregates.{agg.name}.group_by: {missing} are not "
                         f"columns of the enriched table ({sorted(rows.columns)})")


def aggregate_deltas(old: DataFrame | None, new: DataFrame, agg: AggregateConfig,
                     event_time: str | None) -> DataFrame:
    """Per group: summed signed contributions; all-zero groups dropped."""
    new_kinds = _sum_types(new, agg)
    parts = _contributions(new, agg, event_time, False, new_kinds)
    kinds = dict(new_kinds)
    if old is not None:
        old_kinds = _sum_types(old, agg)
        parts = parts.unionByName(_contributions(old, agg, event_time, True, old_kinds))
        # an integer sum only if both sides are (old rows of a wider type: summed as they are)
        kinds.update({n: t for n, t in old_kinds.items() if not isinstance(t, _INTEGRAL)})
    groups = list(agg.group_columns)
    sums = [name for name, _ in agg.sums]
    out = parts.groupBy(*[F.col(f"`{g}`") for g in groups]).agg(
        *[_sum(agg, s, kinds[s], groups) for s in sums], F.sum(COUNT).alias(COUNT))
    nonzero = F.col(COUNT) != 0
    for s in sums:
        nonzero = nonzero | (F.col(f"`{s}`") != 0)
    key = _group_key(out, groups)
    return out.where(nonzero).select(key.alias(GROUP_KEY), *[F.col(f"`{c}`") for c in groups + sums],
                                     F.col(COUNT).cast("bigint").alias(COUNT))


def _sum(agg: AggregateConfig, name: str, kind: T.DataType, groups: list[str]) -> Column:
    """The batch's delta of one sum; an integer sum as bigint, its exact decimal total checked;
    a decimal sum checked against the type Spark sums it in (a tagged error names aggregate,
    column, group and total instead of Spark's bare ARITHMETIC_OVERFLOW, exit 1)."""
    value = F.col(f"`{name}`")
    group = F.to_json(F.struct(*[F.col(f"`{g}`") for g in groups])) if groups else F.lit("{}")

    def tagged(total_text: Column, **extra: Any) -> Column:
        tag = json.dumps({"aggregate": agg.name, "column": name, **extra})
        return F.raise_error(F.concat(F.lit(f"[{_TAG} {tag}] group "), group,
                                      F.lit(" batch total "), total_text, F.lit(" .")))

    if isinstance(kind, T.DecimalType):  # Spark sums decimal(p,s) as decimal(min(38,p+10),s)
        total = F.try_sum(value)  # null when the total leaves that type (second tester)
        sum_type = f"decimal({min(38, kind.precision + 10)},{kind.scale})"
        return F.when(total.isNotNull() | (F.count(value) == 0), total).otherwise(
            tagged(F.lit("beyond it"), type=sum_type, scale=kind.scale).cast(kind)).alias(name)
    total = F.sum(value)
    if not isinstance(kind, _INTEGRAL):
        return total.alias(name)
    fits = F.abs(total) <= F.lit(_BIGINT_MAX).cast("decimal(38,0)")
    return F.when(fits | total.isNull(), total.cast("bigint")).otherwise(
        tagged(total.cast("string")).cast("bigint")).alias(name)


def check_ranges(engine: Engine, cfg: EnrichConfig, sources: dict[str, Any]) -> None:
    """Before any write of a batch: every integer or decimal sum of every aggregate, stored
    value plus this batch's delta, must fit its column (the engines' MERGE arithmetic wraps a
    bigint round silently: delta-rs 1.6 gave -8446744073709551615 for 5e18+1 + 5e18)."""
    import pyarrow as pa

    for agg in cfg.outputs.aggregates:
        source = sources.get(f"aggregate:{agg.name}")
        if source is None or engine.known_empty(source):
            continue
        names = [n for n, _ in agg.sums]
        table = source.data if isinstance(source, Computed) else \
            source.select(GROUP_KEY, *[f"`{n}`" for n in names]).toArrow()
        checked = [n for n in names if _limit(table.schema.field(n).type) is not None]
        if not checked or table.num_rows == 0:
            continue
        bound = _stored_bound(agg.path, checked)
        checked = [n for n in checked if not _fits(table, n, bound.get(n))]
        if not checked:
            continue  # the files' statistics prove every total fits: no lookup
        keys = table.column(GROUP_KEY).to_pylist()
        stored = engine.read_arrow(str(agg.path), [GROUP_KEY, *checked], where_in=(GROUP_KEY, keys))
        before = {r[GROUP_KEY]: r for r in (stored.to_pylist() if stored is not None else [])}
        types = {n: (stored if stored is not None else table).schema.field(n).type for n in checked}
        limits = {n: _limit(types[n]) or _limit(table.schema.field(n).type) for n in checked}
        for row in table.select([GROUP_KEY, *checked]).to_pylist():
            for n in checked:
                old = (before.get(row[GROUP_KEY]) or {}).get(n) or 0
                new = Decimal(old) + Decimal(row[n] or 0)
                if abs(new) > limits[n]:
                    raise AggregateOverflow(
                        cfg, agg.name, n, f"would reach {new} in group {row[GROUP_KEY]} (stored "
                        f"{old}, this batch {row[n]:+}), beyond its column type {types[n]}",
                        scale=int(getattr(types[n], "scale", 0) or 0),
                        decimal=pa.types.is_decimal(types[n]))


def _stored_bound(path: Any, names: list[str]) -> dict[str, int]:
    """Largest absolute stored value per integer column, from the Delta log's file statistics
    (exact for integer columns; delta-rs's decimal statistics are not relied on); a column
    without statistics is left out."""
    import pyarrow as pa
    from deltalake import DeltaTable

    try:
        actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    except Exception:  # noqa: BLE001 - no table yet / unreadable: look the groups up
        return {}
    out: dict[str, int] = {}
    for n in names:
        lo, hi = f"min.{n}", f"max.{n}"
        if lo not in actions.column_names or not pa.types.is_integer(actions.schema.field(lo).type):
            continue
        values = actions.column(lo).to_pylist() + actions.column(hi).to_pylist()
        if actions.num_rows and all(v is not None for v in values):
            out[n] = max(abs(v) for v in values)
    return out


def _fits(table: Any, name: str, bound: int | None) -> bool:
    """Whether every stored value (|v| <= bound) plus any delta of the batch fits the column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = table.schema.field(name).type
    if bound is None or not pa.types.is_integer(t):
        return False
    mm = pc.min_max(table.column(name)).as_py()
    if mm["min"] is None:
        return True
    return bound + max(abs(mm["min"]), abs(mm["max"])) <= _limit(t)


def _limit(t: Any) -> Decimal | None:
    import pyarrow as pa

    if pa.types.is_integer(t):
        return Decimal(2 ** (t.bit_width - 1) - 1)
    if pa.types.is_decimal(t):
        return Decimal(10) ** (t.precision - t.scale) - Decimal(1).scaleb(-t.scale)
    return None


def _group_key(out: DataFrame, groups: list[str]) -> Column:
    """The group values as JSON (null-safe MERGE key). ``to_json`` writes timestamps to the
    millisecond, so two groups 10:00:00.000100 and .000200 got one key (two aggregate rows
    under it, then every MERGE failed on a multiply matched row; tester): a group holding a
    timestamp with sub-millisecond digits renders it with microseconds; keys of whole
    milliseconds stay as they were (tables written before keep matching)."""
    if not groups:
        return F.lit("{}")
    base = F.to_json(F.struct(*[F.col(f"`{g}`") for g in groups]))
    kinds = {f.name: f.dataType.simpleString() for f in out.schema.fields}
    stamps = [g for g in groups if kinds.get(g) in ("timestamp", "timestamp_ntz")]
    if not stamps:
        return base
    fine = None
    for g in stamps:
        sub_ms = F.coalesce(F.unix_micros(F.col(f"`{g}`").cast("timestamp")) % 1000 != 0, F.lit(False))
        fine = sub_ms if fine is None else fine | sub_ms
    pattern = {"timestamp": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX", "timestamp_ntz": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"}
    micro = F.to_json(F.struct(*[F.date_format(F.col(f"`{g}`"), pattern[kinds[g]]).alias(g) if g in stamps
                                 else F.col(f"`{g}`") for g in groups]))
    return F.when(fine, micro).otherwise(base)


def merge_spec(agg: AggregateConfig, target_types: dict[str, str]) -> MergeSpec:
    """Add counts and sums; delete a group whose count reaches 0; insert new positive groups."""
    updates = {COUNT: f"t.`{COUNT}` + s.`{COUNT}`"}
    for name, _ in agg.sums:
        expr = f"coalesce(t.`{name}`, 0) + coalesce(s.`{name}`, 0)"
        t = target_types.get(name)
        updates[name] = f"CAST({expr} AS {t})" if t else expr
    return (MergeSpec(on=(GROUP_KEY,))
            .when_matched_delete(f"t.`{COUNT}` + s.`{COUNT}` = 0")
            .when_matched_update(updates)
            .when_not_matched_insert_all(f"s.`{COUNT}` > 0"))
