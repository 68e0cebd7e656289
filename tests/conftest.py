"""Shared fixtures: one real local SparkSession per test process, and the Delta engines to run.

Engines: ``deltalake`` always runs. ``delta-spark`` runs only when its JVM classes load (jars
from ``CDC_DELTA_JARS_DIR`` or ``CDC_DELTA_PACKAGES`` with Maven access); otherwise its tests
are skipped and the reason is printed in the session header and the summary.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

# Configure a private Airflow before any test module (or cdc_lake.airflow) can import airflow:
# Airflow reads its configuration once, at import, and collection order is not ours to choose.
import airflow_env  # noqa: E402,F401
import live_stack  # noqa: E402
from live_stack import shared_airflow  # noqa: E402,F401 - the fixture, for the live-Airflow files

_ENGINE_STATUS: dict[str, str] = {}


def _spark_builder():  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = (SparkSession.builder.master("local[2]").appName("cdc-lake-tests")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.default.parallelism", "2")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.memory", "2g"))
    # The product gives a small run's driver C1-only JIT (it lives seconds). This JVM lives for a
    # whole xdist worker (minutes of Spark jobs), where the full tiered JIT is faster: 2026-11-27,
    # tests/test_enrich_job.py 213 -> 180 s, test_cdc_properties + test_writer_types 131 -> 111 s.
    # The jobs' own spark-submits (CLI, Airflow, chaos tests) keep the product's choice;
    # CDC_TEST_JIT=c1 runs this JVM with it too.
    from cdc_lake.launch import LAUNCH_CONF
    if os.environ.get("CDC_TEST_JIT") == "c1":
        for k, v in LAUNCH_CONF.items():
            b = b.config(k, v)
    # A small CDC run's own session evaluates expressions interpreted (launch.codegen_conf); this
    # one generates code (as enrichment and big CDC runs do) unless CDC_TEST_CODEGEN=interpreted.
    from cdc_lake.launch import INTERPRETED_CONF
    if os.environ.get("CDC_TEST_CODEGEN") == "interpreted":
        for k, v in INTERPRETED_CONF.items():
            b = b.config(k, v)
    from cdc_lake.spark_session import COMPRESSED_CACHE, BASE_CONF
    b = b.config(COMPRESSED_CACHE, "false")  # the product's batch caches
    for k, v in BASE_CONF.items():  # and every session setting the product's jobs run with
        b = b.config(k, v)
    jars_dir = os.environ.get("CDC_DELTA_JARS_DIR")
    packages = os.environ.get("CDC_DELTA_PACKAGES")
    if jars_dir or packages:
        b = b.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension").config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        if jars_dir:
            b = b.config("spark.jars", ",".join(str(p) for p in sorted(Path(jars_dir).glob("*.jar"))))
        else:
            b = b.config("spark.jars.packages", packages)
    return b


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    session = _spark_builder().getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    # py4j logs from __del__ at interpreter exit, after pytest closed its streams: keep it quiet
    # so the run ends with pytest's own summary line.
    logging.getLogger("py4j").setLevel(logging.ERROR)


def _engine_params() -> list[str]:
    return ["deltalake", "delta-spark"]


@pytest.fixture(params=_engine_params())
def engine_name(request, spark) -> str:  # type: ignore[no-untyped-def]
    name = request.param
    if name == "delta-spark":
        from cdc_lake.engines import delta_spark_available

        ok, why = delta_spark_available(spark)
        _ENGINE_STATUS[name] = "RAN" if ok else f"SKIPPED: {why}"
        if not ok:
            pytest.skip(f"engine delta-spark unavailable: {why} (set CDC_DELTA_JARS_DIR or "
                        "CDC_DELTA_PACKAGES on a machine with the jars / Maven access)")
    else:
        _ENGINE_STATUS[name] = "RAN"
    return name


def pytest_report_header(config):  # type: ignore[no-untyped-def]
    return ["delta engines: deltalake always; delta-spark when CDC_DELTA_JARS_DIR/"
            "CDC_DELTA_PACKAGES provide its jars"]


def pytest_sessionfinish(session):  # type: ignore[no-untyped-def]
    """Stop a shared live Airflow still running; under pytest-xdist, hand this worker's engine
    status to the controller's summary."""
    live_stack.stop_shared()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["cdc_engine_status"] = dict(_ENGINE_STATUS)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without pytest-xdist
def pytest_testnodedown(node, error):  # type: ignore[no-untyped-def]
    for name, status in getattr(node, "workeroutput", {}).get("cdc_engine_status", {}).items():
        # a skip on one worker and a run on another cannot both be true; keep the loudest
        if _ENGINE_STATUS.get(name, "").startswith("SKIPPED") and status == "RAN":
            continue
        _ENGINE_STATUS[name] = status


def pytest_terminal_summary(terminalreporter):  # type: ignore[no-untyped-def]
    if _ENGINE_STATUS:
        terminalreporter.section("Delta engines")
        for name, status in sorted(_ENGINE_STATUS.items()):
            terminalreporter.write_line(f"{name:<12} {status}")


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without pytest-xdist
def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
    """``--dist loadfile``, but the files that share one live Airflow are one scope."""
    return live_stack.make_scheduler(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):  # type: ignore[no-untyped-def]
    yield
    live_stack.after_teardown(item, nextitem)


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """The live-Airflow files next to each other; the slow tier is opt-in: CDC_SLOW=1 or an
    explicit ``-m`` expression."""
    live_stack.group_together(items)
    if os.environ.get("CDC_SLOW") == "1" or config.getoption("-m"):
        return
    skip = pytest.mark.skip(reason="slow tier: set CDC_SLOW=1 (or -m slow) to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
