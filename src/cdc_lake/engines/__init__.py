"""Delta engines behind one seam; :func:`select_engine` picks one.

``auto`` picks delta-spark only when its JVM classes actually load in this session (a cluster
image or jars folder), otherwise delta-rs. Asking for ``delta-spark`` explicitly when the classes
are missing is an error naming what to configure — never a silent fallback.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from cdc_lake.engines.base import Computed, Engine, MergeClause, MergeSpec, Source, Txn, WriteResult
from cdc_lake.engines.deltalake_engine import DeltaRsEngine
from cdc_lake.engines.delta_spark_engine import DeltaSparkEngine

__all__ = ["Computed", "Source", "Engine", "MergeClause", "MergeSpec", "Txn", "WriteResult",
           "select_engine", "delta_spark_available", "DeltaRsEngine", "DeltaSparkEngine"]


class EngineUnavailable(RuntimeError):
    pass


def delta_spark_available(spark: SparkSession) -> tuple[bool, str]:
    """Whether Delta's JVM classes load in this session, and why not."""
    try:
        import delta.tables  # noqa: F401  (python side, from the delta-spark wheel)
    except ImportError as e:
        return False, f"python package delta-spark not importable: {e}"
    try:
        jvm = spark._jvm  # type: ignore[attr-defined]
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable", False,
                                    jvm.Thread.currentThread().getContextClassLoader())
    except Exception as e:  # py4j wraps ClassNotFoundException
        return False, ("JVM class io.delta.tables.DeltaTable not on the classpath "
                       f"({type(e).__name__}); set engine.delta_spark.packages/jars_dir")
    return True, "io.delta.tables.DeltaTable loaded"


def select_engine(spark: SparkSession, name: str) -> Engine:
    if name == "deltalake":
        return DeltaRsEngine(spark)
    ok, why = delta_spark_available(spark)
    if name == "delta-spark":
        if not ok:
            raise EngineUnavailable(f"engine 'delta-spark' requested but unavailable: {why}")
        return DeltaSparkEngine(spark)
    if name == "auto":
        return DeltaSparkEngine(spark) if ok else DeltaRsEngine(spark)
    raise ValueError(f"unknown engine {name!r}; expected auto, deltalake or delta-spark")
