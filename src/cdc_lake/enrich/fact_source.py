"""The enrichment job's fact source as a streaming DataFrame.

* ``change_feed``: the Delta change feed (:mod:`cdc_lake.sources.change_feed`), from the version
  a ``--reprocess`` snapshot left in ``<checkpoint>/enrich_start.json`` (:func:`start_version`);
* ``events``: an append-only JSON-lines folder, read as text and parsed into
  ``fact.events.schema`` as Spark's JSON reader does, with its corrupt-record column
  (:data:`~cdc_lake.enrich.columns.CORRUPT`: a malformed line, or one naming a column twice or
  in another case, keeps its text for the quarantine), the event time and the decimal, date and timestamp columns read as
  sent and typed by the job (:mod:`cdc_lake.enrich.event_values`), and deduplicated by the
  event id within the watermark, every event without an id kept apart (:func:`_dedupe_events`).
  With ``fact.events.archive_dir`` Spark moves the files of each committed batch there
  (``cleanSource=archive``, when it plans the next batch: the last batch's files wait for the
  next run), so the folder listed on every run holds only what is new.

Example::

    df = fact_stream(spark, cfg, engine, recovery="spark-submit spark_jobs/enrich.py ... --reprocess")
    df.writeStream.foreachBatch(...)
"""

from __future__ import annotations

import re
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_lake.config import FILE_SOURCE_MAX_AGE
from cdc_lake.engines import Engine
from cdc_lake.enrich.columns import CORRUPT, SOURCE_FILE
from cdc_lake.enrich.config import EnrichConfig
from cdc_lake.enrich.event_values import parse_lines, with_checked_values

START_FILE = "enrich_start.json"


def start_version(cfg: EnrichConfig) -> int | None:
    """The change-feed version a --reprocess run left for the stream to start at (None: from
    the table's first version)."""
    from cdc_lake.checkpoint import read_state_file
    from cdc_lake.paths import q

    p = cfg.checkpoint_path / START_FILE
    data = read_state_file(  # damaged: exit 3 naming it (was a bare JSONDecodeError, exit 1)
        p, "the change-feed version a --reprocess snapshot left for the stream to start after",
        f"run the rebuild again: `spark-submit spark_jobs/enrich.py --pipeline {q(cfg.file)} --reprocess`",
        lambda d: isinstance(d.get("starting_version"), int) and not isinstance(d["starting_version"], bool))
    return None if data is None else int(data["starting_version"])


def _hadoop_path(uri: str) -> str:
    """A file URI of Spark's file-source log as a path ``spark.read`` takes literally: decoded
    (the log holds ``%20`` for a space) and with glob characters escaped."""
    from urllib.parse import unquote, urlsplit

    u = urlsplit(uri)
    path = re.sub(r"([\\\[\]{}*?])", r"\\\1", unquote(u.path))
    return f"{u.scheme}://{u.netloc}{path}" if u.scheme else path


def dropped_late_events(spark: SparkSession, cfg: EnrichConfig,
                        batch_id: int) -> tuple[DataFrame, int] | None:
    """The rows of micro-batch ``batch_id`` that Spark's dedup dropped as late before the batch
    reached the job, and the watermark it dropped them by; None when it dropped none for sure.

    ``dropDuplicatesWithinWatermark`` drops a row whose event time is at or before the
    watermark it uses for late events (the watermark of the batch before:
    :func:`~cdc_lake.checkpoint_log.late_events_watermark_ms`) and that takes part in the dedup
    (an id, not a corrupt line: :func:`_dedupe_events` keeps the others apart). They are read
    again from the batch's own files (its entries of ``<checkpoint>/sources/0``), parsed as the
    stream parses them, so the job can quarantine them: nothing is lost silently. A replay of
    the batch reads the same files with the same watermark. No read on a batch without such a
    watermark (the first one) or without files."""
    from cdc_lake.checkpoint_log import CheckpointDamaged, batch_source_files, late_events_watermark_ms

    ev = cfg.fact.events
    assert ev is not None
    cp = cfg.checkpoint_path
    try:
        wm = late_events_watermark_ms(cp, batch_id)
        files = batch_source_files(cp, batch_id) if wm > 0 else None
    except ValueError as e:
        from cdc_lake.enrich.state import recovery_command

        raise CheckpointDamaged(cp, f"not readable for the files of micro-batch {batch_id} ({e})",
                                recovery_command(cfg)) from None
    if not files:
        return None
    from cdc_lake.sources.landing_files import (check_batch_files_present, existing,
                                                read_partitions, rerun_command)

    # a file gone since the batch was planned: exit 3 naming it, before this read fails on it
    # (tester: PATH_NOT_FOUND, exit 1); one compressed in place is read later as a new file
    check_batch_files_present(cp, batch_id, pipeline=cfg.name, glob=None,
                              rerun=rerun_command("enrich.py", cfg.file))
    files = existing(files)
    if not files:
        return None
    # (``spark`` is the stream's session: it lists local files on the driver, enrich.job)
    lines = spark.read.text([_hadoop_path(u) for u in files])
    parts = read_partitions(cp, batch_id, spark.sparkContext.defaultParallelism)
    lines = (lines.coalesce(parts) if parts else lines).select(
        "value", F.col("_metadata.file_path").alias(SOURCE_FILE))
    df = with_checked_values(parse_lines(lines, ev), ev)
    late = (F.col(f"`{ev.id}`").isNotNull() & F.col(f"`{CORRUPT}`").isNull()
            & (F.col(f"`{ev.time}`") <= F.timestamp_millis(F.lit(wm))))
    return df.where(late), wm


def check_events_complete(cfg: EnrichConfig) -> None:
    """Before ``--reprocess`` resets anything: every event file the stream has taken is still in
    the events folder, or in ``fact.events.archive_dir`` where Spark archived it (the reset
    moves those back). A rebuild without one would lack its events with exit 0 (a file deleted
    or moved by hand, an archive folder changed or unset in the YAML). Raises
    :class:`PipelineStateError` (exit 3) naming them; nothing reset. Local folders only."""
    from cdc_lake.checkpoint_log import PipelineStateError
    from cdc_lake.enrich.state import recovery_command
    from cdc_lake.paths import mv_aside
    from cdc_lake.sources.landing_history import archived, taken_files_gone

    ev = cfg.fact.events
    if ev is None:
        return
    try:
        gone = taken_files_gone(cfg.checkpoint_path, ev.archive_dir)
    except (OSError, ValueError):
        return  # a damaged log: --reprocess deletes the checkpoint anyway (nothing to compare)
    if not gone:
        return
    shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
    arc = ev.archive_dir
    raise PipelineStateError(
        f"pipeline {cfg.name}: --reprocess rebuilds from the events folder {ev.path}"
        + (f" (and its archive {archived(arc, ev.path)}, moved back first)" if arc is not None else "")
        + f", but {len(gone)} event file(s) the stream has read are not there any more ({shown}; "
        "moved, deleted, or archived into another folder than fact.events.archive_dir names now): "
        "the rebuilt tables would lack their events, so nothing was reset. Recovery: put them "
        "back under their names, keeping their modification times (`mv`, `cp -p`, `rsync -t`), "
        f"and run `{recovery_command(cfg)}` again. To rebuild without them on purpose (their "
        "events are lost from the rebuilt tables for good), move the checkpoint aside first "
        f"(`{mv_aside(cfg.checkpoint_path, '.before-reprocess')}`)")


def prefetch_source(spark: SparkSession, cfg: EnrichConfig) -> Callable[[], None]:
    """Start what the fact source needs before it can be read and return its join: for a
    delta-rs change feed, registering its Python data source (Spark looks up the static Python
    data sources in a Python process first, about 1 s; 2026-11-28). Nothing for events."""
    if cfg.fact.kind != "change_feed" or cfg.engine == "delta-spark":
        return lambda: None
    from cdc_lake.sources.change_feed import register_in_background

    return register_in_background(spark)


def fact_stream(spark: SparkSession, cfg: EnrichConfig, engine: Engine, recovery: str) -> DataFrame:
    """The fact source as a streaming DataFrame (change feed rows, or deduplicated events)."""
    f = cfg.fact
    if f.kind == "events":
        ev = f.events
        assert ev is not None
        # text, parsed by the job: it sees each line's field names (event_values.parse_lines)
        reader = (spark.readStream.option("maxFilesPerTrigger", str(ev.max_files_per_trigger))
                  .option("maxFileAge", FILE_SOURCE_MAX_AGE))
        if ev.archive_dir is not None:  # committed batches' files move out of the listed folder
            reader = (reader.option("cleanSource", "archive")
                      .option("sourceArchiveDir", str(ev.archive_dir)))
        lines = (reader.text(str(ev.path))
                 .select("value", F.col("_metadata.file_path").alias(SOURCE_FILE)))  # quarantine
        df = with_checked_values(parse_lines(lines, ev), ev)
        return _dedupe_events(df, ev.id, ev.time, ev.watermark, ev.schema.get(ev.id, ""))
    from cdc_lake.sources.change_feed import read_change_feed

    start = start_version(cfg)
    return read_change_feed(spark, str(f.change_feed), engine=engine.name,
                            max_versions_per_trigger=f.max_versions_per_trigger,
                            max_rows_per_trigger=f.max_rows_per_trigger, starting_version=start,
                            recovery=recovery)


_NULL_ID = "\u0000cdc-lake:no-id:"  # no real event id starts with a NUL character
_TIME_KEPT = "__event_time_kept"
_NO_ID = "__no_id"


def _dedupe_events(df: DataFrame, id_col: str, time_col: str, watermark: str,
                   id_type: str) -> DataFrame:
    """Spark's streaming dedup by the event id, with every row that has no usable id — a null
    id, or a line Spark could not read into the schema (its id may be parsed from a broken
    line) — kept apart as one of its own: the dedup took all null ids for one (one row came
    through, the others were lost), recorded the id of a broken line so that the correct line
    after it was dropped as its duplicate, and dropped a late row before the job's own late
    check (testers). Such rows reach the batch, where they are quarantined.

    A ``string`` or ``bigint`` id column: such a row gets a stand-in id (a NUL-prefixed UUID; a
    random 64-bit number) and no event time for the dedup (never late; its state entry expires
    at once), all restored after it; one scan of the files, and the query keeps its one source,
    so checkpoints written before go on. Another id type: such rows bypass the dedup (a union:
    a second scan of each batch's files, and a second source, so a checkpoint written before
    this version does not start: Spark's "1 sources in the checkpoint offsets and now 2";
    ``--reprocess``)."""
    idc, tc = F.col(f"`{id_col}`"), F.col(f"`{time_col}`")
    apart = idc.isNull() | F.col(f"`{CORRUPT}`").isNotNull()
    kind = id_type.strip().lower()
    if kind in ("string", "bigint", "long"):
        stand_in = (F.concat(F.lit(_NULL_ID), F.expr("uuid()")) if kind == "string"
                    else F.xxhash64(F.expr("uuid()")))
        marked = (df.withColumn(_NO_ID, apart).withColumn(_TIME_KEPT, tc)
                  .withColumn(time_col, F.when(apart, F.lit(None)).otherwise(tc))
                  .withColumn(id_col, F.when(apart, stand_in).otherwise(idc)))
        out = marked.withWatermark(time_col, watermark).dropDuplicatesWithinWatermark([id_col])
        return (out.withColumn(time_col, F.col(_TIME_KEPT))
                .withColumn(id_col, F.when(F.col(_NO_ID), F.lit(None)).otherwise(idc))
                .drop(_TIME_KEPT, _NO_ID))
    keyed = (df.where(~apart).withWatermark(time_col, watermark)
             .dropDuplicatesWithinWatermark([id_col]))
    return keyed.unionByName(df.where(apart))
