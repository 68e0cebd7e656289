"""``cdc_lake.pinned``: a batch's shared frames computed once, as a leaf in local mode, and
freed after the batch (an enrichment run leaves no block of its batches behind)."""

from __future__ import annotations

from pyspark.sql import functions as F

from cdc_lake.pinned import local_master, pin, release


def _persisted(spark) -> int:  # type: ignore[no-untyped-def]
    return spark.sparkContext._jsc.sc().getPersistentRDDs().size()


def test_pin_cuts_the_lineage_in_local_mode_and_release_frees_it(spark) -> None:
    before = _persisted(spark)
    src = spark.range(50).select(F.col("id"), (F.col("id") * 3).alias("x"))
    df = pin(src.where("id % 2 = 0"))
    # a leaf: the analyzer of every later step sees no Range / Filter / Project under it
    plan = df._jdf.queryExecution().analyzed()
    assert plan.getClass().getSimpleName() == "LogicalRDD", plan.toString()
    assert plan.children().size() == 0
    assert _persisted(spark) == before + 1  # computed now, held by the block manager
    assert sorted(r["x"] for r in df.where("id < 10").collect()) == [0, 6, 12, 18, 24]
    release(df)
    assert _persisted(spark) == before
    # a cached frame (the cluster's pin) is freed too
    cached = src.persist()
    cached.count()
    release(cached)
    assert not cached.is_cached


def test_an_enrichment_run_leaves_no_pinned_block_behind(spark, tmp_path) -> None:
    from test_enrich_late_events import _rows, _setup

    from cdc_lake.enrich.job import run_enrich

    cfg, landing = _setup(tmp_path)
    landing.land("a.json", [("e1", 1, "2026-01-02T10:00:00Z")])
    landing.land("b.json", [("e2", 2, "2026-01-02T10:30:00Z")])
    before = _persisted(spark)
    s = run_enrich(cfg, spark=spark, run_id="r1")
    assert len(s["batch_ids"]) >= 2, s
    assert {r["event_id"] for r in _rows(tmp_path / "gold/ev")} == {"e1", "e2"}
    assert _persisted(spark) == before


def test_only_a_one_jvm_master_gets_the_local_checkpoint() -> None:
    # local-cluster[...] runs executors in JVMs of their own: a lost one would take a local
    # checkpoint's blocks with it, so it gets the cache like any cluster
    assert all(local_master(m) for m in ("local", "local[2]", "local[*]", "local[4,3]"))
    assert not any(local_master(m) for m in ("local-cluster[2,1,1024]", "spark://h:7077", "yarn",
                                             "k8s://https://h:443"))
