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
from pyspark.sql.types import StructType

from cdc_lake.engines.base import Engine, MergeSpec, Source, Txn, WriteResult

_TXN_CONF_APP = "spark.databricks.delta.write.txnAppId"
_TXN_CONF_VERSION = "spark.databricks.delta.write.txnVersion"
_SESSION_TXN_LOCK = threading.Lock()
# Every table this engine creates records a change feed (read by cdc_lake.sources.change_feed).
CDF_PROPERTY = ("delta.enableChangeDataFeed", "true")


class DeltaSparkEngine(Engine):
    name = "delta-spark"

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
        """Read ``txn`` actions from the Delta log (JSON commits + latest checkpoint).

        Delta has no public API for this; the log format is the protocol, so read it directly.
        """
        log = path.rstrip("/") + "/_delta_log"
        versions: list[int] = []
        jvm_fs = self.spark._jvm.org.apache.hadoop.fs  # type: ignore[union-attr]
        hpath = jvm_fs.Path(log)
        fs = hpath.getFileSystem(self.spark._jsc.hadoopConfiguration())  # type: ignore[union-attr]
        if not fs.exists(hpath):
            return None
        names = [s.getPath().getName() for s in fs.listStatus(hpath)]
        if any(n.endswith(".json") for n in names):
            commits = self.spark.read.json(log + "/*.json")
            if "txn" in commits.columns:
                row = commits.where(F.col("txn.appId") == app_id).agg(F.max("txn.version")).first()
                if row and row[0] is not None:
                    versions.append(int(row[0]))
        checkpoints = sorted(n for n in names if ".checkpoint" in n and n.endswith(".parquet"))
        if checkpoints:
            latest = checkpoints[-1].split(".")[0]
            parts = [log + "/" + n for n in checkpoints if n.startswith(latest)]
            cp = self.spark.read.parquet(*parts)
            if "txn" in cp.columns:
                row = cp.where(F.col("txn.appId") == app_id).agg(F.max("txn.version")).first()
                if row and row[0] is not None:
                    versions.append(int(row[0]))
        return max(versions) if versions else None

    def create(self, path: str, schema: StructType) -> None:
        (self._delta_table().createIfNotExists(self.spark).location(path)
         .addColumns(schema).property(*CDF_PROPERTY).execute())

    def _merge(self, path: str, source: Source, spec: MergeSpec, txn: Txn) -> WriteResult:
        source = self.frame(source)
        if source.isEmpty():
            return WriteResult(False, self.version(path))
        if not self.exists(path):
            self.create(path, source.schema)
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
        metrics: dict[str, Any] = {}
        row = result.first() if result is not None else None
        if row is not None:
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
        (df.write.format("delta").mode("append").option("mergeSchema", "true")
         .option("txnAppId", txn.app_id).option("txnVersion", str(txn.version)).save(path))
        return WriteResult(False, self.version(path), {"num_added_rows": n})

    def replace(self, path: str, df: DataFrame) -> WriteResult:
        n = df.count()
        if not self.exists(path):
            self.create(path, df.schema)  # overwrite keeps the table's properties (change feed)
        df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
        return WriteResult(False, self.version(path), {"num_added_rows": n})

    def widen(self, path: str, types: dict[str, str]) -> WriteResult:
        """Delta type widening (table feature ``typeWidening``): metadata only, no rewrite."""
        table = "delta.`" + path.replace("`", "``") + "`"
        self.spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
        for column, sql_type in types.items():
            quoted = "`" + column.replace("`", "``") + "`"
            self.spark.sql(f"ALTER TABLE {table} ALTER COLUMN {quoted} TYPE {sql_type}")
        return WriteResult(False, self.version(path))

    def history(self, path: str, limit: int = 20) -> list[dict[str, Any]]:
        if not self.exists(path):
            return []
        rows = self._delta_table().forPath(self.spark, path).history(limit).collect()
        return [r.asDict(recursive=True) for r in rows]
