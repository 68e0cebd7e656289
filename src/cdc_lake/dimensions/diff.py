"""Snapshot vs. dimension table: what one date's refresh changes, as one MERGE source.

Both SCD kinds compare the snapshot with the table's *current* rows by key, null-safe on every
non-key column of the snapshot:

* SCD1 (:func:`scd1_changes`): new keys are inserted, changed rows updated, keys missing from the
  snapshot deleted. The MERGE source has the table's columns plus ``_snapshot_date`` (the date
  whose snapshot last changed the row); a delete row carries ``_snapshot_date = NULL``.
* SCD2 (:func:`scd2_changes`): new keys get a version row (``_valid_from`` = the snapshot date,
  midnight UTC; ``_valid_to`` NULL; ``_is_current`` true); a changed key's current version is
  closed (``_valid_to`` = the snapshot date, exclusive; ``_is_current`` false) and a new version
  inserted; a key missing from the snapshot has its current version closed. MERGE keys are the
  dimension keys plus ``_valid_from``.

Example::

    changes = scd1_changes(snapshot_df, table_df_or_None, keys=("product_id",), date="2026-01-02")
    changes.counts      # {'inserted': 3, 'updated': 1, 'deleted': 0, 'unchanged': 40}
    engine.merge(path, changes.source, changes.spec, txn=Txn("dimension-x", 20260102))
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_lake.dimensions.config import SCD1_META, SCD2_META
from cdc_lake.dimensions.types import SnapshotInvalid, check_columns, fits, out_of_range, quote
from cdc_lake.engines import MergeSpec


@dataclass
class Changes:
    source: DataFrame  # rows to MERGE (empty: nothing changed)
    spec: MergeSpec
    counts: dict[str, int]
    cached: DataFrame | None = None

    def release(self) -> None:
        """Drop the cached comparison (call after the MERGE)."""
        if self.cached is not None:
            self.cached.unpersist()


def check_snapshot(snap: DataFrame, keys: tuple[str, ...], where: str) -> int:
    """Key columns present, no NULL key, no duplicate key, no timestamp or date outside years
    1-9999 (one Spark job); returns the row count."""
    missing = [k for k in keys if k not in snap.columns]
    if missing:
        raise SnapshotInvalid(f"{where}: key column(s) {missing} not in the snapshot "
                              f"(columns: {snap.columns}); fix the file or `keys:`")
    key_null = F.lit(False)
    for k in keys:
        key_null = key_null | F.col(quote(k)).isNull()
    ranged = {f.name: out_of_range(F.col(quote(f.name)), f.dataType.simpleString())
              for f in snap.schema.fields}
    ranged = {c: bad for c, bad in ranged.items() if bad is not None}
    row = snap.agg(F.count(F.lit(1)).alias("n"),
                   F.sum(F.when(key_null, 1).otherwise(0)).alias("null_keys"),
                   F.count_distinct(F.struct(*[quote(k) for k in keys])).alias("distinct"),
                   *[F.count_if(bad).alias(f"r{i}") for i, bad in enumerate(ranged.values())]
                   ).first()
    n, null_keys, distinct = int(row["n"]), int(row["null_keys"] or 0), int(row["distinct"])
    far = {c: int(row[f"r{i}"] or 0) for i, c in enumerate(ranged)}
    far = {c: k for c, k in far.items() if k}
    if far:  # Parquet, or CSV types inferred by Spark (declared ones are checked by conform)
        ex = {c: [r[0] for r in snap.where(ranged[c]).select(F.col(quote(c)).cast("string"))
                  .limit(3).collect()] for c in far}
        raise SnapshotInvalid(f"{where}: " + "; ".join(
            f"column {c!r}: {k} value(s) outside years 1-9999 (UTC), e.g. {ex[c]}"
            for c, k in far.items()) + ". No reader of the table could load them back, so "
            "nothing was written. Fix the export (or declare the column as string in `schema:`)")
    if null_keys:
        raise SnapshotInvalid(f"{where}: {null_keys} row(s) with a NULL key {list(keys)}; "
                              "a snapshot row needs its key")
    if distinct != n - null_keys:
        dup = (snap.groupBy(*[quote(k) for k in keys]).count().where("count > 1").limit(3).collect())
        raise SnapshotInvalid(f"{where}: duplicate keys {list(keys)}, e.g. "
                              f"{[tuple(r[k] for k in keys) for r in dup]}; a full snapshot has one "
                              "row per key")
    return n


def _align(snap: DataFrame, table: DataFrame | None, keys: tuple[str, ...],
           meta: tuple[str, ...], where: str) -> DataFrame:
    """Cast snapshot columns to the table's types where that is lossless by type; refuse a
    snapshot that lacks a table column, or whose column types need a value check or a widening
    first (:func:`cdc_lake.dimensions.types.plan_types` does both before the diff is built)."""
    if table is None:
        return snap
    check_columns(snap, table.schema, meta, where)
    types = {f.name: f.dataType for f in table.schema.fields}
    have = {f.name: f.dataType.simpleString() for f in snap.schema.fields}
    unplanned = {c: (have[c], types[c].simpleString()) for c in snap.columns
                 if c in types and not fits(have[c], types[c].simpleString())}
    if unplanned:
        raise SnapshotInvalid(f"{where}: column types {unplanned} (snapshot, table) would be cast "
                              "with possible loss; run plan_types first (it widens or checks)")
    return snap.select(*[F.col(quote(c)).cast(types[c]).alias(c) if c in types else F.col(quote(c))
                         for c in snap.columns])


def _changed(attrs: list[str], table_cols: set[str]) -> Column:
    cond = F.lit(False)
    for c in attrs:
        t = F.col("t." + quote(c)) if c in table_cols else F.lit(None)
        cond = cond | ~F.col("s." + quote(c)).eqNullSafe(t)
    return cond


def _classify(snap: DataFrame, cur: DataFrame | None, keys: tuple[str, ...],
              meta: tuple[str, ...]) -> tuple[DataFrame, list[str]]:
    """Full outer join by key with ``_op`` in insert/update/delete/same; snapshot columns
    prefixed ``s.``, table columns ``t.`` (as struct fields ``s`` and ``t``)."""
    attrs = [c for c in snap.columns if c not in keys]
    s = snap.select(F.struct(*[quote(c) for c in snap.columns]).alias("s"),
                    *[F.col(quote(k)).alias(f"__k_{k}") for k in keys])
    if cur is None:
        return s.select("s", F.lit("insert").alias("_op")), attrs
    table_cols = {c for c in cur.columns if c not in meta}
    t = cur.select(F.struct(*[quote(c) for c in cur.columns]).alias("t"),
                   *[F.col(quote(k)).alias(f"__j_{k}") for k in keys])
    on = [F.col(quote(f"__k_{k}")).eqNullSafe(F.col(quote(f"__j_{k}"))) for k in keys]
    cond = on[0]
    for c in on[1:]:
        cond = cond & c
    j = s.join(t, cond, "full_outer")
    s_missing, t_missing = F.col("s").isNull(), F.col("t").isNull()
    op = (F.when(t_missing, "insert").when(s_missing, "delete")
          .when(_changed(attrs, table_cols), "update").otherwise("same"))
    return j.select("s", "t", op.alias("_op")), attrs


def _counts(tagged: DataFrame) -> dict[str, int]:
    got = {r["_op"]: int(r["count"]) for r in tagged.groupBy("_op").count().collect()}
    return {k: got.get(k, 0) for k in ("insert", "update", "delete", "same")}


def scd1_changes(snap: DataFrame, table: DataFrame | None, keys: tuple[str, ...],
                 date: str, where: str) -> Changes:
    snap = _align(snap, table, keys, SCD1_META, where)
    tagged, _ = _classify(snap, table, keys, SCD1_META)
    tagged = tagged.persist()
    c = _counts(tagged)
    day = F.to_date(F.lit(date))
    upserts = tagged.where(F.col("_op").isin("insert", "update")).select("s.*", day.alias("_snapshot_date"))
    source = upserts
    if table is not None:
        deletes = tagged.where(F.col("_op") == "delete").select(
            *[F.col("t." + quote(k)).alias(k) for k in keys], F.lit(None).cast("date").alias("_snapshot_date"))
        source = upserts.unionByName(deletes, allowMissingColumns=True)
    spec = (MergeSpec(on=keys).when_matched_delete("s._snapshot_date IS NULL")
            .when_matched_update_all("s._snapshot_date IS NOT NULL")
            .when_not_matched_insert_all("s._snapshot_date IS NOT NULL"))
    return Changes(source, spec, {"inserted": c["insert"], "updated": c["update"],
                                  "deleted": c["delete"], "unchanged": c["same"]}, tagged)


def scd2_changes(snap: DataFrame, table: DataFrame | None, keys: tuple[str, ...],
                 date: str, where: str) -> Changes:
    snap = _align(snap, table, keys, SCD2_META, where)
    cur = table.where(F.col("_is_current")) if table is not None else None
    tagged, _ = _classify(snap, cur, keys, SCD2_META)
    tagged = tagged.persist()
    c = _counts(tagged)
    ts = F.to_timestamp(F.lit(date), "yyyy-MM-dd")
    versions = tagged.where(F.col("_op").isin("insert", "update")).select(
        "s.*", ts.alias("_valid_from"), F.lit(None).cast("timestamp").alias("_valid_to"),
        F.lit(True).alias("_is_current"))
    source = versions
    if cur is not None:
        closes = tagged.where(F.col("_op").isin("update", "delete")).select("t.*") \
            .withColumn("_valid_to", ts).withColumn("_is_current", F.lit(False))
        source = versions.unionByName(closes, allowMissingColumns=True)
    spec = (MergeSpec(on=keys + ("_valid_from",))
            .when_matched_update({"_valid_to": "s._valid_to", "_is_current": "s._is_current"},
                                 "s._is_current = false")
            .when_not_matched_insert_all("s._is_current = true"))
    return Changes(source, spec, {"inserted": c["insert"], "updated": c["update"],
                                  "closed": c["update"] + c["delete"], "deleted": c["delete"],
                                  "unchanged": c["same"]}, tagged)
