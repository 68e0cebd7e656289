"""SparkSession for a pipeline: UTC everywhere, Delta jars/extensions when delta-spark is asked for.

With spark-submit the session already exists (master, packages and confs come from the command
line); ``getOrCreate`` then only adds what is missing. Locally (tests, ``python spark_jobs/...``)
this builds a ``local[*]`` session.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

from cdc_lake.cdc.config import PipelineConfig
from cdc_lake.config import ConfigError
from cdc_lake.launch import FULL_JIT_FROM_MB, INTERPRETED_CONF, codegen_conf, launch_conf

COMPRESSED_CACHE = "spark.sql.inMemoryColumnarStorage.compressed"
CODEGEN_CACHE = "spark.sql.codegen.cache.maxEntries"  # static: set when the session starts
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
BASE_CONF = {
    "spark.sql.session.timeZone": "UTC",
    # PySpark 4 records the Python call site of every Column/function call (three JVM round
    # trips each: thousands per micro-batch, ~2.5 s of a small run). Error messages still name
    # the failing expression; only the Python file:line of the DataFrame context is dropped.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Spark keeps 100 compiled classes of generated code (a static conf). A CDC micro-batch of four
    # tables compiles about 100 distinct ones, so with the default every batch evicted the one
    # before's and compiled them all again (~100 per batch in a warm session; with 1000, none but
    # what changed). Matters for every run of more than one batch and for long-lived sessions.
    CODEGEN_CACHE: "1000",
}


def delta_spark_conf(cfg: PipelineConfig) -> dict[str, str]:
    """Spark confs that put delta-spark on the classpath (for spark-submit and local sessions)."""
    conf = {"spark.sql.extensions": DELTA_EXTENSION, "spark.sql.catalog.spark_catalog": DELTA_CATALOG}
    ds = cfg.delta_spark
    jars = sorted(str(p) for p in ds.jars_dir.glob("*.jar")) if ds.jars_dir else []
    if jars:
        conf["spark.jars"] = ",".join(jars)
    elif cfg.engine == "delta-spark":
        conf["spark.jars.packages"] = ds.packages
        if ds.repositories:
            conf["spark.jars.repositories"] = ds.repositories
    return conf


def session_conf(cfg: PipelineConfig, backlog_bytes: int | None = None) -> dict[str, str]:
    """Confs of a session built here; the driver JVM options follow the run's backlog
    (:func:`cdc_lake.launch.launch_conf`, with the JVM class archive when one is built), and so
    does a CDC run's expression evaluation (:func:`cdc_lake.launch.codegen_conf`), unless the
    pipeline's spark conf sets them."""
    from cdc_lake.jvm_archive import option

    conf = {**launch_conf(backlog_bytes, getattr(cfg, "full_jit_from_mb", FULL_JIT_FROM_MB),
                          archive=option()),
            **BASE_CONF}
    below = getattr(cfg, "interpreted_below_mb", None)  # CDC pipelines: their job sizes the backlog
    if below is not None:
        conf.update(codegen_conf(backlog_bytes, below))
    if cfg.engine == "delta-spark" or (cfg.delta_spark.jars_dir and cfg.engine == "auto"):
        conf.update(delta_spark_conf(cfg))
    conf.update(cfg.spark_conf)
    return conf


def build_session(cfg: PipelineConfig, app_name: str | None = None, *,
                  backlog_bytes: int | None = None) -> SparkSession:
    """The pipeline's session. ``backlog_bytes`` (input the run will read, if known) picks the
    driver JIT of a bare ``python`` run; under spark-submit the JVM already runs with the
    launcher's choice (the operator's)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name or f"cdc-{cfg.name}")
    # Under spark-submit the JVM (and its --master/--packages) already exists: the Python driver
    # is handed a gateway port. Only a bare `python ...` run picks local mode itself.
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master("local[*]").config("spark.ui.showConsoleProgress", "false")
    conf = session_conf(cfg, backlog_bytes)
    if SparkContext._active_spark_context is not None:
        # getOrCreate will hand back a session this process already runs (a notebook, a test
        # calling the job's main()) and apply these confs to it for good: its expression
        # evaluation stays the owner's choice (it would outlive this run).
        for key in INTERPRETED_CONF:
            if key not in cfg.spark_conf:
                conf.pop(key, None)
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    try:  # the session's SQL conf is built (and each value checked) on first use
        _session_defaults(spark, cfg)
    except Exception as e:  # noqa: BLE001 - re-raised unless it is a refused conf value
        refused = refused_conf(cfg, e)
        if refused is None:
            raise
        raise refused from None
    return spark


def launcher_time_zone(spark: SparkSession) -> str | None:
    """A ``spark.sql.session.timeZone`` other than UTC that the driver JVM was launched with
    (``spark-submit --conf``, ``spark-defaults.conf``; Spark keeps them as system properties),
    which the job's session does not use (it is UTC: timestamps without an offset and time
    buckets are UTC, docs/contracts.md); None when unset or UTC under any name
    (``Etc/UTC``, ``GMT``, ``+00:00``). Before 2026-11-30 it was overridden without a word."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    tz = jvm.java.lang.System.getProperty("spark.sql.session.timeZone")
    if not tz:
        return None
    try:
        if jvm.java.time.ZoneId.of(tz).normalized().equals(jvm.java.time.ZoneOffset.UTC):
            return None
    except Exception:  # noqa: BLE001 - a zone Java does not know is not UTC either
        pass
    return str(tz)


def _session_defaults(spark: SparkSession, cfg: PipelineConfig) -> None:
    tz = launcher_time_zone(spark)
    if tz is not None:
        print(f"[cdc] WARNING: spark.sql.session.timeZone={tz} from the launch (spark-submit "
              "--conf or spark-defaults.conf) is not used: the job's session is UTC (text "
              "without an offset is read as UTC; time buckets are UTC days/hours). A pipeline's "
              "spark.conf refuses other zones.", file=sys.stderr)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    defaults = {
        # AQE is off in streaming, so the default 200 shuffle partitions would mean 200 tiny tasks
        # per window on a small machine; size them to the cores unless someone chose a value.
        "spark.sql.shuffle.partitions": str(max(4, 2 * spark.sparkContext.defaultParallelism)),
        # A micro-batch's caches live for one batch and are scanned several times (the CDC batch:
        # survey, type checks, one decode per table): uncompressed, every scan skips the decoding.
        # 2026-11-25, cold ingest into a fresh lake: 200k events 22.4 -> 20.5 s, 1M 64.9 -> 57.2 s.
        COMPRESSED_CACHE: "false",
    }
    for key, value in defaults.items():
        if not spark.sparkContext.getConf().contains(key) and key not in cfg.spark_conf:
            spark.conf.set(key, value)  # unless spark-defaults, --conf or the pipeline set it


def refused_conf(cfg: PipelineConfig, e: BaseException) -> ConfigError | None:
    """A :class:`ConfigError` for a session Spark would not create because a conf value is
    invalid (``INVALID_CONF_VALUE``: ``spark.sql.shuffle.partitions: abc``), naming the key,
    the value and where it came from; None for any other failure. A wrong value is not
    transient: the job exits 2 (config error, no retry) instead of 1 (tester, 2026-11-28)::

        except Exception as e:
            raise refused_conf(cfg, e) or e
    """
    text = str(e)
    if "INVALID_CONF_VALUE" not in text:
        return None
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
    m = re.search(r'config "([^"]+)"', first)
    key = m.group(1) if m else None
    if key is not None and key in cfg.spark_conf:
        return ConfigError(cfg.file, f"spark.conf.{key}", f"Spark refused {cfg.spark_conf[key]!r}: {first}")
    return ConfigError(cfg.file, "spark.conf", f"Spark refused a conf value that is not in this file "
                       f"(spark-defaults.conf or a --conf of the launch): {first}")


def driver_java_options(spark: SparkSession) -> str | None:
    """The options the driver JVM actually runs with (its input arguments), or None when the
    session has no local JVM (Spark Connect)."""
    try:
        jvm = spark.sparkContext._jvm
        bean = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()  # type: ignore[union-attr]
        # joined in the JVM: iterating the Java list from Python is one Py4J call per argument
        return str(jvm.java.lang.String.join(" ", bean.getInputArguments()))  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - informational only
        return None


STOPPED_CONTEXT = "Cannot call methods on a stopped SparkContext"


def failure_line(e: BaseException, limit: int = 600) -> str:
    """``Type: first line of the message`` of a failed run's exception, for the job's last
    line: the cause of a Spark failure (``INVALID_CONF_VALUE ... 'abc'``) used to sit only far up
    in the log, above the JVM's frames and shutdown lines (tester, 2026-11-28)."""
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {first[:limit]}" if first else type(e).__name__


def stopped_context_hint(error_text: str) -> str | None:
    """What to say when a job failed because Spark stopped its own context under it, or None.

    Spark's standalone client gives up on a master it cannot reach (a wrong host or port, a
    master that is down) after about a minute and stops the SparkContext; the job then fails
    with ``Cannot call methods on a stopped SparkContext`` and the cause is only in Spark's log
    (``All masters are unresponsive``) far above (cluster tester, 2026-11-28)::

        hint = stopped_context_hint(traceback.format_exc())
        if hint: print(f"[cdc] {hint}", file=sys.stderr)
    """
    if STOPPED_CONTEXT not in error_text:
        return None

    sc = SparkContext._active_spark_context
    master = getattr(sc, "master", None) or "?"
    where = (f"the cluster manager at {master} could not be reached or ended the application "
             "(Spark's log above says why, e.g. 'Failed to connect to master' / 'All masters "
             "are unresponsive' / 'Application has been killed'): check the master URL (the "
             "Airflow Spark connection, or spark-submit --master) and that the master and its "
             "workers are up"
             if not str(master).startswith("local") else
             "the driver stopped it (Spark's log above says why)")
    return (f"Spark stopped the SparkContext while the job ran (master {master}): {where}. "
            "Retrying is safe: the next run resumes where this one stopped")


def batch_handler(fn: Callable[[Any, int], Any]) -> Callable[[Any, int], Any]:
    """``fn`` for ``foreachBatch``, with a Python error that is not an ``Exception`` turned into
    a ``RuntimeError`` naming it. Py4J's callback server hands only Exceptions back to Spark;
    another one (delta-rs's Rust panics arrive as ``pyo3_runtime.PanicException``, a
    BaseException) ended the callback thread, and the query waited for it forever (tester: a
    run that hung, holding its pipeline lock, on a table path delta-rs could not parse)::

        stream.writeStream.foreachBatch(batch_handler(writer))
    """
    def handle(df: Any, batch_id: int) -> Any:
        try:
            return fn(df, batch_id)
        except Exception:
            raise
        except BaseException as e:  # noqa: BLE001 - anything else would hang the query
            raise RuntimeError(f"micro-batch {batch_id} failed: {type(e).__module__}."
                               f"{type(e).__name__}: {e}") from e
    return handle


NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


@contextmanager
def session_settings(spark: SparkSession, conf: dict[str, str]) -> Iterator[None]:
    """Within: the session runs with ``conf``; each key's own value (or its absence) is put
    back after. For settings a query or a read takes when it is created (a streaming query
    keeps the copy of the session's conf it took at start; a file read lists its files when
    ``spark.read...`` returns)::

        with session_settings(spark, {NO_DATA_BATCHES: "false"}):
            query = writer.start()
    """
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def start_without_no_data_batches(spark: SparkSession, writer: Any) -> Any:
    """``writer.start()`` (a ``DataStreamWriter``) with Spark's no-data micro-batches off for
    this query; the session's own setting is put back once the query has started (the query
    keeps the copy of the session's conf it took at start).

    A stream with an event-time watermark ends every run with one more micro-batch that reads
    nothing: Spark runs it because the watermark moved, to evict state and to emit what waited
    for the watermark. The enrichment query's only stateful step is the events' deduplication,
    which emits each row in the batch that reads it, so such a batch emits nothing; the next
    batch with data evicts the state instead. Its ``foreachBatch`` still planned and wrote a
    batch for no fact (2.1-2.4 s of a 5.4 s warm run of one new file; docs/benchmarks.md)::

        query = start_without_no_data_batches(spark, stream.writeStream.foreachBatch(fn))
    """
    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        return writer.start()


def check_file_name_encoding(spark: SparkSession, cfg: Any) -> None:
    """Raise :class:`ConfigError` (exit 2) when the driver JVM cannot name a file the pipeline
    uses: without a UTF-8 locale (``LANG``/``LC_ALL`` unset or ``C``, as under systemd, cron or
    a slim image) Java encodes file names as ASCII, and Spark skipped a landing file named
    ``0002_ü.json`` with exit 0 (tester), or did not find a lake folder with such a name. Only
    names that are not ASCII matter: the pipeline's paths and the files in the folders Spark
    lists. Python cannot tell this itself (it switches the C locale to UTF-8 for its own use);
    the JVM's ``sun.jnu.encoding`` says it."""
    from cdc_lake.paths import written_paths

    enc = str(spark.sparkContext._jvm.java.lang.System.getProperty("sun.jnu.encoding") or "")
    if enc.replace("-", "").upper() == "UTF8":
        return
    names = [(key, str(p)) for key, p, _ in written_paths(cfg)]
    kind = getattr(cfg, "kind", "cdc")
    if kind == "enrich":
        listed = [("fact.events.path", cfg.fact.events.path)] if cfg.fact.kind == "events" else []
        names += [("fact.change_feed", str(p)) for p in cfg.change_feed_sources]
        names += [(f"dimensions.{d.name}.table", str(d.table)) for d in cfg.dimensions]
    elif kind == "dimension":
        listed = [("snapshots.path", cfg.snapshots.path)]
    else:
        listed = [("source.path", cfg.landing_path)]
    for key, folder in listed:
        names.append((key, str(folder)))
        if os.path.isdir(folder):
            names += [(key, os.path.join(folder, e.name)) for e in os.scandir(folder)]
    bad = [(key, name) for key, name in names if not name.isascii()]
    if bad:
        key, name = bad[0]
        raise ConfigError(cfg.file, key, (
            f"the driver JVM encodes file names as {enc or 'unknown'} (no usable UTF-8 locale: "
            f"LC_ALL={os.environ.get('LC_ALL', '')!r}, LC_CTYPE={os.environ.get('LC_CTYPE', '')!r}, "
            f"LANG={os.environ.get('LANG', '')!r}; unset, C, or a locale this machine does not "
            f"have), so Spark cannot use {name!r}"
            + (f" and {len(bad) - 1} more non-ASCII name(s)" if len(bad) > 1 else "")
            + ": it would skip such landing files and not find such folders. Run spark-submit "
            "with a UTF-8 locale the machine has, e.g. `LC_ALL=C.UTF-8 spark-submit ...` "
            "(LC_ALL, when set, overrides LC_CTYPE and LANG; `locale -a` lists the installed "
            "ones; the Airflow operator sets LANG=C.UTF-8 when the worker has no locale)"))
