"""A micro-batch like the one before reuses the code Spark generated for it (issue 9: the cost
of every batch after the first, in a long run or a long-lived session).

Spark compiles generated Java for each query stage and keeps the classes in a cache keyed by the
code's text (``spark.sql.codegen.cache.maxEntries``, a static conf, default 100). Two things made
every CDC batch compile about 100 classes again: one four-table batch needs about 100 classes, so
each batch evicted the one before's; and the quarantine rows carried the batch id and the current
time as literals, which Spark inlines into the code of every stage they pass (four 30 KB classes
per batch). The product sets the cache size (``spark_session.BASE_CONF``, the test session too)
and stamps those two values after the Spark job (``side_tables.stamp``).

Truth: Spark's own counter of compilations (``CodegenMetrics``), and the quarantine rows read back
with deltalake (batch id = the run's batch, time within the run).
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone

from deltalake import DeltaTable
from job_helpers import event, land, pipeline, run_cli

from cdc_lake.cdc.job import run_pipeline


def _compiled(spark) -> int:  # type: ignore[no-untyped-def]
    metrics = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics
    return int(metrics.METRIC_COMPILATION_TIME().getCount())


def _increment(run: int) -> list[str]:
    base = 1000 * (run + 1)
    lines = [event(base + i, total=i * 3, note=f"n{i}") for i in range(20)]
    lines += [event(base + i, typ="update", total=i * 5, note=f"u{i}") for i in range(0, 20, 4)]
    lines += [event(base + 50 + i, table="customers", name=f"c{i}") for i in range(5)]
    lines += [event(base + 70 + i, table="products", price=f"{i}.25", sku=f"p{i}") for i in range(5)]
    lines += [event(base + 80 + i, table="order_lines", qty=i, day="2026-11-28") for i in range(5)]
    lines.append(event(base + 60, typ="delete"))
    lines.append(json.dumps({"database": "shop", "table": "orders", "type": "insert",
                             "ts": 1795000000 + base, "xid": 7, "xoffset": 0,
                             "position": f"mysql-bin.000001:{base + 99}",
                             "data": {"status": f"no id in run {run}"}}))  # quarantined
    return lines


def test_a_batch_like_the_one_before_compiles_no_new_code(spark, tmp_path):
    cfg = pipeline(tmp_path, extra="  products: {keys: [id]}\n  order_lines: {keys: [id], scd: 2}\n")
    compiled, windows = [], []
    for run in range(4):
        land(tmp_path / "landing", f"maxwell-{run}.json", *_increment(run))
        before, start = _compiled(spark), datetime.now(timezone.utc)
        summary = run_pipeline(cfg, spark=spark, run_id=f"r{run}")
        compiled.append(_compiled(spark) - before)
        windows.append((summary["batch_ids"], start, datetime.now(timezone.utc)))
        assert summary["quarantined"] == 1, summary
    # run 0 creates the tables (its own plans), run 1 is the first of the steady shape; the
    # least of runs 2 and 3 (now and then one plan of a run differs: ~14 classes in 1 of 10)
    before = _compiled(spark)  # the counter counts (a literal no plan had before: new code)
    spark.range(1).selectExpr(f"id + {random.randrange(10**12)} AS x").collect()
    assert _compiled(spark) > before
    assert min(compiled[2:]) <= 2, (f"classes compiled per run {compiled}: batches shaped like "
                                    "the one before compiled their code again")
    quarantine = DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().to_pylist()
    assert len(quarantine) == 4
    for row in quarantine:
        run = int(row["raw_line"].split("no id in run ")[1][0])
        (batch_id,), start, end = windows[run]
        assert row["batch_id"] == batch_id, row
        assert row["run_id"] == f"r{run}"
        assert start <= row["quarantined_at"] <= end, (row, start, end)


def test_a_small_run_evaluates_interpreted_and_compiles_almost_nothing(spark, tmp_path):
    """A small CDC run's session evaluates expressions interpreted (``launch.codegen_conf``, set
    by the job when it builds its session for a backlog under ``spark.interpreted_below_mb``):
    the micro-batch must then compile next to nothing, where code generation compiles about a
    hundred classes for the first batch of a fresh JVM. The settings are the session's; the
    streaming query runs on a clone of it, so this checks that the clone's batches obey them.
    The job's choice itself is read back from its summary (``codegen``) in test_backlog and
    test_airflow_live."""
    from cdc_lake.launch import INTERPRETED_CONF, codegen_conf, codegen_mode

    assert codegen_conf(800 * 300) == INTERPRETED_CONF
    cfg = pipeline(tmp_path, extra="  products: {keys: [id]}\n  order_lines: {keys: [id], scd: 2}\n")
    saved = {k: spark.conf.get(k) for k in INTERPRETED_CONF}
    try:
        for k, v in INTERPRETED_CONF.items():
            spark.conf.set(k, v)
        assert codegen_mode(spark.conf.get) == "interpreted"
        compiled = []
        for run in range(2):
            land(tmp_path / "landing", f"maxwell-{run}.json", *_increment(run + 10))
            before = _compiled(spark)
            summary = run_pipeline(cfg, spark=spark, run_id=f"i{run}")
            compiled.append(_compiled(spark) - before)
            assert summary["quarantined"] == 1 and summary["events_read"] == 42, summary
    finally:
        for k, v in saved.items():
            spark.conf.set(k, v)
    assert codegen_mode(spark.conf.get) == "generated"
    # what interpreted mode still compiles: the columnar cache's accessors, a few projections
    assert max(compiled) <= 25, f"classes compiled per interpreted run {compiled}"


def test_a_run_on_a_session_the_process_already_has_leaves_its_code_generation(spark, tmp_path):
    """The job's ``main()`` in a process that already runs a session (a notebook, tests):
    ``getOrCreate`` hands that session back and applies the job's confs to it for good, so the
    small run's interpreted evaluation would outlive the run (it did: a default-tier run turned
    one test worker's shared session interpreted, 2026-11-29). The job leaves the owner's
    choice: the session still generates code, and the summary says so."""
    import json as _json

    from cdc_lake.launch import codegen_mode

    assert codegen_mode(spark.conf.get) == "generated"
    cfg = pipeline(tmp_path)
    land(tmp_path / "landing", "maxwell-0.json", *_increment(20))
    r = run_cli(spark, cfg.file, run_id="in-process")
    assert r.returncode == 0, r.stderr[-3000:]
    assert codegen_mode(spark.conf.get) == "generated", "the run switched the caller's session"
    summary = _json.loads((cfg.runs_path / cfg.name / "in-process.json").read_text())
    assert summary["codegen"] == "generated", summary
