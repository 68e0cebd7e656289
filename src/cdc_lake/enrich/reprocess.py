"""``--reprocess`` of an enrichment pipeline: :func:`reset` its checkpoint and output tables,
then :func:`bootstrap` the rebuild (a change feed: the fact table's current snapshot as one
batch; events: the stream reads the events folder from its start).

Example::

    reset(cfg)                                   # checks first; exit 2/3 before any delete
    bootstrap(spark, cfg, engine, run_id, stats)  # then the stream runs as usual

An interrupted reset leaves ``<checkpoint>/enrich_reprocess.json``: a later run without
``--reprocess`` refuses to start until it is run again.
"""

from __future__ import annotations

import json
import shutil
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_lake.checkpoint import instance_id
from cdc_lake.engines import Engine
from cdc_lake.enrich.config import EnrichConfig
from cdc_lake.enrich.counts import EnrichStats
from cdc_lake.enrich.fact_source import START_FILE, check_events_complete
from cdc_lake.enrich.state import check_reset, record_definitions
from cdc_lake.enrich.table_damage import check_dimensions_present, check_inputs_present
from cdc_lake.enrich.writer import EnrichBatch
from cdc_lake.sources.landing_history import check_restorable, restore_archived

REPROCESS_MARK = "enrich_reprocess.json"


def reset(cfg: EnrichConfig) -> None:
    """Drop this pipeline's checkpoint (keeping the lock file) and output tables, after checking
    that the rebuild can read everything the first runs read (upstream data files, dimension
    tables, event files: exit 3) and that none of the paths holds anything the job does not own
    (:func:`check_reset`: exit 2); nothing is deleted when a check fails. With
    ``fact.events.archive_dir`` the archived event files move back into the events folder first
    (:func:`~cdc_lake.sources.landing_history.restore_archived`)."""
    check_inputs_present(cfg)  # a deleted upstream data file
    check_events_complete(cfg)  # an event file read before, gone
    check_dimensions_present(cfg)
    cp = cfg.checkpoint_path
    o = cfg.outputs
    owned = [("outputs.enriched", o.enriched), ("outputs.pending", o.pending),
             ("outputs.manifest", o.manifest),
             *[(f"outputs.aggregates.{a.name}.path", a.path) for a in o.aggregates]]
    check_reset(cfg, owned)
    ev = cfg.fact.events
    archive = ev.archive_dir if ev is not None else None
    if archive is not None:  # a landing file named as an archived one: exit 3, nothing reset
        check_restorable(ev.path, archive, pipeline=cfg.name, key="fact.events.archive_dir")  # type: ignore[union-attr]
    cp.mkdir(parents=True, exist_ok=True)
    (cp / REPROCESS_MARK).write_text(json.dumps({"started_at": time.time()}), encoding="utf-8")
    if archive is not None:  # the stream from scratch lists the landing folder only
        n = restore_archived(ev.path, archive, pipeline=cfg.name, key="fact.events.archive_dir")  # type: ignore[union-attr]
        print(f"[enrich] --reprocess: moved {n} archived event file(s) back into {ev.path} "  # type: ignore[union-attr]
              "to read them again (Spark archives them again as the batches commit)", flush=True)
    for child in cp.iterdir():
        if child.name in ("cdc.lock", REPROCESS_MARK):
            continue
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    for _, path in owned:
        shutil.rmtree(path, ignore_errors=True)
    record_definitions(cfg)


def bootstrap(spark: SparkSession, cfg: EnrichConfig, engine: Engine, run_id: str,
               stats: EnrichStats) -> None:
    """Enrich the fact table's current snapshot as inserts; the stream then follows from v+1."""
    cp = cfg.checkpoint_path
    if cfg.fact.kind == "change_feed":
        path = str(cfg.fact.change_feed)
        version = engine.version(path)
        if version is not None:
            from cdc_lake.enrich.plan import read_at

            snap = read_at(engine, path, version)
            assert snap is not None
            rows = snap.select("*", F.lit("insert").alias("_change_type"),
                               F.lit(version).cast("bigint").alias("_commit_version"),
                               F.lit(None).cast("timestamp").alias("_commit_timestamp"))
            boot = EnrichBatch(cfg, engine, instance=f"{instance_id(cp)}-reprocess", run_id=run_id,
                               stats=stats, plan_root=cp / "_reprocess")
            boot(rows, 0)
        start = 0 if version is None else version + 1  # (version 0 is a version)
        (cp / START_FILE).write_text(json.dumps({"starting_version": start}), encoding="utf-8")
    shutil.rmtree(cp / "_reprocess", ignore_errors=True)
    (cp / REPROCESS_MARK).unlink(missing_ok=True)
