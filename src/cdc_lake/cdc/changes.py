"""From normalized events of one table to typed change rows, and from those to MERGE sources.

All of it is Spark SQL expressions over the micro-batch (no Python UDFs):

* :func:`typed_changes` decodes every column, splits off rows that must be quarantined
  (missing key, value not castable) and expands primary-key-changing updates into a delete
  of the old key plus an upsert of the new key (Maxwell/Canal carry the old key in ``old``).
* :func:`scd1_source` keeps the latest change per key and drops changes older than the key's
  tombstone; the MERGE (:func:`scd1_spec`) applies only changes newer than the row's
  ``_cdc_seq``, so late or repeated events never win over newer state. An engine that computes
  sources to Arrow (delta-rs) applies the tombstone rule after the Spark job instead, with
  :func:`drop_tombstoned` on the tombstones of the batch's keys only (no Spark read of the whole
  tombstone table: it grows with history, and its scan was ~1.2 s of a small cold run).
* :func:`scd2_rows` rebuilds the version chain of every touched key (existing versions plus the
  new ones) so a late event lands in the middle of history with correct validity ranges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cdc_lake.cdc.column_types import (ColumnType, decode, kind_checked, kind_exact, qcol,
                                       raw_present, source_value)
from cdc_lake.cdc.widening import checked, exact
from cdc_lake.cdc.events import finalize_order
from cdc_lake.engines import MergeSpec

META = ("_cdc_op", "_cdc_seq", "_cdc_commit_ts", "_cdc_run_id")
SCD2_META = ("_valid_from", "_valid_to", "_is_current")


@dataclass(frozen=True)
class TablePlan:
    """How one micro-batch is written to one table: keys and typed columns, in table order."""

    name: str
    keys: tuple[str, ...]
    columns: dict[str, ColumnType]
    scd: int
    widen: dict[str, str] = field(default_factory=dict)  # existing columns to widen first
    # columns whose values in this batch fit their type by kind (widening.proven_exact): no
    # per-value exactness check
    proven_exact: frozenset[str] = frozenset()
    # column -> the names it carries in this batch's events when they are not just the column's
    # own name (a case-only rename at the source: ``Name`` -> ``name``; discovery.plan_table)
    spellings: dict[str, tuple[str, ...]] = field(default_factory=dict)


# how to send a value the check refused, by column type (appended to the quarantine reason)
_HOW = {"timestamp": " (a timestamp is taken with its zone as Z, UTC or a numeric offset such as "
                     "+08:00, or none; a named zone such as PST or America/Los_Angeles is no fixed "
                     "offset)"}


def _a(c: str) -> str:
    return f"__a_{c}"


def _b(c: str) -> str:
    return f"__b_{c}"


def _free(columns: list[str] | tuple[str, ...], base: str) -> str:
    """A helper column name not among ``columns`` (compared case-insensitively, as Spark
    resolves names): a source column may be called ``__rn`` too."""
    taken = {c.lower() for c in columns}
    name = base
    while name.lower() in taken:
        name += "_"
    return name


# A JSON member whose value is a number of more than 38 significant digits: ``"name": 1234...``
# (the name's quotes unescaped, so text inside a JSON string does not match). Spark parses such a
# number as a double (its decimal holds 38 digits): a MariaDB DECIMAL(65,0) value was stored
# rounded (99...9 as 1e65), exit 0 (tester). Group 1: the member's name.
_BIG_NUMBER = r'(?<!\\)"([^"\\]*)"\s*:\s*-?0*(?:\.0*)?[1-9](?:\.?[0-9]){38}'


def _big_numbers(plan: TablePlan, sp: dict[str, tuple[str, ...]], needed: Column) -> list[Column]:
    """Problems for the double columns of ``plan`` whose value in the event's text has more than
    38 significant digits (read as a double, it would be stored rounded); ``needed``: the event
    stores non-key values (not a delete)."""
    doubles = [c for c, ct in plan.columns.items() if ct.sql in ("double", "float")]
    if not doubles:
        return []
    members = F.regexp_extract_all(F.col("_line"), F.lit(_BIG_NUMBER), 1)
    return [F.when(needed & F.arrays_overlap(members, F.array(*[F.lit(n) for n in (sp.get(c) or (c,))])),
                   F.lit(f"table {plan.name} column {c}: a number with more than 38 significant "
                         "digits, which Spark reads as a double and would store rounded; not "
                         "stored (send such values as JSON strings)"))
            for c in doubles]


def typed_changes(events: DataFrame, plan: TablePlan, run_id: str, *,
                  ordinal: bool = True) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Return ``(changes, rejected, cached)`` for one table's events.

    ``changes`` has the table's columns plus :data:`META`; ``rejected`` has ``_file``, ``_line``,
    ``reason``. Both derive from ``cached`` (decoded once, persisted): unpersist it after the
    batch's writes. ``ordinal=False``: no row's ``seq`` holds the per-file ordinal placeholder
    (the survey's ``ordinal_tables`` says so), so :func:`finalize_order` and its window are
    skipped.
    """
    if ordinal:  # formats ordering by line position (Canal, Maxwell without xoffset): fill seq in
        events = finalize_order(events)
    row, old, hints = F.col("row"), F.col("old"), F.col("type_hints")
    sp = {c: plan.spellings.get(c, ()) for c in plan.columns}
    after = {c: decode(row, c, ct, sp[c], hints) for c, ct in plan.columns.items()}
    staged = events.select(
        "_file", "_line", "op", "seq", "commit_ts", "row", "old", "type_hints",
        *[after[c].alias(_a(c)) for c in plan.columns],
    )
    a = {c: qcol(_a(c)) for c in plan.columns}
    # Before-image: the old value where the event carries one, else the row's value. SCD1 needs
    # it only for keys (to delete a moved key); SCD2 also keeps it as the delete version's data.
    before = {c: F.when(source_value(old, c, sp[c]).isNotNull(),
                        decode(old, c, ct, sp[c], hints)).otherwise(a[c])
              if plan.scd == 2 or c in plan.keys else a[c]
              for c, ct in plan.columns.items()}
    key_missing = F.lit(False)
    for k in plan.keys:
        key_missing = key_missing | a[k].isNull()
    # the key columns this row lacks (absent or null), not every key column (tester)
    named = F.lit(f"missing key column(s) {list(plan.keys)}") if len(plan.keys) == 1 else F.concat(
        F.lit("missing key column(s) ["),
        F.concat_ws(", ", *[F.when(a[k].isNull(), F.lit(repr(k))) for k in plan.keys]),
        F.lit(f"] of the key {list(plan.keys)}"))
    problems: list[Column] = [F.when(key_missing, named)]
    # A delete needs only the key: a bad non-key value in its row image does not stop it (the
    # value is not stored; an SCD2 delete version keeps null there).
    needed = F.col("op") != "delete"

    def check_exact(c: str, ct: ColumnType) -> bool:  # never store a truncated/rounded value
        plain = ct.decoder == "plain" or any(d == "plain" for _, d, _ in ct.by_hint)
        return (plain and (checked(ct.sql) or kind_checked(ct.sql))
                and c not in plan.proven_exact)

    def is_exact(raw: Column, decoded: Column, ct: ColumnType, c: str = "") -> Column:
        # numbers: compared as decimals; boolean/date/timestamp: no other value cast into them
        ok = exact(raw, decoded) if checked(ct.sql) else kind_exact(raw, decoded, ct.sql)
        if not ct.by_hint:
            return ok
        # events decoded by a format decoder (epoch numbers, base64 decimals) are exact by
        # their decoder; only the plainly cast ones are checked here
        names = sp.get(c) or (c,)
        own = F.coalesce(*[F.try_element_at(hints, F.lit(n)) for n in names])
        plain = [h for h, d, _ in ct.by_hint if d == "plain"]
        cast_plainly = own.isin(*plain) if plain else F.lit(False)
        if ct.decoder == "plain":
            cast_plainly = cast_plainly | own.isNull() | ~own.isin(*[h for h, _, _ in ct.by_hint])
        return F.when(F.coalesce(cast_plainly, F.lit(True)), ok).otherwise(F.lit(True))

    for c, names in sp.items():
        if len(names) > 1:  # one column for Spark/Delta: an event must not carry two values
            n_present = sum(source_value(row, s).isNotNull().cast("int") for s in names)
            problems.append(F.when(n_present > 1, F.lit(
                f"table {plan.name}: the row carries the columns {list(names)}, which differ only "
                f"in case (one column {c} for Spark and Delta); not stored, so neither value is "
                "lost: keep one spelling at the source")))
    for c, ct in plan.columns.items():
        raw = source_value(row, c, sp[c])
        matters = F.lit(True) if c in plan.keys else needed
        problems.append(F.when(matters & raw_present(row, c, sp[c]) & a[c].isNull(),
                               F.concat(F.lit(f"table {plan.name} column {c}: value "), F.to_json(raw),
                                        F.lit(f" is not a valid {ct.sql}"))))
        if check_exact(c, ct):
            problems.append(F.when(matters & ~is_exact(raw, a[c], ct, c), F.concat(
                F.lit(f"table {plan.name} column {c}: value "), F.to_json(raw),
                F.lit(f" does not fit column type {ct.sql} exactly (would be stored as "),
                a[c].cast("string"), F.lit("); not stored changed" + _HOW.get(ct.sql.strip().lower(), "")))))
    problems += _big_numbers(plan, sp, needed)
    stored = {c: a[c] if c in plan.keys or not check_exact(c, ct)
              else F.when(needed | is_exact(source_value(row, c, sp[c]),
                                            a[c], ct, c), a[c]).alias(_a(c))
              for c, ct in plan.columns.items()}  # a delete's inexact non-key value: null
    staged = staged.select("_file", "_line", "op", "seq", "commit_ts",
                           *[stored[c] for c in plan.columns],
                           *[before[c].alias(_b(c)) for c in plan.columns
                             if plan.scd == 2 or c in plan.keys],
                           F.nullif(F.concat_ws("; ", *problems), F.lit("")).alias("_reason")).persist()
    rejected = staged.where(F.col("_reason").isNotNull()).select("_file", "_line",
                                                                  F.col("_reason").alias("reason"))
    good = staged.where(F.col("_reason").isNull())

    def meta(op: Column, seq_suffix: str) -> list[Column]:
        return [op.alias("_cdc_op"), F.concat(F.col("seq"), F.lit(seq_suffix)).alias("_cdc_seq"),
                F.col("commit_ts").alias("_cdc_commit_ts"), F.lit(run_id).alias("_cdc_run_id")]

    upserts = good.select(*[qcol(_a(c)).alias(c) for c in plan.columns], *meta(F.col("op"), ".1"))
    key_changed = F.col("op") == "update"
    changed_any = F.lit(False)
    for k in plan.keys:
        changed_any = changed_any | ~qcol(_b(k)).eqNullSafe(qcol(_a(k)))
    old_key_deletes = good.where(key_changed & changed_any).select(
        *[qcol(_b(c) if plan.scd == 2 or c in plan.keys else _a(c)).alias(c) for c in plan.columns],
        *meta(F.lit("delete"), ".0"))
    return upserts.unionByName(old_key_deletes), rejected, staged


def latest_per_key(changes: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    w = Window.partitionBy(*[qcol(k) for k in keys]).orderBy(F.col("_cdc_seq").desc())
    rn = _free(changes.columns, "__rn")
    return changes.withColumn(rn, F.row_number().over(w)).where(qcol(rn) == 1).drop(rn)


def scd1_source(changes: DataFrame, keys: tuple[str, ...], tombstones: DataFrame | None) -> DataFrame:
    latest = latest_per_key(changes, keys)
    if tombstones is None:
        return latest
    ts = _free(latest.columns, "__tomb_seq")
    tomb = tombstones.select(*[qcol(k) for k in keys], F.col("_cdc_seq").alias(ts))
    return (latest.join(tomb, list(keys), "left")
            .where(qcol(ts).isNull() | (F.col("_cdc_seq") >= qcol(ts)))
            .drop(ts))


def drop_tombstoned(latest: pa.Table, tombstones: pa.Table | None, keys: tuple[str, ...]) -> pa.Table:
    """The tombstone rule of :func:`scd1_source` on Arrow: drop each row whose key has a
    tombstone with a greater ``_cdc_seq`` (an equal one is the same delete, replayed: kept).

    ``latest`` holds one row per key (:func:`latest_per_key`); ``tombstones`` holds ``keys`` and
    ``_cdc_seq`` of (at least) those keys, e.g. ``engine.read_arrow(tomb_path, [*keys,
    "_cdc_seq"], where_in=(keys[0], latest[keys[0]]))``. Row order is kept. Example::

        source = drop_tombstoned(computed.data, lookup, ("id",))
    """
    if tombstones is None or tombstones.num_rows == 0 or latest.num_rows == 0:
        return latest
    types = {k: latest.schema.field(k).type for k in keys}
    ts, rn = _free(keys, "__tomb_seq"), _free(keys, "__row")
    tomb = pa.table({**{k: tombstones[k].cast(types[k]) for k in keys},
                     ts: tombstones["_cdc_seq"].cast(pa.string())})
    rows = pa.table({**{k: latest[k] for k in keys},
                     rn: pa.array(range(latest.num_rows), pa.int64())})
    hit = rows.join(tomb, keys=list(keys), join_type="inner")
    seq = pc.take(latest["_cdc_seq"].cast(pa.string()), hit[rn])
    older = pc.filter(hit[rn], pc.less(seq, hit[ts]))
    if len(older) == 0:
        return latest
    drop = pc.is_in(pa.array(range(latest.num_rows), pa.int64()), value_set=older.combine_chunks())
    return latest.filter(pc.invert(drop))


def arrow_tombstone_source(scd1_source: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """:func:`tombstone_source` on an SCD1 source computed to Arrow (after
    :func:`drop_tombstoned`): keys and ``_cdc_seq`` of its deletes."""
    return scd1_source.filter(pc.equal(scd1_source["_cdc_op"], "delete")).select([*keys, "_cdc_seq"])


def scd1_spec(keys: tuple[str, ...]) -> MergeSpec:
    return (MergeSpec(on=keys)
            .when_matched_delete("s._cdc_op = 'delete' AND s._cdc_seq > t._cdc_seq")
            .when_matched_update_all("s._cdc_op <> 'delete' AND s._cdc_seq > t._cdc_seq")
            .when_not_matched_insert_all("s._cdc_op <> 'delete'"))


def tombstone_source(scd1_latest: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    return scd1_latest.where(F.col("_cdc_op") == "delete").select(*[qcol(k) for k in keys], "_cdc_seq")


def tombstone_spec(keys: tuple[str, ...]) -> MergeSpec:
    return (MergeSpec(on=keys).when_matched_update_all("s._cdc_seq > t._cdc_seq")
            .when_not_matched_insert_all())


def scd2_rows(changes: DataFrame, keys: tuple[str, ...], existing: DataFrame | None) -> DataFrame:
    """Version rows for every key touched by ``changes``, validity recomputed over the full chain."""
    cols = changes.columns + (existing.columns if existing is not None else [])
    src, rn = _free(cols, "__src"), _free(cols, "__rn")
    kcols = [qcol(k) for k in keys]
    new = changes.dropDuplicates([*keys, "_cdc_seq"]).withColumn(src, F.lit(1))
    if existing is not None:
        touched = new.select(*kcols).distinct()
        old = (existing.join(touched, list(keys), "left_semi")
               .drop(*SCD2_META).withColumn(src, F.lit(0)))
        new = old.unionByName(new, allowMissingColumns=True)
    pick = Window.partitionBy(*kcols, F.col("_cdc_seq")).orderBy(qcol(src))
    versions = new.withColumn(rn, F.row_number().over(pick)).where(qcol(rn) == 1).drop(rn, src)
    chain = Window.partitionBy(*kcols).orderBy("_cdc_seq")
    nxt_seq = F.lead("_cdc_seq").over(chain)
    return versions.select(
        "*",
        F.col("_cdc_commit_ts").alias("_valid_from"),
        F.lead("_cdc_commit_ts").over(chain).alias("_valid_to"),
        (nxt_seq.isNull() & (F.col("_cdc_op") != "delete")).alias("_is_current"),
    )


def scd2_spec(keys: tuple[str, ...]) -> MergeSpec:
    return (MergeSpec(on=(*keys, "_cdc_seq"))
            .when_matched_update({"_valid_to": "s._valid_to", "_is_current": "s._is_current"},
                                 "(t._valid_to IS DISTINCT FROM s._valid_to) "
                                 "OR (t._is_current <> s._is_current)")
            .when_not_matched_insert_all())
