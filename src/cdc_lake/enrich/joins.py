"""Dimension joins in YAML order: SCD1 current row by key, SCD2 as of the event time.

All Spark SQL (no Python UDFs). The result keeps every fact row and adds each dimension's output
columns plus ``_missing`` (array<string>): the dimensions whose member was not found — no row
for the key, the event time before the member's first version (or in a deleted interval), or the
join column / event time null because an earlier dimension was missing.

Example::

    dims = {"orders": DimensionFrame(cfg_orders, orders_df, version=7)}
    joined = join_dimensions(facts, cfg.dimensions, dims, event_time="order_time")
    joined.where("size(_missing) = 0")   # fully enriched rows
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_lake.enrich.config import DimensionConfig

SCD2_COLUMNS = ("_valid_from", "_valid_to", "_is_current")


class DimensionSchemaError(RuntimeError):
    """A configured dimension column is not in the dimension table (any more)."""


@dataclass(frozen=True)
class DimensionFrame:
    """One dimension as read for this batch: its table snapshot and the Delta version used."""

    config: DimensionConfig
    df: DataFrame | None  # None: the table does not exist (yet) -> every member is missing
    version: int | None


def check_dimension(dim: DimensionFrame, yaml_file: str) -> None:
    """Fail naming table and column when a configured column is gone from the dimension."""
    if dim.df is None:
        return
    have = set(dim.df.columns)
    c = dim.config
    wanted = [("keys", k) for k in c.keys] + [(f"columns.{o}", s) for o, s in c.columns]
    if c.scd == 2:
        wanted += [("scd", s) for s in ("_valid_from", "_valid_to")]
    for key, col in wanted:
        if col not in have:
            raise DimensionSchemaError(
                f"dimension {c.name!r}: column {col!r} is not in table {c.table} "
                f"(version {dim.version}; it has {sorted(have)}). Fix {yaml_file}: "
                f"dimensions.{c.name}.{key}, or restore the column upstream.")


def members(dim: DimensionFrame, i: int) -> DataFrame:
    """The dimension's usable rows, renamed to collision-free helper names."""
    c = dim.config
    df = dim.df
    assert df is not None
    if "_cdc_op" in df.columns:  # SCD2: a delete is a version row that is not a member
        df = df.where(F.col("_cdc_op").isNull() | (F.col("_cdc_op") != "delete"))
    cols = [F.col(f"`{k}`").alias(f"__d{i}_k_{j}") for j, k in enumerate(c.keys)]
    cols += [F.col(f"`{src}`").alias(out) for out, src in c.columns]
    cols.append(F.lit(True).alias(f"__d{i}_hit"))
    if c.scd == 2:
        cols += [F.col("_valid_from").alias(f"__d{i}_vf"), F.col("_valid_to").alias(f"__d{i}_vt")]
    return df.select(*cols)


def join_condition(c: DimensionConfig, m: DataFrame, i: int, event_time: str | None) -> Column:
    """Fact row <-> member row of dimension ``i`` (``m`` from :func:`members`): every ``on``
    column equal to its key; SCD2 also ``_valid_from <= event_time < _valid_to``."""
    key_index = {k: j for j, k in enumerate(c.keys)}
    cond = None
    for fact_col, dim_col in c.on:
        part = F.col(f"`{fact_col}`") == m[f"__d{i}_k_{key_index[dim_col]}"]
        cond = part if cond is None else cond & part
    assert cond is not None
    if c.scd == 2:
        et = F.col(f"`{event_time}`")
        cond = cond & (m[f"__d{i}_vf"] <= et) & (m[f"__d{i}_vt"].isNull() | (et < m[f"__d{i}_vt"]))
    return cond


def join_dimensions(facts: DataFrame, dims_cfg: tuple[DimensionConfig, ...],
                    frames: dict[str, DimensionFrame], event_time: str | None) -> DataFrame:
    """Left-join every dimension in order; add its output columns and ``_missing``."""
    out = facts
    hits: list[Column] = []
    for i, c in enumerate(dims_cfg):
        dim = frames[c.name]
        for fact_col, _ in c.on:
            if fact_col not in out.columns:
                raise DimensionSchemaError(
                    f"dimension {c.name!r}: join column {fact_col!r} (dimensions.{c.name}.on) is "
                    f"neither a fact column nor an output of an earlier dimension; available: "
                    f"{sorted(out.columns)}")
        clash = [o for o in c.outputs if o in out.columns]
        if clash:
            raise DimensionSchemaError(
                f"dimension {c.name!r}: output column(s) {clash} collide with fact columns; "
                f"rename them in dimensions.{c.name}.columns")
        if dim.df is None:
            # No table yet: every member is missing; typed nulls keep the schema stable later.
            out = out.select("*", *[F.lit(None).alias(o) for o in c.outputs])
            hits.append(F.when(F.lit(True), F.lit(c.name)))
            continue
        m = members(dim, i)
        out = out.join(m, join_condition(c, m, i, event_time), "left")
        out = out.drop(*[f"__d{i}_k_{j}" for j in range(len(c.keys))], f"__d{i}_vf", f"__d{i}_vt")
        hits.append(F.when(F.col(f"__d{i}_hit").isNull(), F.lit(c.name)))
    missing = F.filter(F.array(*hits), lambda x: x.isNotNull()) if hits else F.array().cast("array<string>")
    helper = [f"__d{i}_hit" for i in range(len(dims_cfg)) if f"__d{i}_hit" in out.columns]
    return out.withColumn("_missing", missing.cast("array<string>")).drop(*helper)


def output_types(frames: dict[str, DimensionFrame]) -> dict[str, str]:
    """Spark type (simple string) of each dimension output column, from the tables read."""
    types: dict[str, str] = {}
    for dim in frames.values():
        if dim.df is None:
            continue
        fields = {f.name: f.dataType.simpleString() for f in dim.df.schema.fields}
        for out, src in dim.config.columns:
            types[out] = fields[src]
    return types
