"""The table engine seam: every Delta read/write of the jobs goes through one of these.

Writes are idempotent per ``(app_id, version)`` :class:`Txn`: the engine checks the table's
recorded transaction version first and skips a write already committed, and records the pair in
the same commit as the data. Both engines speak the same merge spec: SQL predicates over the
aliases ``s`` (source micro-batch) and ``t`` (target table).

Example::

    engine = select_engine(spark, "auto")
    spec = MergeSpec(on=("id",)).when_matched_delete("s._cdc_op = 'delete'") \\
        .when_matched_update_all("s._cdc_seq > t._cdc_seq").when_not_matched_insert_all()
    result = engine.merge("/lake/orders", batch_df, spec, txn=Txn("cdc-shop-4f1c", 12))
    result.skipped, result.version, result.metrics

A job that writes several tables per micro-batch asks the engine to compute all their sources
first (:meth:`Engine.compute`): delta-rs gets them from one Spark job, delta-spark keeps them
as DataFrames (its MERGE runs inside Spark anyway)::

    sources = engine.compute({"orders": orders_df, "customers": customers_df})
    engine.merge("/lake/orders", sources["orders"], spec, txn=txn)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

ClauseKind = Literal["matched_delete", "matched_update_all", "matched_update", "not_matched_insert_all"]


@dataclass(frozen=True)
class Txn:
    """Idempotency token: ``app_id`` must change whenever the checkpoint is rebuilt."""

    app_id: str
    version: int


@dataclass(frozen=True)
class MergeClause:
    kind: ClauseKind
    condition: str | None = None
    updates: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class MergeSpec:
    """Join keys plus ordered clauses; built fluently, immutable."""

    on: tuple[str, ...]
    clauses: tuple[MergeClause, ...] = ()

    @property
    def predicate(self) -> str:
        return " AND ".join(f"t.`{k}` = s.`{k}`" for k in self.on)

    def _add(self, clause: MergeClause) -> MergeSpec:
        return MergeSpec(self.on, self.clauses + (clause,))

    def when_matched_delete(self, condition: str | None = None) -> MergeSpec:
        return self._add(MergeClause("matched_delete", condition))

    def when_matched_update_all(self, condition: str | None = None) -> MergeSpec:
        return self._add(MergeClause("matched_update_all", condition))

    def when_matched_update(self, updates: dict[str, str], condition: str | None = None) -> MergeSpec:
        return self._add(MergeClause("matched_update", condition, tuple(updates.items())))

    def when_not_matched_insert_all(self, condition: str | None = None) -> MergeSpec:
        return self._add(MergeClause("not_matched_insert_all", condition))


@dataclass(frozen=True)
class WriteResult:
    skipped: bool
    version: int | None
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def inserted(self) -> int:
        return int(self.metrics.get("num_target_rows_inserted", self.metrics.get("num_added_rows", 0)) or 0)

    @property
    def updated(self) -> int:
        return int(self.metrics.get("num_target_rows_updated", 0) or 0)

    @property
    def deleted(self) -> int:
        return int(self.metrics.get("num_target_rows_deleted", 0) or 0)


@dataclass(frozen=True)
class Computed:
    """A write source already computed on the driver (Arrow), with its Spark schema."""

    data: pa.Table
    schema: StructType


Source = DataFrame | Computed


class Engine(ABC):
    """One Delta implementation. Paths are local paths or URIs understood by the engine."""

    name: str
    #: ``compute`` returns every source as Arrow on the driver (:class:`Computed`): work that
    #: needs only a batch's own keys (e.g. a lookup in a side table) can then follow it there,
    #: without a Spark read of the whole side table in the plan.
    computes_to_arrow: bool = False

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def version(self, path: str) -> int | None:
        """Latest table version, or None if there is no table."""

    @abstractmethod
    def schema(self, path: str) -> StructType | None: ...

    @abstractmethod
    def read(self, path: str, *, version: int | None = None) -> DataFrame | None:
        """The latest snapshot, or the one at ``version`` (Delta time travel), as a Spark
        DataFrame; None if there is no table.

        Example::

            engine.read("/lake/gold/order_lines")              # now
            engine.read("/lake/gold/order_lines", version=12)  # as of version 12
        """

    def count(self, path: str) -> int:
        """Rows of the latest snapshot (0 if no table). This default counts with Spark."""
        df = self.read(path)
        return 0 if df is None else df.count()

    def read_arrow(self, path: str, columns: list[str], *, where_in: tuple[str, list[Any]]) -> pa.Table | None:
        """``columns`` of the rows whose ``where_in[0]`` is one of ``where_in[1]`` (``None`` there
        also matches null), as Arrow; None if no table. For small lookups (the side tables'
        natural keys); this default goes through Spark.

        Example::

            held = engine.read_arrow("/lake/_quarantine", ["source_file", "raw_line"],
                                     where_in=("source_file", ["f1.json", None]))
        """
        df = self.read(path)
        if df is None:
            return None
        column, values = where_in
        wanted = [v for v in values if v is not None]
        cond = F.col(f"`{column}`").isin(wanted) if wanted else F.lit(False)
        if len(wanted) < len(values):
            cond = cond | F.col(f"`{column}`").isNull()
        return df.where(cond).select(*[F.col(f"`{c}`") for c in columns]).toArrow()

    @abstractmethod
    def txn_version(self, path: str, app_id: str) -> int | None:
        """Last version recorded for ``app_id`` in the table's log, or None."""

    @abstractmethod
    def create(self, path: str, schema: StructType) -> None:
        """Create an empty table if none exists (no-op otherwise)."""

    @abstractmethod
    def _merge(self, path: str, source: Source, spec: MergeSpec, txn: Txn) -> WriteResult: ...

    @abstractmethod
    def _append(self, path: str, df: Source, txn: Txn) -> WriteResult: ...

    @abstractmethod
    def replace(self, path: str, df: DataFrame, txn: Txn | None = None) -> WriteResult:
        """Overwrite the table's content and schema in one commit (readers never see a gap).
        ``txn``: recorded with the commit (the writer's owner mark, :mod:`cdc_lake.table_writers`)."""

    @abstractmethod
    def history(self, path: str, limit: int = 20) -> list[dict[str, Any]]: ...

    def compute(self, frames: dict[str, DataFrame], *, rows: int | None = None) -> dict[str, Source]:
        """Compute several write sources ahead of their writes; pass the results to ``merge``.

        ``rows``: a bound on the rows of all frames together (e.g. the micro-batch's event
        count), None if unknown; an engine may compute small batches differently from big ones.
        Default: the frames unchanged (each is computed by its own write).
        """
        return dict(frames)

    def frame(self, source: Source) -> DataFrame:
        """A source as a Spark DataFrame (for further Spark work on a computed one)."""
        if isinstance(source, Computed):
            return arrow_frame(self.spark, source.data, source.schema)
        return source

    @staticmethod
    def known_empty(source: Source) -> bool:
        """True when the source is computed and has no rows (a DataFrame: not known, False)."""
        return isinstance(source, Computed) and source.data.num_rows == 0

    def widen(self, path: str, types: dict[str, str]) -> WriteResult:
        """Change column types to wider ones that hold every stored value exactly.

        Callers decide losslessness (:func:`cdc_lake.cdc.widening.widen`). This default rewrites
        the table once (one commit, same rows, new schema): delta-rs has no type widening.
        """
        df = self.read(path)
        if df is None:
            return WriteResult(False, None)
        cols = [F.col(f"`{f.name}`").cast(types[f.name]).alias(f.name) if f.name in types
                else F.col(f"`{f.name}`") for f in df.schema.fields]
        return self.replace(path, df.select(*cols))

    def already_committed(self, path: str, txn: Txn) -> bool:
        last = self.txn_version(path, txn.app_id) if self.exists(path) else None
        return last is not None and last >= txn.version

    def merge(self, path: str, source: Source, spec: MergeSpec, *, txn: Txn) -> WriteResult:
        """Idempotent MERGE of a micro-batch; creates the table from the source schema if absent.

        An empty source commits nothing.
        """
        if self.already_committed(path, txn):
            return WriteResult(True, self.version(path))
        return self._merge(path, source, spec, txn)

    def append(self, path: str, df: Source, *, txn: Txn) -> WriteResult:
        """Idempotent append; creates the table if absent. An empty frame commits nothing."""
        if self.already_committed(path, txn):
            return WriteResult(True, self.version(path))
        return self._append(path, df, txn)


def arrow_frame(spark: SparkSession, data: pa.Table, schema: StructType) -> DataFrame:
    """``data`` as a DataFrame of exactly ``schema``, built in the JVM from Arrow.

    Use this (or :func:`empty_frame`) for driver-side rows, never ``createDataFrame(list)``:
    PySpark turns a Python list into an RDD of pickled rows that Python worker processes
    unpickle — on a fresh JVM that starts a worker daemon and costs about a second per run.

    Example::

        rows = pa.Table.from_pylist([{"id": 1}], schema=pa.schema([("id", pa.int64())]))
        arrow_frame(spark, rows, StructType([StructField("id", LongType())])).count()
    """
    return spark.createDataFrame(data, schema)


def empty_frame(spark: SparkSession, schema: StructType) -> DataFrame:
    """An empty DataFrame of exactly ``schema`` with no Python worker (see :func:`arrow_frame`)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return arrow_frame(spark, to_arrow_schema(schema, timezone="UTC").empty_table(), schema)
