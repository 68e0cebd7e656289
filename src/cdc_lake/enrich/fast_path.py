"""A scheduled run of an events enrichment pipeline with nothing to do skips Spark.

Most runs of a pipeline scheduled every few minutes find no new event file. Such a run started
a Spark session, checked the tables' schemas with it, started and stopped the stream: 5.6–6.0 s
of spark-submit wall on the 2-core machine (2026-12-01), for a summary of zeros. As the CDC
job's :func:`cdc_lake.cdc.backlog.nothing_new`, :func:`nothing_to_do` answers True only when it
is sure that Spark would do nothing:

* an events pipeline (``fact.events``) on the ``deltalake`` engine, not ``--reprocess``, no
  unfinished ``--reprocess`` (its mark);
* the checkpoint's last planned micro-batch is committed, and every file in the events folder
  (no subfolder; names starting with ``.`` or ``_`` skipped, as Spark does) is in the file
  source's log at or below that batch's offset;
* no re-join pass interrupted, and none due (:func:`cdc_lake.enrich.rejoin.due`: a dimension
  changed while facts are parked or enriched with unknown members, or parked facts waited
  ``late_members.wait``): such a run has work without a new fact.

Any doubt (a log it does not read, a file system other than the local one, a table delta-rs
cannot read) answers False, and the run goes through Spark as before.

Example::

    if nothing_to_do(cfg, DeltaRsEngine(None), run_started):  # no SparkSession needed
        ...  # the run's summary, all counts 0
"""

from __future__ import annotations

import os
from datetime import datetime
from urllib.parse import unquote, urlsplit

from cdc_lake.engines import Engine
from cdc_lake.enrich.config import EnrichConfig

__all__ = ["nothing_to_do"]


def nothing_to_do(cfg: EnrichConfig, engine: Engine, run_started: datetime) -> bool:
    """True only when this run would read no event and run no re-join pass (module doc)."""
    ev = cfg.fact.events
    if ev is None or cfg.engine != "deltalake" or ":" in str(ev.path):
        return False
    try:
        return _folder_taken(cfg) and _no_pass(cfg, engine, run_started)
    except Exception:  # noqa: BLE001 - a doubt is a "no": Spark decides
        return False


def _folder_taken(cfg: EnrichConfig) -> bool:
    from cdc_lake.checkpoint_log import (last_committed_batch, last_offset_batch, read_offsets,
                                          read_source_log_batches, source_log_files)
    from cdc_lake.enrich.reprocess import REPROCESS_MARK

    cp = cfg.checkpoint_path
    if (cp / REPROCESS_MARK).exists():
        return False
    last = last_offset_batch(cp)
    if last is None or last_committed_batch(cp) != last:
        return False  # no batch yet, or the last planned one is not committed
    entry = read_offsets(cp, last)
    src = entry.sources[0] if len(entry.sources) == 1 else None
    log_offset = src.get("logOffset") if isinstance(src, dict) else None
    if not isinstance(log_offset, int) or isinstance(log_offset, bool):
        return False
    taken: set[str] = set()
    for log_id, path in source_log_files(cp, 0):
        if log_id > log_offset:
            continue
        for uri, batch in read_source_log_batches(path):
            u = urlsplit(uri)
            if u.scheme != "file" or u.netloc not in ("", "localhost") or batch is None:
                return False
            if batch <= log_offset:
                taken.add(os.path.normpath(unquote(u.path)))
    folder = os.path.normpath(os.path.abspath(cfg.fact.events.path))  # type: ignore[union-attr]
    for e in os.scandir(folder):
        if e.name.startswith((".", "_")):
            continue  # Spark's file source skips such names
        if e.is_dir() or os.path.join(folder, e.name) not in taken:
            return False  # a file not taken yet, or a subfolder (Spark reads partition folders)
    return True


def _no_pass(cfg: EnrichConfig, engine: Engine, run_started: datetime) -> bool:
    from cdc_lake.checkpoint import read_instance_id
    from cdc_lake.enrich import rejoin

    instance = read_instance_id(cfg.checkpoint_path)
    if instance is None:
        return False
    return rejoin.interrupted(cfg, engine, instance) is None and \
        rejoin.due(cfg, engine, run_started) is None
