"""Engine ``delta-spark``: Delta's JVM library, as clusters run it.

Needs the delta-spark jars on the driver/executor classpath (``spark.jars.packages`` with
configurable coordinates/repositories, a local jar folder, or a baked image) plus the Delta SQL
extension and catalog; :func:`cdc_lake.spark_session.build_session` sets those.

Idempotency uses Delta's own transaction identifiers: DataFrameWriter options ``txnAppId`` /
``txnVersion`` for appends and, because MERGE is not a DataFrameWriter, the session confs
``spark.databricks.delta.write.txnAppId`` / ``...txnVersion`` for MERGE. Those confs are
session-wide, so they are set and cleared around each MERGE under a process lock (one stream
per session in this job). Delta itself then skips a write whose version is not newer.
"""

from __future__ import annotations

import threading
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdc_lake.engines.base import Engine, MergeSpec, Source, Txn, WriteResult

_TXN_CONF_APP = "spark.databricks.delta.write.txnAppId"
_TXN_CONF_VERSION = "spark.databricks.delta.write.txnVersion"
_SESSION_TXN_LOCK = threading.Lock()
# Every table this engine creates records a change feed (read by cdc_lake.sources.change_feed)
# and never deletes expired log files at its own checkpoints (Delta's default, every
# delta.checkpointInterval commits): behind a change-feed reader paused past
# delta.logRetentionDuration that lost the commits it still had to read. The maintenance job
# owns the log cleanup and holds it back for lagging readers (cdc_lake.maintenance); delta-rs's
# cleanup, which it runs, does not read this property. The deltalake engine gets the same
# behaviour from its post-commit hook settings.
CDF_PROPERTY = ("delta.enableChangeDataFeed", "true")
NO_LOG_CLEANUP_PROPERTY = ("delta.enableExpiredLogCleanup", "false")
# No deletion vectors even where a cluster turns them on for new tables
# (spark.databricks.delta.properties.defaults.enableDeletionVectors): the maintenance job and the
# deltalake change-feed source read the tables with delta-rs, which must be able to.
NO_DELETION_VECTORS = ("delta.enableDeletionVectors", "false")
TABLE_PROPERTIES = dict([CDF_PROPERTY, NO_LOG_CLEANUP_PROPERTY, NO_DELETION_VECTORS])


class DeltaSparkEngine(Engine):
    name = "delta-spark"

    def __init__(self, spark: Any) -> None:
        super().__init__(spark)
        self._checked: set[str] = set()  # tables whose properties were checked by this engine

    def _delta_table(self):  # type: ignore[no-untyped-def]
        from delta.tables import DeltaTable  # imported lazily: needs the JVM classes

        return DeltaTable

    def exists(self, path: str) -> bool:
        return bool(self._delta_table().isDeltaTable(self.spark, path))

    def version(self, path: str) -> int | None:
        if not self.exists(path):
            return None
        row = self._delta_table().forPath(self.spark, path).history(1).select("version").first()
        return int(row[0]) if row else None

    def schema(self, path: str) -> StructType | None:
        return self.read(path).schema if self.exists(path) else None  # type: ignore[union-attr]

    def read(self, path: str, *, version: int | None = None) -> DataFrame | None:
        if not self.exists(path):
            return None
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(path)

    def txn_version(self, path: str, app_id: str) -> int | None:
        """Read ``txn`` actions from the Delta log: the newest checkpoint plus the JSON commits
        after it (a checkpoint holds every transaction up to its version).

        Delta has no public API for this; the log format is the protocol, so read it directly.
        """
        from cdc_lake.paths import glob_escape  # Spark's readers expand globs ({x}, *) in paths

        log = path.rstrip("/") + "/_delta_log"
        versions: list[int] = []
        jvm_fs = self.spark._jvm.org.apache.hadoop.fs  # type: ignore[union-attr]
        hpath = jvm_fs.Path(log)
        fs = hpath.getFileSystem(self.spark._jsc.hadoopConfiguration())  # type: ignore[union-attr]
        if not fs.exists(hpath):
            return None
        names = [s.getPath().getName() for s in fs.listStatus(hpath)]
        json_after, checkpoint_parts = log_files_to_read(names)
        if json_after:
            commits = self.spark.read.json([glob_escape(log + "/" + n) for n in json_after])
            if "txn" in commits.columns:
                row = commits.where(F.col("txn.appId") == app_id).agg(F.max("txn.version")).first()
                if row and row[0] is not None:
                    versions.append(int(row[0]))
        if checkpoint_parts:
            cp = self.spark.read.parquet(*[glob_escape(log + "/" + n) for n in checkpoint_parts])
            if "txn" in cp.columns:
                row = cp.where(F.col("txn.appId") == app_id).agg(F.max("txn.version")).first()
                if row and row[0] is not None:
                    versions.append(int(row[0]))
        return max(versions) if versions else None

    def create(self, path: str, schema: StructType) -> None:
        builder = self._delta_table().createIfNotExists(self.spark).location(path).addColumns(
            StructType([StructField(f.name, f.dataType, True) for f in schema.fields]))
        for key, value in TABLE_PROPERTIES.items():
            builder = builder.property(key, value)
        builder.execute()

    def _ensure_properties(self, path: str) -> None:
        """A table created before these properties were set (or by another writer) gets them
        once per engine: one metadata-only commit (``SET TBLPROPERTIES``), no data change."""
        if path in self._checked:
            return
        have = self._delta_table().forPath(self.spark, path).detail().select("properties").first()
        props = dict(have[0] or {}) if have else {}
        missing = {k: v for k, v in TABLE_PROPERTIES.items()
                   if str(props.get(k, "")).lower() != v}
        if missing:
            pairs = ", ".join(f"'{k}' = '{v}'" for k, v in missing.items())
            self.spark.sql(f"ALTER TABLE {_table_ref(path)} SET TBLPROPERTIES ({pairs})")
        self._checked.add(path)

    def _merge(self, path: str, source: Source, spec: MergeSpec, txn: Txn) -> WriteResult:
        source = self.frame(source)
        if source.isEmpty():
            return WriteResult(False, self.version(path))
        if not self.exists(path):
            self.create(path, source.schema)
        self._ensure_properties(path)
        dt = self._delta_table().forPath(self.spark, path)
        builder = dt.alias("t").merge(source.alias("s"), spec.predicate).withSchemaEvolution()
        for c in spec.clauses:
            if c.kind == "matched_delete":
                builder = builder.whenMatchedDelete(condition=c.condition)
            elif c.kind == "matched_update_all":
                builder = builder.whenMatchedUpdateAll(condition=c.condition)
            elif c.kind == "matched_update":
                builder = builder.whenMatchedUpdate(condition=c.condition, set=dict(c.updates))
            elif c.kind == "not_matched_insert_all":
                builder = builder.whenNotMatchedInsertAll(condition=c.condition)
        with _SESSION_TXN_LOCK:
            self.spark.conf.set(_TXN_CONF_APP, txn.app_id)
            self.spark.conf.set(_TXN_CONF_VERSION, str(txn.version))
            try:
                result = builder.execute()
            finally:
                self.spark.conf.unset(_TXN_CONF_APP)
                self.spark.conf.unset(_TXN_CONF_VERSION)
        row = result.first() if result is not None else None
        if row is None:
            # Delta skipped it: the transaction (txnAppId, txnVersion) was already recorded, a
            # commit our log read did not see (MergeIntoCommand returns no metrics row then)
            return WriteResult(True, self.version(path))
        d = row.asDict()
        metrics = {"num_target_rows_inserted": d.get("num_inserted_rows", 0),
                   "num_target_rows_updated": d.get("num_updated_rows", 0),
                   "num_target_rows_deleted": d.get("num_deleted_rows", 0)}
        return WriteResult(False, self.version(path), metrics)

    def _append(self, path: str, df: Source, txn: Txn) -> WriteResult:
        df = self.frame(df)
        n = df.count()
        if n == 0:
            return WriteResult(False, self.version(path))
        if not self.exists(path):
            self.create(path, df.schema)  # created with the change-feed property
        self._ensure_properties(path)
        (df.write.format("delta").mode("append").option("mergeSchema", "true")
         .option("txnAppId", txn.app_id).option("txnVersion", str(txn.version)).save(path))
        return WriteResult(False, self.version(path), {"num_added_rows": n})

    def replace(self, path: str, df: DataFrame, txn: Txn | None = None) -> WriteResult:
        n = df.count()
        if not self.exists(path):
            self.create(path, df.schema)  # overwrite keeps the table's properties (change feed)
        self._ensure_properties(path)
        writer = df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
        if txn is not None:  # Delta's idempotent-write options: recorded as a txn action
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", str(txn.version))
        writer.save(path)
        return WriteResult(False, self.version(path), {"num_added_rows": n})

    def widen(self, path: str, types: dict[str, str]) -> WriteResult:
        """The same rewrite as the deltalake engine (one overwrite commit of the same rows with
        the wider types, tagged ``cdc_lake.same_rows`` in its ``userMetadata`` so change-feed
        readers skip it), not Delta's type widening: that adds the reader feature
        ``typeWidening``, which delta-rs 1.6 (the maintenance job, the deltalake change-feed
        reader) cannot read, and it refuses some widenings the product makes (an integer into a
        decimal with fewer than 10 integer digits)."""
        from cdc_lake.sources.delta_log import SAME_ROWS

        df = self.read(path)
        if df is None:
            return WriteResult(False, None)
        self._ensure_properties(path)
        cols = [F.col(f"`{f.name}`").cast(types[f.name]).alias(f.name) if f.name in types
                else F.col(f"`{f.name}`") for f in df.schema.fields]
        (df.select(*cols).write.format("delta").mode("overwrite").option("overwriteSchema", "true")
         .option("userMetadata", SAME_ROWS).save(path))
        return WriteResult(False, self.version(path))

    def history(self, path: str, limit: int = 20) -> list[dict[str, Any]]:
        if not self.exists(path):
            return []
        rows = self._delta_table().forPath(self.spark, path).history(limit).collect()
        return [r.asDict(recursive=True) for r in rows]


def _table_ref(path: str) -> str:
    return "delta.`" + path.replace("`", "``") + "`"


def log_files_to_read(names: list[str]) -> tuple[list[str], list[str]]:
    """Of a ``_delta_log`` listing: the JSON commits after the newest complete parquet
    checkpoint, and that checkpoint's files (``N.checkpoint.parquet``, the parts
    ``N.checkpoint.k.n.parquet`` — an incomplete set is passed over for an older checkpoint —
    or a v2 ``N.checkpoint.<uuid>.parquet``, whose top-level file holds the ``txn`` actions)."""
    checkpoints: dict[int, list[str]] = {}
    multi: dict[int, list[str]] = {}
    expected: dict[int, int] = {}
    commits: dict[int, str] = {}
    for n in names:
        head = n.split(".", 1)[0]
        if not head.isdigit():
            continue
        v = int(head)
        bits = n.split(".")
        if n == f"{head}.json":
            commits[v] = n
        elif bits[-1] != "parquet" or len(bits) < 3 or bits[1] != "checkpoint":
            continue
        elif len(bits) == 3 or len(bits) == 4:  # classic single file, or v2 (uuid)
            checkpoints.setdefault(v, [n])
        elif len(bits) == 5 and bits[2].isdigit() and bits[3].isdigit():
            multi.setdefault(v, []).append(n)
            expected[v] = int(bits[3])
    for v, ps in multi.items():
        if len(set(ps)) == expected[v] and v not in checkpoints:
            checkpoints[v] = sorted(ps)
    if not checkpoints:
        return [commits[v] for v in sorted(commits)], []
    cp = max(checkpoints)
    return [commits[v] for v in sorted(commits) if v > cp], checkpoints[cp]
