"""A scheduled run of an enrichment pipeline with nothing to do skips Spark.

Most runs of a pipeline scheduled every few minutes find no new fact. Such a run started a
Spark session, checked the tables' schemas with it, started and stopped the stream: 5.6–6.0 s
of spark-submit wall on the 2-core machine (2026-12-01), for a summary of zeros. As the CDC
job's :func:`cdc_lake.cdc.backlog.nothing_new`, :func:`nothing_to_do` answers True only when it
is sure that Spark would do nothing:

* not ``--reprocess``, no unfinished ``--reprocess`` (its mark). Any engine: the state is read
  with delta-rs (the Delta log is the protocol; a table with a reader feature delta-rs lacks is a
  doubt), as the CDC job's no-op run does, and the summary says ``<engine> (not started:
  nothing new)`` for an engine other than ``deltalake``;
* the checkpoint's last planned micro-batch is committed, and its source offset covers
  everything there is:

  - events (``fact.events``): every file in the events folder (no subfolder; the names Spark
    skips skipped: :func:`cdc_lake.sources.landing_history.spark_skips`) is in the file
    source's log at or below that batch's ``logOffset``;
  - a change feed (``fact.change_feed``): the fact table's latest version is the batch's end
    version (the change-feed source then plans no batch either:
    :meth:`cdc_lake.sources.cdf_datasource.ChangeFeedStreamReader.latestOffset`);
* no re-join pass interrupted, and none due (:func:`cdc_lake.enrich.rejoin.due`: a dimension
  changed while facts are parked or enriched with unknown members, or parked facts waited
  ``late_members.wait``): such a run has work without a new fact.

Any doubt (a log it does not read, a file system other than the local one, a table delta-rs
cannot read, an offset of another shape) answers False, and the run goes through Spark as
before.

Example::

    if nothing_to_do(cfg, DeltaRsEngine(None), run_started):  # no SparkSession needed
        ...  # the run's summary, all counts 0
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from cdc_lake.engines import Engine
from cdc_lake.enrich.config import EnrichConfig

__all__ = ["nothing_to_do"]


def nothing_to_do(cfg: EnrichConfig, engine: Engine, run_started: datetime) -> bool:
    """True only when this run would read no fact and run no re-join pass (module doc)."""
    if ":" in cfg.fact.label:
        return False
    try:
        offset = _committed_offset(cfg)
        if offset is None:
            return False
        covered = _folder_taken(cfg, offset) if cfg.fact.kind == "events" else \
            _feed_read(cfg, offset)
        return covered and _no_pass(cfg, engine, run_started)
    except Exception:  # noqa: BLE001 - a doubt is a "no": Spark decides
        return False


def _committed_offset(cfg: EnrichConfig) -> dict[str, Any] | None:
    """The source offset of the last planned batch when it is committed (and no reprocess is
    unfinished); None otherwise."""
    from cdc_lake.checkpoint_log import last_committed_batch, last_offset_batch, read_offsets
    from cdc_lake.enrich.reprocess import REPROCESS_MARK

    cp = cfg.checkpoint_path
    if (cp / REPROCESS_MARK).exists():
        return None
    last = last_offset_batch(cp)
    if last is None or last_committed_batch(cp) != last:
        return None  # no batch yet, or the last planned one is not committed
    entry = read_offsets(cp, last)
    src = entry.sources[0] if len(entry.sources) == 1 else None
    return src if isinstance(src, dict) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _folder_taken(cfg: EnrichConfig, offset: dict[str, Any]) -> bool:
    from cdc_lake.sources.landing_history import spark_skips, taken_files

    log_offset = _int(offset.get("logOffset"))
    taken = None if log_offset is None else taken_files(cfg.checkpoint_path, log_offset)
    if taken is None:
        return False
    folder = os.path.normpath(os.path.abspath(cfg.fact.label))
    for e in os.scandir(folder):
        if spark_skips(e.name):
            continue
        if not e.is_file() or os.path.join(folder, e.name) not in taken:
            return False  # a file not taken yet, or a folder (Spark reads partition folders)
    return True


def _feed_read(cfg: EnrichConfig, offset: dict[str, Any]) -> bool:
    from deltalake import DeltaTable

    version = _int(offset.get("version"))
    return version is not None and DeltaTable(cfg.fact.label).version() == version


def _no_pass(cfg: EnrichConfig, engine: Engine, run_started: datetime) -> bool:
    from cdc_lake.checkpoint import read_instance_id
    from cdc_lake.enrich import rejoin

    instance = read_instance_id(cfg.checkpoint_path)
    if instance is None:
        return False
    return rejoin.interrupted(cfg, engine, instance) is None and \
        rejoin.due(cfg, engine, run_started) is None
