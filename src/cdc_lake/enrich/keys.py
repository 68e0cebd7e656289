"""Declared keys checked at run time: a micro-batch stops, before any write, when a key is not
unique — the way Delta's MERGE refuses several source rows matching one target row.

* **Fact** (``fact.keys``): two kept changes of one key in the same commit (events: the same
  batch), found by :mod:`cdc_lake.enrich.normalize` (``_tie``) in the window pass it already
  makes and counted by the batch's first aggregate; :func:`fact_violation` builds the error.
* **Dimensions**: every candidate fact of a batch (new versions, parked facts, restatement
  candidates) is unique per fact key and the dimension joins are left joins, so a fact appears
  twice in a MERGE source (enriched, pending) exactly when it matched two rows of a dimension
  (an SCD1 table with two rows for one key; two SCD2 versions of one key whose intervals both
  hold the event time). :func:`duplicated_merge_keys` checks the computed sources before any
  write — on the driver's Arrow tables (delta-rs: no Spark job), else one Spark aggregate per
  source — and :func:`dimension_violation` (error path only) replays the joins for the
  duplicated facts to name the dimension, its version, the key values and how many rows share
  them.

Only what a batch joins is checked: a duplicate no fact of the batch matches is found when a
fact first does. Both raise :class:`UpstreamKeyViolation` (CLI exit 3, not retried).

Example::

    sources = engine.compute(frames)
    if duplicated_merge_keys(sources, ("enriched", "pending"), cfg.fact.keys):
        raise dimension_violation(cfg, cands, fated, frames, batch_id)
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_lake.checkpoint_log import PipelineStateError
from cdc_lake.engines.base import Computed, Source, arrow_frame
from cdc_lake.enrich.config import DimensionConfig, EnrichConfig
from cdc_lake.enrich.joins import DimensionFrame, join_condition, join_dimensions, members
from cdc_lake.enrich.normalize import cols
from cdc_lake.enrich.state import recovery_command

SHOWN = 5  # offending key values named in a message


class UpstreamKeyViolation(PipelineStateError):
    """A fact or dimension table holds two rows for one declared key; nothing of the batch was
    written and the checkpoint did not advance. Exit 3: an operator fixes the upstream table
    (or the declared keys), then runs the job again."""


def duplicated_merge_keys(sources: dict[str, Source], tables: tuple[str, ...],
                          keys: tuple[str, ...]) -> str | None:
    """The first of ``tables`` whose write source holds one ``keys`` value twice, else None.

    A MERGE source must be unique on its merge keys (Delta refuses several source rows matching
    one target row; an insert would store both). Computed (Arrow) sources are checked on the
    driver; a Spark DataFrame source (delta-spark) costs one aggregate."""
    k = list(keys)
    for table in tables:
        src = sources.get(table)
        if src is None:
            continue
        if isinstance(src, Computed):
            if src.data.num_rows < 2:
                continue
            try:
                counts = src.data.group_by(k).aggregate([([], "count_all")])["count_all"]
                if pc.max(counts).as_py() > 1:
                    return table
                continue
            except (pa.ArrowNotImplementedError, pa.ArrowTypeError):  # a key type Arrow can't group
                df: DataFrame = arrow_frame_of(src)
        else:
            df = src
        if df.groupBy(*[F.col(f"`{c}`") for c in k]).count().where("count > 1").limit(1).count():
            return table
    return None


def _show(v: Any) -> str:
    return "null" if v is None else str(v)


def _stopped(batch_id: int) -> str:
    return (f"Micro-batch {batch_id} stopped before writing anything; the checkpoint has not "
            f"advanced, so nothing is lost.")


def arrow_frame_of(src: Computed) -> DataFrame:
    """A computed source back as a Spark DataFrame (the active session)."""
    spark = SparkSession.getActiveSession()
    assert spark is not None
    return arrow_frame(spark, src.data, src.schema)


# -- fact ----------------------------------------------------------------------------------
def fact_violation(cfg: EnrichConfig, rows: DataFrame, norm: DataFrame, batch_id: int,
                   ties: int) -> UpstreamKeyViolation:
    """The error for ``ties`` fact keys with twin changes (``rows``: :func:`normalize.fact_rows`,
    ``norm``: :func:`normalize.latest_per_key`). Runs one Spark job (error path only)."""
    k = list(cfg.fact.keys)
    twins = norm.where("_tie").select(*cols(k), "_fact_version")
    found = (rows.where(~F.col("_is_delete")).join(twins, [*k, "_fact_version"], "left_semi")
             .groupBy(*cols(k), "_fact_version").agg(F.count("*").alias("n"))
             .orderBy(F.col("n").desc(), *k).limit(SHOWN).collect())
    feed = cfg.fact.kind == "change_feed"
    at = "Delta version" if feed else "micro-batch"
    shown = "; ".join(", ".join(f"{c}={_show(r[c])}" for c in k)
                      + f" at {at} {r['_fact_version']}: {r['n']} rows" for r in found)
    more = f" (and {ties - len(found)} more)" if ties > len(found) else ""
    where = f"table {cfg.fact.change_feed}" if feed else f"events folder {cfg.fact.label}"
    if feed:
        fix = (f"Declare the fact's real key in fact.keys of {cfg.file}, or remove the duplicate "
               f"rows from the upstream table; the change feed still holds the commit with both "
               f"rows, so then rebuild: {recovery_command(cfg)}")
    else:
        fix = (f"Declare the events' real key in fact.keys of {cfg.file} (default: the event id), "
               f"then rebuild: {recovery_command(cfg)}")
    return UpstreamKeyViolation(
        f"{cfg.file}: fact {where}: fact.keys {k} is not unique — {ties} key(s) have more than one "
        f"inserted/updated row in the same {'commit' if feed else 'micro-batch'}: {shown}{more}. "
        f"Keeping one of them would lose the others silently. {_stopped(batch_id)} {fix}")


# -- dimensions ----------------------------------------------------------------------------
def dimension_violation(cfg: EnrichConfig, cands: DataFrame, fated: DataFrame,
                        frames: dict[str, DimensionFrame], batch_id: int) -> UpstreamKeyViolation:
    """The error when the joined rows outnumber the candidates: per dimension (in YAML order)
    the key values (SCD2: and event times) that matched more than one row. Error path only."""
    k = list(cfg.fact.keys)
    dup = fated.groupBy(*cols(k)).agg(F.count("*").alias("__n")).where("__n > 1")
    n_facts = dup.count()
    sub = cands.join(dup.select(*cols(k)).limit(200), k, "left_semi")
    parts = []
    for i, d in enumerate(cfg.dimensions):
        frame = frames[d.name]
        if frame.df is None:
            continue
        found = _duplicates(sub, cfg, i, d, frame, frames)
        if found:
            parts.append(_describe(cfg, d, frame.version, found))
    if not parts:  # not a dimension: the stored pending/enriched rows repeat a fact key
        parts.append(f"no dimension key matched two rows; the job's own pending table "
                     f"({cfg.outputs.pending}) or enriched table ({cfg.outputs.enriched}) holds "
                     f"a fact key twice. Recovery: {recovery_command(cfg)}")
    return UpstreamKeyViolation(
        f"{cfg.file}: {n_facts} fact(s) of micro-batch {batch_id} joined more than one row of a "
        f"dimension: " + " ".join(parts) + f" {_stopped(batch_id)}")


def _duplicates(sub: DataFrame, cfg: EnrichConfig, i: int, d: DimensionConfig,
                frame: DimensionFrame, frames: dict[str, DimensionFrame]) -> list[Any]:
    prefix = join_dimensions(sub, cfg.dimensions[:i], frames, cfg.event_time)
    cols = [fc for fc, _ in d.on] + ([cfg.event_time] if d.scd == 2 and cfg.event_time else [])
    base = prefix.select(*[F.col(f"`{c}`") for c in cols]).distinct()
    m = members(frame, i)
    aggs = [F.count("*").alias("__n")]
    if d.scd == 2:  # (times as strings: shown in the session time zone, like the tables)
        aggs.append(F.sort_array(F.collect_list(F.struct(
            m[f"__d{i}_vf"].cast("string").alias("vf"), m[f"__d{i}_vt"].cast("string").alias("vt")
        ))).alias("__versions"))
    return (base.join(m, join_condition(d, m, i, cfg.event_time), "inner")
            .groupBy(*[F.col(f"`{c}`") for c in cols]).agg(*aggs).where("__n > 1")
            .orderBy(F.col("__n").desc()).limit(SHOWN)
            .select(*[F.col(f"`{c}`").cast("string").alias(c) for c in cols], "__n",
                    *(["__versions"] if d.scd == 2 else [])).collect())


def _describe(cfg: EnrichConfig, d: DimensionConfig, version: int | None, found: list[Any]) -> str:
    shown = []
    for r in found:
        key = ", ".join(f"{dim_col}={_show(r[fact_col])}" for fact_col, dim_col in d.on)
        if d.scd == 2:
            spans = ", ".join(f"[{_show(v['vf'])} .. {'open' if v['vt'] is None else v['vt']})"
                              for v in r["__versions"])
            shown.append(f"{key} at {cfg.event_time} {_show(r[cfg.event_time])}: "
                         f"{r['__n']} versions valid {spans}")
        else:
            shown.append(f"{key}: {r['__n']} rows")
    what = ("versions of one key whose validity intervals overlap" if d.scd == 2
            else "more than one row for one key")
    fix = ("so that the versions of each key do not overlap (one version valid at any time)"
           if d.scd == 2 else "so that each key has one row")
    return (f"dimension {d.name!r} (table {d.table}, Delta version {version}, "
            f"dimensions.{d.name}.keys {list(d.keys)}, scd {d.scd}) has {what}: "
            + "; ".join(shown) + ". Each fact joined to such a key would be written once per "
            f"matching row (enriched rows duplicated, aggregates counting it twice). Fix the "
            f"upstream table {fix}, or correct dimensions.{d.name}.keys / on in {cfg.file} if "
            f"they are not the table's real key; then run the job again (no --reprocess needed: "
            f"the batch is planned again with the dimension's new version).")
