"""Incremental aggregates from signed deltas: new contribution minus old, MERGEd; never recomputed.

For each fact whose enriched row changes in a batch, its old enriched row (the truth of what was
counted before) contributes with sign -1 and its new row with sign +1. The deltas are grouped
by the aggregate's groups and merged: ``count`` and each sum add up; a group whose ``count``
reaches 0 is deleted. Null group values (unknown members) are a group of their own until the
fact is restated. Groups are matched on ``_group_key`` (the group values as JSON), so null group
values match null-safely.

Example::

    deltas = aggregate_deltas(old_rows, new_rows, agg_cfg, event_time="order_time")
    engine.merge(agg_cfg.path, deltas, merge_spec(agg_cfg, deltas), txn=txn)
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_lake.engines import MergeSpec
from cdc_lake.enrich.config import AggregateConfig

COUNT = "count"
GROUP_KEY = "_group_key"


def _bucket(agg: AggregateConfig, event_time: str | None) -> list[Column]:
    if agg.time_bucket == "none":
        return []
    et = F.col(f"`{event_time}`")
    if agg.time_bucket == "day":
        return [F.to_date(et).alias("day")]
    return [F.date_trunc("hour", et).alias("hour")]


def _contributions(rows: DataFrame, agg: AggregateConfig, event_time: str | None,
                   negative: bool) -> DataFrame:
    def signed(c: Column) -> Column:
        return -c if negative else c

    cols = [F.col(f"`{g}`") for g in agg.group_by] + _bucket(agg, event_time)
    cols += [signed(F.coalesce(F.expr(expr), F.lit(0))).alias(name) for name, expr in agg.sums]
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
    parts = _contributions(new, agg, event_time, negative=False)
    if old is not None:
        parts = parts.unionByName(_contributions(old, agg, event_time, negative=True))
    groups = list(agg.group_columns)
    sums = [name for name, _ in agg.sums]
    out = parts.groupBy(*[F.col(f"`{g}`") for g in groups]).agg(
        *[F.sum(F.col(f"`{s}`")).alias(s) for s in sums], F.sum(COUNT).alias(COUNT))
    nonzero = F.col(COUNT) != 0
    for s in sums:
        nonzero = nonzero | (F.col(f"`{s}`") != 0)
    key = _group_key(out, groups)
    return out.where(nonzero).select(key.alias(GROUP_KEY), *[F.col(f"`{c}`") for c in groups + sums],
                                     F.col(COUNT).cast("bigint").alias(COUNT))


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
