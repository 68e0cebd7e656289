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
    ("spark: {conf: {spark.sql.inMemoryColumnarStorage.compressed: 'true'}}\n", "true", True),
], ids=["default", "pipeline-conf-wins"])
def test_batch_cache_compression_default_and_override(tmp_path, spark_yaml, conf, compressed):
    got = _probe(tmp_path, spark_yaml)
    assert got["conf"] == conf, got
    (size,) = got["cache_bytes"]  # what the cached relation really holds
    assert (size < 20_000) if compressed else (size >= 100_000), got
    assert int(got["partitions"]) >= 4, got  # shuffle partitions sized to the cores (>= 4)
