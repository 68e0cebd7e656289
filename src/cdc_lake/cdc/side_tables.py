"""Quarantine and DDL log: fixed schemas, created up front, appended idempotently.

Both side tables have a fixed contract (every column nullable), created explicitly before their
first write — never inferred from whatever the first batch held, so a later row with a null in
some column (a malformed line has no table) can always be written.

Appends are idempotent twice over:

* within one checkpoint generation by the Delta transaction id ``(app_id, batch_id)``
  (:meth:`Engine.append` skips a batch already committed — the guard against replays);
* across checkpoint rebuilds (a new ``app_id``) by a natural key: a row is only added when the
  table does not already hold it. Quarantine key: ``pipeline, source_file, raw_line``; DDL log
  key: ``pipeline, source_file, _cdc_seq, sql``. Keys are compared as a multiset (the n-th
  occurrence of a key in a batch is added only if the table holds fewer than n), so two
  identical bad lines in one file stay two rows, and a re-ingest adds none.

Example::

    ensure(engine, "/lake/_quarantine", QUARANTINE)
    result = append_new(engine, "/lake/_quarantine", rows, QUARANTINE, txn=Txn("cdc-x", 3))
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (LongType, StringType, StructField, StructType, TimestampType)

from cdc_lake.engines import Computed, Engine, Source, Txn, WriteResult


@dataclass(frozen=True)
class SideTable:
    name: str
    schema: StructType
    key: tuple[str, ...]


def _schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(n, t, nullable=True) for n, t in fields])  # type: ignore[arg-type]


QUARANTINE = SideTable("quarantine", _schema(
    ("source_file", StringType()), ("raw_line", StringType()), ("reason", StringType()),
    ("source_table", StringType()), ("pipeline", StringType()), ("run_id", StringType()),
    ("batch_id", LongType()), ("quarantined_at", TimestampType())),
    key=("pipeline", "source_file", "raw_line"))

DDL_LOG = SideTable("ddl_log", _schema(
    ("database", StringType()), ("table", StringType()), ("ddl_type", StringType()),
    ("sql", StringType()), ("_cdc_seq", StringType()), ("_cdc_commit_ts", TimestampType()),
    ("source_file", StringType()), ("pipeline", StringType()), ("run_id", StringType())),
    key=("pipeline", "source_file", "_cdc_seq", "sql"))


def ensure(engine: Engine, path: str, table: SideTable) -> None:
    """Create the side table with its contract schema; repair one whose columns were made NOT NULL.

    Tables written by earlier versions inferred their schema from the first batch (a literal
    column became NOT NULL): those are rewritten once, in one commit, with the nullable contract.
    """
    current = engine.schema(path)
    if current is None:
        engine.create(path, table.schema)
        return
    if any(not f.nullable for f in current.fields if f.name in table.schema.fieldNames()):
        df = engine.read(path)
        assert df is not None
        engine.replace(path, conform(df, table))


def conform(df: DataFrame, table: SideTable) -> DataFrame:
    """``df`` in the contract's column order and types; every column nullable."""
    have = set(df.columns)
    cols = [(F.col(f"`{f.name}`") if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in table.schema.fields]
    return df.select(*cols)


def stamp(rows: Source, values: dict[str, object]) -> Source:
    """``rows`` with each column of ``values`` set to that one value (a batch id, a time).

    Per-batch values are set after the batch's Spark job rather than planned as literals: Spark
    inlines a numeric or timestamp literal into the generated code, and its code cache matches on
    the code's text, so a literal that changes every batch made Spark compile the quarantine's
    query stages again on every batch (four 30 KB classes in a four-table batch). Example::

        rows = stamp(sources["side:quarantine"], {"batch_id": 7, "quarantined_at": now})
    """
    if isinstance(rows, Computed):
        data = rows.data
        for name, value in values.items():
            i = data.schema.get_field_index(name)
            data = data.set_column(i, data.schema.field(i),
                                   pa.array([value] * data.num_rows, data.schema.field(i).type))
        return Computed(data, rows.schema)
    return rows.withColumns({name: F.lit(value).cast(rows.schema[name].dataType)
                             for name, value in values.items()})


def _key(table: SideTable) -> Column:
    parts = [F.coalesce(F.col(f"`{c}`").cast("string"), F.lit("\u0000null")) for c in table.key]
    return F.sha2(F.concat_ws("\u0001", *parts), 256)


def _new_rows(engine: Engine, path: str, rows: Computed, table: SideTable) -> Computed:
    """The rows of ``rows`` whose natural key the table holds fewer times (multiset, in order)."""
    data = rows.data.select(table.schema.fieldNames())
    keys = list(zip(*(data.column(c).to_pylist() for c in table.key)))
    files = sorted(set(data.column("source_file").to_pylist()), key=lambda f: (f is None, f or ""))
    existing = engine.read_arrow(path, list(table.key), where_in=("source_file", files))
    held = Counter(zip(*(existing.column(c).to_pylist() for c in table.key))) \
        if existing is not None else Counter()
    seen: Counter[tuple[object, ...]] = Counter()
    keep = []
    for i, key in enumerate(keys):
        seen[key] += 1
        if seen[key] > held[key]:
            keep.append(i)
    return Computed(data.take(pa.array(keep, type=pa.int64())), table.schema)


def append_new(engine: Engine, path: str, rows: Source, table: SideTable, *, txn: Txn) -> WriteResult:
    """Append the rows of ``rows`` the table does not hold yet (by natural key), under ``txn``.

    ``rows`` may be computed already (:meth:`Engine.compute`): none -> no Spark work at all.
    """
    if engine.already_committed(path, txn):
        return WriteResult(True, engine.version(path))
    if engine.known_empty(rows):
        return WriteResult(False, engine.version(path))
    if isinstance(rows, Computed):  # computed already (a handful of rows): compare in Arrow
        return engine.append(path, _new_rows(engine, path, rows, table), txn=txn)
    rows = conform(rows, table)
    numbered = rows.withColumn("__k", _key(table)).withColumn(
        "__n", F.row_number().over(Window.partitionBy("__k").orderBy(F.lit(1))))
    existing = engine.read(path)
    if existing is not None:
        files = [r[0] for r in numbered.select("source_file").distinct().collect()]
        names = [f for f in files if f is not None]
        same_files = F.col("source_file").isin(names)  # prunes by file statistics
        if len(names) < len(files):
            same_files = same_files | F.col("source_file").isNull()
        scope = existing.where(same_files)
        held = scope.select(_key(table).alias("__k")).groupBy("__k").agg(F.count(F.lit(1)).alias("__held"))
        numbered = (numbered.join(held, "__k", "left")
                    .where(F.col("__n") > F.coalesce(F.col("__held"), F.lit(0))))
    return engine.append(path, conform(numbered, table), txn=txn)
