"""A micro-batch's fact changes -> the latest change per declared key (``fact.keys``).

:func:`fact_rows` maps the raw batch (change-feed rows or events) to the fact columns plus
``_fact_version`` (commit version; events: the batch id) and ``_is_delete``; an update pre-image
is a delete of its key (the post-image of the same commit outranks it when the key stays; an
UPDATE that changes the key deletes the old one); from an SCD2 table only open versions count
(``_valid_to`` null; ``_cdc_op = 'delete'`` is a delete). :func:`latest_per_key` keeps one row per key — the newest version, an insert or
post-image before a delete of the same version — and marks rows that must not be enriched
(``_bad`` with ``_reason``: a null key, an event at or before the batch's watermark).

It also marks a **key violation** in the same window pass, at no extra Spark action: ``_tie``
is true on a kept row when another row of the same key has the same version and is also not a
delete — two inserts / post-images of one declared key in one commit (or, for events, two
events of one key in one batch). Keeping one of them would lose the other silently, so the
writer stops the batch (:func:`cdc_lake.enrich.keys.fact_violation`). What is *not* a tie:
a pre-image and its post-image, several commits of one key in the batch (the newest wins),
a delete and an insert in one commit (the insert wins), two deletes of one key.

Example::

    rows = fact_rows(cfg, batch_df, batch_id)
    norm = latest_per_key(cfg, rows, batch_id)      # + _reason, _bad, _tie
    norm.where("_tie").count()                       # keys whose kept change has a twin
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from cdc_lake.checkpoint_log import batch_watermark_ms
from cdc_lake.enrich.columns import CORRUPT
from cdc_lake.enrich.config import EnrichConfig, EventSource
from cdc_lake.enrich.joins import SCD2_COLUMNS


def cols(names: list[str]) -> list[Column]:
    """Columns by exact name (``fact.keys`` may hold dots or spaces: a bare string would be read
    as a path into a struct)."""
    return [F.col("`" + n.replace("`", "``") + "`") for n in names]

CF_META = ("_change_type", "_commit_version", "_commit_timestamp")


def is_fact_column(name: str) -> bool:
    """Whether a change-feed column is a fact column (not change-feed metadata, SCD2 version
    columns or ``_cdc_*`` columns of a CDC table): what the job enriches."""
    return name not in CF_META and name not in SCD2_COLUMNS and not name.startswith("_cdc_")


def fact_rows(cfg: EnrichConfig, batch: DataFrame, batch_id: int) -> DataFrame:
    """Fact columns + ``_fact_version`` + ``_is_delete`` (pre-images as deletes of their keys)."""
    if cfg.fact.kind == "change_feed":
        fact_cols = [c for c in batch.columns if is_fact_column(c)]
        # A pre-image is a delete of its key, which its post-image in the same commit outranks
        # when the key stays (latest_per_key keeps the non-delete of a version). An UPDATE that
        # changes a fact's key has a post-image under the new key only: dropping pre-images
        # left the old key's enriched row and its aggregate counts in place for good (tester,
        # 2026-11-29). A pre-image with a null key says nothing about a key: dropped.
        pre = F.col("_change_type") == "update_preimage"
        null_key = F.lit(False)
        for key in cols([c for c in cfg.fact.keys if c in batch.columns]):
            null_key = null_key | key.isNull()
        changes = batch.where(~(pre & null_key))
        is_delete = F.col("_change_type").isin("delete", "update_preimage")
        if "_valid_to" in batch.columns:
            # An SCD2 table (CDC scd: 2, dimension refresh): a fact's state is its open version.
            # A commit that changes a key inserts the new version and closes the old one (a
            # post-image with _valid_to set): the closed one is history, not a second row of
            # the key; a delete is a new open version marked _cdc_op = 'delete'.
            changes = changes.where(F.col("_valid_to").isNull())
            if "_cdc_op" in batch.columns:
                is_delete = is_delete | (F.col("_cdc_op") == "delete")
        rows = changes.select(
            *cols(fact_cols),
            F.col("_commit_version").cast("bigint").alias("_fact_version"),
            is_delete.alias("_is_delete"))
    else:
        rows = batch.select("*", F.lit(batch_id).cast("bigint").alias("_fact_version"),
                            F.lit(False).alias("_is_delete"))
    missing = [c for c in cfg.fact.keys if c not in rows.columns]
    if missing:
        raise ValueError(f"{cfg.file}: fact.keys: {missing} are not columns of the fact "
                         f"source {cfg.fact.label} ({sorted(rows.columns)})")
    return rows


def latest_per_key(cfg: EnrichConfig, rows: DataFrame, batch_id: int,
                   stream_batch: bool = True) -> DataFrame:
    """Latest change per key: fact columns, ``_fact_version``, ``_is_delete``, ``_reason``,
    ``_bad``, ``_tie`` (see the module docstring). ``stream_batch=False``: rows that are no
    micro-batch of the stream (a re-join pass: none), so no watermark of ``batch_id`` applies."""
    k = list(cfg.fact.keys)
    reason = F.lit(None).cast("string")
    ev = cfg.fact.events
    dropped = None
    if ev is not None and stream_batch:
        # An event at or before the batch's watermark is late: dropped, counted and kept in the
        # quarantine table (never lost silently). Spark's dedup drops such a row itself only
        # when it is at or before the watermark of the batch before; the ones after it reach
        # the batch and are checked here, against the watermark Spark recorded for this batch
        # in offsets/<batch_id> (so a replay decides the same way); the ones Spark dropped are
        # read again from the batch's files (fact_source.dropped_late_events).
        wm_ms = batch_watermark_ms(cfg.checkpoint_path, batch_id)
        if wm_ms > 0:
            reason = F.when(F.col(f"`{ev.time}`") <= _ms(wm_ms), _late_reason(ev, wm_ms, False))
        from cdc_lake.enrich.fact_source import dropped_late_events

        found = dropped_late_events(rows.sparkSession, cfg, batch_id)
        if found is not None:
            d, late_wm = found
            dropped = d.select(
                "*", F.lit(batch_id).cast("bigint").alias("_fact_version"),
                F.lit(False).alias("_is_delete"), _late_reason(ev, late_wm, True)
                .alias("_reason"))
    null_key = F.lit(False)
    for c in k:
        null_key = null_key | F.col(f"`{c}`").isNull()
    reason = F.when(null_key, F.lit(f"fact key {k} is null")).otherwise(reason)
    if CORRUPT in rows.columns and ev is not None:  # events: a line not read, a time not taken
        from cdc_lake.enrich.event_values import corrupt_reason

        reason = F.when(F.col(CORRUPT).isNotNull(), corrupt_reason(ev)).otherwise(reason)
    rows = rows.withColumn("_reason", reason)
    # One pass over the batch: the good rows (no reason) are ranked per key, the bad ones in
    # windows of their own and all kept. (A union of a good and a bad branch read the batch
    # twice: an events batch was parsed and deduplicated twice, its state written twice.)
    is_bad = F.col("_reason").isNotNull()
    w = (Window.partitionBy(is_bad, *cols(k))
         .orderBy(F.col("_fact_version").desc(), F.col("_is_delete").asc()))
    # the row after the kept one, in the same window: same version and not a delete = a twin
    tie = ~F.col("_is_delete") & F.coalesce(
        (F.lead("_fact_version").over(w) == F.col("_fact_version"))
        & ~F.lead("_is_delete").over(w), F.lit(False))
    out = (rows.withColumn("_rn", F.row_number().over(w))
           .withColumn("_tie", F.when(is_bad, F.lit(False)).otherwise(tie))
           .where(is_bad | (F.col("_rn") == 1)).drop("_rn")
           .withColumn("_bad", is_bad))
    if dropped is not None:
        late = dropped.withColumn("_tie", F.lit(False)).withColumn("_bad", F.lit(True))
        out = out.unionByName(late.select(*cols(out.columns)))
    return out


def _ms(ms: int) -> Column:
    return F.timestamp_millis(F.lit(ms))


def _late_reason(ev: EventSource, wm_ms: int, dropped_by_spark: bool) -> Column:
    """``late event: <time> <value> (<id> <value>) is at or before <which watermark> <wm> (...)``:
    this batch's watermark, or the one of the batch before, which Spark's deduplication applies
    (a docs tester took the second for the first when both read "seen before this batch")."""
    which, behind = (("the watermark Spark's deduplication applies in this batch",
                      f"the previous batch's watermark: {ev.watermark} behind the newest event "
                      "time of the batches before that one") if dropped_by_spark else
                     ("this batch's watermark",
                      f"{ev.watermark} behind the newest event time of the batches before it"))
    return F.concat(
        F.lit(f"late event: {ev.time} "), F.col(f"`{ev.time}`").cast("string"),
        F.lit(f" ({ev.id} "), F.col(f"`{ev.id}`").cast("string"),
        F.lit(f") is at or before {which} "), _ms(wm_ms).cast("string"), F.lit(f" ({behind})"))
