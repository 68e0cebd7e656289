"""PySpark Python Data Source ``cdc_lake_change_feed``: a Delta table's change feed via delta-rs.

Offsets are JSON ``{"version": n, "table_id": "<metaData.id>", "commit": "<fingerprint>"}``:
``n`` is the last table version consumed (``-1`` = nothing yet, i.e. start at version 0),
``commit`` the fingerprint of version ``n``'s commit file (:func:`~cdc_lake.sources.delta_log.
fingerprint`), ``table_id`` the table id when the query first started (informational).

**Re-created table** = the table's history no longer continues the versions already read: the
commit of version ``n`` is now another commit (its fingerprint differs), or ``n`` is beyond the
table's latest version. A changed ``metaData.id`` alone is not a re-creation: delta-rs 1.6
writes a new id when a MERGE with schema evolution adds a column. Offsets written before the
fingerprint existed fall back to the table id: a re-creation when no commit left in the log
carries the old id. Each micro-batch reads whole
versions ``start+1 .. end``; partitions are contiguous version ranges; ``read()`` runs in Python
workers and yields Arrow record batches from ``DeltaTable.load_cdf``.

The driver side (``latestOffset``/``partitions``) validates every version range before tasks
run (see :mod:`cdc_lake.sources.delta_log`) and raises
:class:`~cdc_lake.sources.errors.ChangeFeedUnavailable` for rewrites, removed history or a
re-created table. Imports only pyspark's pure-Python Data Source API, pyarrow and deltalake.

Example::

    spark.dataSource.register(ChangeFeedDataSource)
    df = (spark.readStream.format("cdc_lake_change_feed").option("path", "/lake/orders")
          .option("max_versions_per_trigger", "10").load())
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from cdc_lake.sources.delta_log import Commit, DeltaLog
from cdc_lake.sources.errors import DEFAULT_RECOVERY, ChangeFeedUnavailable

NAME = "cdc_lake_change_feed"
CHANGE_COLUMNS = (StructField("_change_type", StringType()),
                  StructField("_commit_version", LongType()),
                  StructField("_commit_timestamp", TimestampType()))
MAX_PARTITIONS = 16


def _int_option(options: dict, key: str) -> int | None:
    raw = options.get(key)
    if raw in (None, "", "None", "null"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{NAME}: option {key}: expected a positive integer, got {raw!r}") from None
    if value < 0 or (value == 0 and key != "starting_version"):
        raise ValueError(f"{NAME}: option {key}: expected a positive integer, got {raw!r}")
    return value


def table_schema(path: str) -> StructType:
    """The table's current columns plus the three change columns (resolved at query start)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError
    from pyspark.sql.pandas.types import from_arrow_schema

    try:
        dt = DeltaTable(path)
    except TableNotFoundError:
        raise FileNotFoundError(f"{NAME}: no Delta table at {path} (the change feed's source "
                                f"table must exist before the query starts)") from None
    cols = from_arrow_schema(pa.schema(dt.schema().to_arrow()), prefer_timestamp_ntz=True)
    return StructType([f for f in cols.fields if f.name not in {c.name for c in CHANGE_COLUMNS}]
                      + list(CHANGE_COLUMNS))


class ChangeFeedDataSource(DataSource):
    """Options: ``path`` (required), ``starting_version``, ``max_versions_per_trigger``,
    ``max_rows_per_trigger``, ``recovery`` (command named in errors)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return table_schema(self._path())

    def _path(self) -> str:
        path = self.options.get("path")
        if not path:
            raise ValueError(f"{NAME}: option 'path' (the Delta table) is required")
        return path

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ChangeFeedStreamReader(self._path(), schema, dict(self.options))


class VersionRange(InputPartition):
    def __init__(self, first: int, last: int) -> None:
        super().__init__((first, last))
        self.first = first
        self.last = last


class ChangeFeedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, path: str, schema: StructType, options: dict[str, Any]) -> None:
        self.path = path
        self.schema = schema
        self.starting_version = _int_option(options, "starting_version")
        self.max_versions = _int_option(options, "max_versions_per_trigger")
        self.max_rows = _int_option(options, "max_rows_per_trigger")
        self.recovery = options.get("recovery") or DEFAULT_RECOVERY
        self._target: int | None = None     # fixed end version under availableNow
        self._checked: dict[int, Commit] = {}  # driver-side validation cache
        self._cdf_after: tuple[int, bool] | None = None
        self._continues: set[tuple[int, str | None]] = set()  # (version, fingerprint) verified

    # -- driver side -------------------------------------------------------------------------
    def _log(self) -> DeltaLog:
        return DeltaLog(self.path, self.recovery)

    def _current(self) -> tuple[int, str | None]:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            dt = DeltaTable(self.path)
        except TableNotFoundError:
            raise self._log().unavailable(None, None, "the table no longer exists "
                                          "(dropped or moved)") from None
        return dt.version(), dt.metadata().id

    def initialOffset(self) -> dict:
        _, table_id = self._current()
        first = self.starting_version if self.starting_version is not None else 0
        offset: dict[str, Any] = {"version": first - 1, "table_id": table_id}
        if first > 0:
            fp = self._log().commit_fingerprint(first - 1)
            if fp is not None:
                offset["commit"] = fp
        return offset

    def _check_continues(self, start: dict, first: int, last: int, table_id: str | None,
                         log: DeltaLog) -> None:
        """Raise when the table's history no longer continues version ``first - 1`` that this
        reader already read (see the module doc: a re-created table)."""
        n = first - 1
        fp = start.get("commit") if isinstance(start, dict) else None
        if (n, fp) in self._continues:
            return
        if isinstance(fp, str) and n >= 0:
            now = log.commit_fingerprint(n)
            # None: the log entry was cleaned up (log retention); nothing left to compare
            if now is not None and now != fp:
                raise log.unavailable(first, last, f"the table was re-created: version {n}, the "
                                      f"last version this reader read, is now another commit "
                                      f"(commit fingerprint {fp} is now {now})")
        else:
            want = start.get("table_id") if isinstance(start, dict) else None
            if want is not None and want != table_id and not log.table_id_in_log(want):
                raise log.unavailable(first, last, f"the table was re-created (table id {want} "
                                      f"is now {table_id}, and no commit in its log carries "
                                      f"{want})")
        self._continues.add((n, fp if isinstance(fp, str) else None))

    def _start_version(self, offset: dict) -> int:
        v = offset.get("version") if isinstance(offset, dict) else None
        if not isinstance(v, int) or isinstance(v, bool) or v < -1:
            raise self._log().unavailable(None, None, f"damaged checkpoint offset {offset!r}: "
                                          "expected {\"version\": <int >= -1>}")
        return v

    def _validate(self, start: dict, first: int, last: int,
                  current: tuple[int, str | None] | None = None) -> list[Commit]:
        """Check versions first..last (cached), raising ChangeFeedUnavailable."""
        latest, table_id = current if current is not None else self._current()
        log = self._log()
        if first - 1 > latest:
            raise log.unavailable(first, last, f"the checkpoint offset (version {first - 1}) is "
                                  f"beyond the table's latest version {latest}: the table was "
                                  f"re-created or the checkpoint belongs to another table")
        self._check_continues(start, first, last, table_id, log)
        todo = [v for v in range(first, last + 1) if v not in self._checked]
        if todo:
            lo, hi = todo[0], todo[-1]
            if self._cdf_after is not None and self._cdf_after[0] == lo - 1:
                cdf_before = self._cdf_after[1]
            else:
                cdf_before = log.cdf_enabled_at(lo - 1)
            # table_id=None: a metaData.id change inside the range is a schema change (delta-rs
            # writes a new id on MERGE schema evolution), not a re-creation (checked above)
            commits = log.check(lo, hi, table_id=None, cdf_enabled_before=cdf_before)
            for c in commits:
                self._checked[c.version] = c
            self._cdf_after = (hi, commits[-1].cdf)
        return [self._checked[v] for v in range(first, last + 1)]

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._current()[0]

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_rows is not None:
            return ReadMaxRows(self.max_rows)
        if self.max_versions is not None:
            return ReadMaxFiles(self.max_versions)  # a version is this source's "file"
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._start_version(start)
        latest, table_id = self._current()
        end = latest if self._target is None else min(self._target, latest)
        if begin > latest:
            self._validate(start, begin + 1, begin + 1, (latest, table_id))  # raises: beyond
        if end <= begin:
            return start
        max_versions = max_rows = None
        if not isinstance(limit, ReadAllAvailable):
            max_versions = self.max_versions
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_rows
        if max_versions is not None:
            end = min(end, begin + max_versions)
        commits = self._validate(start, begin + 1, end, (latest, table_id))
        if max_rows is not None:
            total, last = 0, begin + 1
            for c in commits:
                if total and total + c.rows > max_rows:
                    break
                total += c.rows
                last = c.version
            end = last
        return {"version": end, "table_id": start.get("table_id") or table_id,
                "commit": self._checked[end].fingerprint}

    def reportLatestOffset(self) -> dict | None:
        latest, table_id = self._current()
        return {"version": latest, "table_id": table_id}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, last = self._start_version(start) + 1, self._start_version(end)
        if last < first:
            return []
        commits = self._validate(start, first, last)  # also after a restart replays a batch
        return version_ranges([c.version for c in commits if not c.skip], MAX_PARTITIONS)

    def commit(self, end: dict) -> None:
        done = self._start_version(end)
        for v in [v for v in self._checked if v <= done]:
            del self._checked[v]

    def read_on_driver(self, start: dict, end: dict, *, max_rows: int,
                       max_bytes: int) -> pa.Table | None:
        """The micro-batch ``start``..``end`` read in this process, after the same checks as
        :meth:`partitions`; None when its commits hold more than ``max_rows`` estimated change
        rows or ``max_bytes`` of files (let Spark's tasks read it then)."""
        first, last = self._start_version(start) + 1, self._start_version(end)
        target = to_arrow_schema(self.schema, timezone="UTC", prefers_large_types=False)
        if last < first:
            return target.empty_table()
        commits = self._validate(start, first, last)
        if sum(c.rows for c in commits) > max_rows or sum(c.bytes for c in commits) > max_bytes:
            return None
        # one load_cdf per run of consecutive versions (no split: read here, one after another)
        ranges = version_ranges([c.version for c in commits if not c.skip], 1)
        return pa.Table.from_batches(
            [b for r in ranges for b in self.read(r)], schema=target)

    # -- worker side -------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_versions(self.path, self.schema, partition.first, partition.last, self.recovery)


def version_ranges(versions: list[int], max_parts: int) -> list[VersionRange]:
    """Contiguous runs of ``versions`` (ascending), split until there are ``max_parts`` ranges.

    Never spans a version left out (skipped); so gaps can make more ranges than ``max_parts``.
    """
    runs: list[list[int]] = []
    for v in versions:
        if runs and runs[-1][-1] == v - 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    while runs and len(runs) < max_parts and max(len(r) for r in runs) > 1:
        longest = max(runs, key=len)
        i = runs.index(longest)
        runs[i:i + 1] = [longest[:len(longest) // 2], longest[len(longest) // 2:]]
    return [VersionRange(r[0], r[-1]) for r in runs]


def read_versions(path: str, schema: StructType, first: int, last: int,
                  recovery: str = DEFAULT_RECOVERY) -> Iterator[pa.RecordBatch]:
    """Change rows of versions first..last as Arrow batches shaped exactly like ``schema``.

    Columns the table gained after the query started are dropped; columns missing from a
    version are null (a new column appears in the next query run, which re-resolves the schema).
    """
    from deltalake import DeltaTable

    target = to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)
    try:
        reader = DeltaTable(path).load_cdf(starting_version=first, ending_version=last)
        for raw in reader:
            batch = pa.record_batch(raw)
            if batch.num_rows:
                yield _conform(batch, target)
    except ChangeFeedUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - make a vanished file read as the same error
        text = str(exc)
        if any(s in text.lower() for s in ("not found", "no such file", "does not exist")):
            raise ChangeFeedUnavailable(path, first, last, f"reading failed: {text}",
                                        recovery) from exc
        raise


def _conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    names = batch.schema.names
    cols = []
    for field in target:
        if field.name in names:
            col = batch.column(names.index(field.name))
            if col.type != field.type:
                col = _cast(col, field.type)
        else:
            col = pa.nulls(batch.num_rows, field.type)
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, schema=target)


def _cast(col: pa.Array, to: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(col.type) and pa.types.is_timestamp(to) and col.type.tz is None \
            and to.tz is not None:
        col = col.cast(pa.timestamp(col.type.unit, tz="UTC"))  # delta-rs: UTC instants, no zone
    return col.cast(to)


def offset_json(version: int, table_id: str | None = None) -> str:
    """The offset text Spark stores for ``version`` (used by tests and docs)."""
    return json.dumps({"version": version, "table_id": table_id})
