"""The session a job builds (``build_session``): the defaults it adds for micro-batch work, and
that a pipeline's own ``spark.conf`` wins over them (a value from spark-defaults or ``--conf``
wins the same way, by the same check; not exercised here).

Truth: the live session's conf, and the memory a cached relation of 1,000 equal 100-character
strings really takes in Spark's storage status (compressed: a dictionary of one value;
uncompressed: every copy), read from a fresh driver process per case (a SparkContext's confs are
fixed at its start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from airflow_env import REPO

PROBE = textwrap.dedent("""\
    import json, sys
    from cdc_lake.config import load_pipeline
    from cdc_lake.spark_session import COMPRESSED_CACHE, build_session
    spark = build_session(load_pipeline(sys.argv[1]))
    df = spark.range(1000).selectExpr("id", "repeat('x', 100) AS s").persist()
    df.count()
    sizes = [i.memSize() for i in spark.sparkContext._jsc.sc().getRDDStorageInfo()]
    print("PROBE " + json.dumps({"conf": spark.conf.get(COMPRESSED_CACHE),
                                 "partitions": spark.conf.get("spark.sql.shuffle.partitions"),
                                 "cache_bytes": sizes}))
    spark.stop()
    """)


def _probe(tmp_path, spark_yaml: str) -> dict:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        pipeline: session_probe
        source: {{format: maxwell, path: {tmp_path / 'landing'}}}
        storage: {{root: {tmp_path / 'lake'}}}
        engine: {{name: deltalake}}
        tables: {{orders: {{keys: [id]}}}}
        """) + spark_yaml, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"),
                                                                     os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", PROBE, str(cfg)], capture_output=True, text=True,
                         env=env, timeout=300)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert out.returncode == 0 and line, out.stdout[-2000:] + out.stderr[-4000:]
    return json.loads(line[len("PROBE "):])


@pytest.mark.parametrize("spark_yaml,conf,compressed", [
    ("", "false", False),  # the default: batch caches uncompressed
    # slow tier (CI time): a pipeline's spark.conf winning over the product's settings is
    # checked in the default tier by test_backlog.py::test_codegen_conf_threshold_and_config
    pytest.param("spark: {conf: {spark.sql.inMemoryColumnarStorage.compressed: 'true'}}\n", "true",
                 True, marks=pytest.mark.slow),
], ids=["default", "pipeline-conf-wins"])
def test_batch_cache_compression_default_and_override(tmp_path, spark_yaml, conf, compressed):
    got = _probe(tmp_path, spark_yaml)
    assert got["conf"] == conf, got
    (size,) = got["cache_bytes"]  # what the cached relation really holds
    assert (size < 20_000) if compressed else (size >= 100_000), got
    assert int(got["partitions"]) >= 4, got  # shuffle partitions sized to the cores (>= 4)


STOPPED = textwrap.dedent("""\
    import traceback
    from pyspark.sql import SparkSession
    from cdc_lake.spark_session import stopped_context_hint
    spark = SparkSession.builder.master("local[1]").getOrCreate()
    spark.sparkContext._jsc.sc().stop()  # as Spark's standalone client does when the master is gone
    try:
        spark.range(3).count()
    except Exception:
        print("HINT", stopped_context_hint(traceback.format_exc()))
    print("OTHER", stopped_context_hint("java.io.FileNotFoundException: x"))
    """)


def test_a_context_spark_stopped_under_the_job_is_named(tmp_path):
    """A job whose SparkContext Spark stopped (the standalone client gives up on an unreachable
    master after a minute) failed with only 'Cannot call methods on a stopped SparkContext';
    the jobs now print what it means (cluster tester, 2026-11-28). Real stop of the JVM context;
    the cluster wording was checked by hand against ``--master spark://127.0.0.1:7078``."""
    script = tmp_path / "stopped.py"
    script.write_text(STOPPED)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in r.stdout.splitlines()
             if ln.startswith(("HINT ", "OTHER "))}
    assert lines.get("OTHER") == "None", r.stdout + r.stderr[-2000:]
    assert "stopped the SparkContext" in lines.get("HINT", "") and "local[1]" in lines["HINT"], lines


def test_package_zip_command_prints_a_reusable_zip(tmp_path):
    """``python -m cdc_lake.packaging`` (the by-hand cluster command in the README) prints the
    zip's path; the zip imports as the package; a second call reuses it."""
    import zipfile

    cmd = [sys.executable, "-m", "cdc_lake.packaging", "--dest", str(tmp_path)]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    again = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    assert first == again and first.startswith(str(tmp_path)) and first.endswith(".zip")
    names = zipfile.ZipFile(first).namelist()
    assert "cdc_lake/__init__.py" in names and "cdc_lake/cdc/job.py" in names
    probe = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                            "import cdc_lake.packaging as m; print(m.__file__)", first],
                           capture_output=True, text=True, check=True).stdout
    assert probe.startswith(first), probe


def test_a_failed_run_ends_with_the_cause_not_only_a_pointer_up(spark):
    """Tester: a run failing in Spark ended with ``RUN FAILED (see the error above)``; the cause
    (an error class and the value) was far up, above the JVM frames. The jobs' last line now
    carries the exception's first line."""
    from cdc_lake.spark_session import failure_line

    with pytest.raises(Exception) as e:
        spark.sql("SELECT CAST('abc' AS INT)").collect()
    line = failure_line(e.value)
    assert "CAST_INVALID_INPUT" in line and "'abc'" in line and "\n" not in line, line
    assert failure_line(ValueError("")) == "ValueError"


def test_a_python_error_that_is_no_exception_fails_the_batch_instead_of_hanging(spark, tmp_path):
    """delta-rs panics arrive as ``pyo3_runtime.PanicException`` (a BaseException); raised in a
    ``foreachBatch`` function it ended Py4J's callback thread and the query waited forever,
    holding the pipeline lock (tester: a lake path with '['). Through ``batch_handler`` the
    query fails at once, naming the error."""
    from pyspark.errors import StreamingQueryException

    from cdc_lake.spark_session import batch_handler

    class PanicException(BaseException):  # what pyo3 raises for a Rust panic
        pass

    def panics(df, batch_id):  # type: ignore[no-untyped-def]
        raise PanicException("Invalid object store url.: External(InvalidDomainCharacter)")

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("x\n")
    query = (spark.readStream.format("text").load(str(tmp_path / "in")).writeStream
             .foreachBatch(batch_handler(panics))
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    try:
        with pytest.raises(StreamingQueryException) as e:
            assert query.awaitTermination(90), "the query hung after the error"
        assert "PanicException" in str(e.value) and "InvalidDomainCharacter" in str(e.value), str(e.value)[:2000]
    finally:
        if query.isActive:
            query.stop()


def test_the_file_name_encoding_check_covers_every_job_kind(tmp_path, monkeypatch):
    """Each kind's paths under a folder with a non-ASCII name: refused (exit 2) when the driver
    JVM's ``sun.jnu.encoding`` is not UTF-8, passed when it is. The JVM's answer is the one
    thing stood in for here (a real spark-submit without a locale: test_job_cli.py)."""
    from types import SimpleNamespace

    from cdc_lake.config import ConfigError, load_pipeline
    from cdc_lake.spark_session import check_file_name_encoding

    def jvm_says(enc: str):  # type: ignore[no-untyped-def]
        system = SimpleNamespace(getProperty=lambda key: enc if key == "sun.jnu.encoding" else None)
        return SimpleNamespace(sparkContext=SimpleNamespace(
            _jvm=SimpleNamespace(java=SimpleNamespace(lang=SimpleNamespace(System=system)))))

    data = tmp_path / "dätä"
    for sub in ("landing/shop_maxwell", "snapshots/product_categories"):
        (data / sub).mkdir(parents=True)
    monkeypatch.setenv("CDC_DATA_DIR", str(data))
    for name, key in (("shop_maxwell", "storage.checkpoint"), ("shop_order_lines", "storage.checkpoint"),
                      ("product_categories", "storage.state")):
        cfg = load_pipeline(REPO / "pipelines" / f"{name}.yaml")
        check_file_name_encoding(jvm_says("UTF-8"), cfg)
        with pytest.raises(ConfigError) as e:
            check_file_name_encoding(jvm_says("ANSI_X3.4-1968"), cfg)
        assert e.value.key == key and "dätä" in str(e.value) and "LANG=C.UTF-8" in str(e.value), str(e.value)
    # ASCII paths, one non-ASCII landing file: named by the folder's key
    (tmp_path / "l").mkdir()
    (tmp_path / "l" / "0002_ü.json").write_text("{}\n")
    (tmp_path / "p.yaml").write_text("pipeline: p\nsource: {format: maxwell, path: l}\n"
                                     "storage: {root: lake}\ntables: {t: {keys: [id]}}\n")
    with pytest.raises(ConfigError) as e:
        check_file_name_encoding(jvm_says("ANSI_X3.4-1968"), load_pipeline(tmp_path / "p.yaml"))
    assert e.value.key == "source.path" and "0002_ü.json" in str(e.value), str(e.value)


def test_a_launch_time_zone_other_than_utc_is_named_under_any_utc_spelling_none(spark):
    """The driver JVM's ``spark.sql.session.timeZone`` system property (what spark-submit
    ``--conf`` and spark-defaults.conf set; a real spark-submit in ``test_job_cli.py``): UTC
    under any of its names is not reported, another zone (or one Java does not know) is."""
    from cdc_lake.spark_session import launcher_time_zone

    system = spark.sparkContext._jvm.java.lang.System
    before = system.getProperty("spark.sql.session.timeZone")
    try:
        for tz, said in (("UTC", None), ("Etc/UTC", None), ("GMT", None), ("+00:00", None),
                         ("Z", None), ("Asia/Shanghai", "Asia/Shanghai"), ("+08:00", "+08:00"),
                         ("Mars/Olympus", "Mars/Olympus")):
            system.setProperty("spark.sql.session.timeZone", tz)
            assert launcher_time_zone(spark) == said, tz
        system.clearProperty("spark.sql.session.timeZone")
        assert launcher_time_zone(spark) is None
    finally:
        if before is None:
            system.clearProperty("spark.sql.session.timeZone")
        else:
            system.setProperty("spark.sql.session.timeZone", before)
