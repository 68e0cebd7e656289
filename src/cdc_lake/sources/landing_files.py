"""Files a file-source micro-batch took: still there once the batch has read them?

Spark's file source plans a micro-batch from its listing of the folder and records the batch's
files in ``<checkpoint>/sources/0`` before the batch runs. A file moved, renamed or deleted
between that listing and the read is skipped with a Spark WARN only ("The directory ... was not
found"), and the batch commits as if it had read it: its events were never applied and the file
is never offered again (tester: a landing file moved away during a run, exit 0, 30 changes lost
for good). Both job kinds that read landing files call :func:`check_batch_files_present` after
the batch's first read and before any write; the batch then fails, uncommitted, and replays
with the same files once they are back.

Example::

    check_batch_files_present(cfg.checkpoint_path, batch_id, pipeline=cfg.name,
                              glob=cfg.file_glob, rerun="spark-submit spark_jobs/cdc_ingest.py ...")
"""

from __future__ import annotations

import os
import shlex
from datetime import datetime, timezone
from pathlib import Path

from cdc_lake.checkpoint_log import PipelineStateError, batch_source_entries
from cdc_lake.sources.landing_history import local_path, present

__all__ = ["LandedFileMissing", "TASK_BYTES", "check_batch_files_present", "existing",
           "explain_read_failure", "LISTING_THRESHOLD", "driver_listing_conf", "read_partitions",
           "rerun_command"]

# What one read task of a micro-batch is worth: a batch of many small files is read (and kept, and
# worked on) in one partition per TASK_BYTES of its files, at least one per core.
TASK_BYTES = 32 << 20


def read_partitions(checkpoint: Path, batch_id: int, parallelism: int,
                    task_bytes: int = TASK_BYTES) -> int | None:
    """How many partitions micro-batch ``batch_id``'s files are worth reading in: one per
    ``task_bytes`` of them, at least ``parallelism``. None when that is not known (a file not
    local, the log unreadable): the caller then leaves the batch as Spark planned it.

    Spark's file source counts each file as at least ``spark.sql.files.openCostInBytes``
    (4 MiB) when it packs files into read tasks, so 1,000 one-line files make about 32 tasks,
    and every later stage over the batch's rows runs as many. Coalescing to this number
    (``batch.coalesce(n)``: never more partitions than planned, no shuffle) keeps large batches
    as planned (200 files of 1.6 MB: 9 tasks planned, 11 allowed) and reads many small ones in
    one task per core.

    Example::

        n = read_partitions(cfg.checkpoint_path, batch_id, spark.sparkContext.defaultParallelism)
        batch = batch.coalesce(n) if n else batch
    """
    try:
        entries = batch_source_entries(checkpoint, batch_id)
    except (OSError, ValueError):
        return None
    if not entries:
        return None
    total = 0
    for uri, _ in entries:
        path = local_path(uri)
        if path is None:
            return None
        try:
            total += os.stat(path).st_size
        except OSError:  # gone: check_batch_files_present names it after the read
            continue
    return max(parallelism, -(-total // task_bytes))


LISTING_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"


def driver_listing_conf(uris: list[str]) -> dict[str, str]:
    """Session settings under which Spark lists these files (or folders) on the driver: all
    local ones; none ({}) when any is on another file system.

    Given more than 32 paths, Spark lists them with a Spark job of one task per path
    (``parallelPartitionDiscovery``, meant for remote stores). A file stream does so for every
    micro-batch (its batch's files are paths of their own: ``getBatch`` 3.5 s for 1,000
    one-line files, 2026-12-01), and so does a read of a batch's files; on the driver it is a
    ``stat`` per file. A streaming query takes the setting at start, a read when
    ``spark.read...`` returns::

        with session_settings(spark, driver_listing_conf([str(cfg.landing_path)])):
            query = writer.start()
    """
    if not uris or any(local_path(u) is None for u in uris):
        return {}
    return {LISTING_THRESHOLD: str(2**31 - 1)}




def existing(uris: list[str]) -> list[str]:
    """The URIs whose local file exists now (URIs of other file systems are kept): a batch's
    second read of its files skips one compressed in place, as the stream's own read did."""
    return [u for u in uris if (p := local_path(u)) is None or os.path.exists(p)]


def rerun_command(job: str, pipeline_file: object) -> str:
    """``spark-submit spark_jobs/<job> --pipeline <yaml>``, quoted for a shell."""
    return f"spark-submit spark_jobs/{job} --pipeline {shlex.quote(str(pipeline_file))}"


class LandedFileMissing(PipelineStateError):
    """A file of the running micro-batch was gone when the batch read its files."""

    def __init__(self, pipeline: str, batch_id: int, gone: list[tuple[str, int | None]],
                 rerun: str) -> None:
        self.files = [p for p, _ in gone]
        shown = ", ".join(p for p, _ in gone[:5]) + (
            f" and {len(gone) - 5} more" if len(gone) > 5 else "")

        def when(ms: int) -> str:
            return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")

        timed = [(p, ms) for p, ms in gone if ms is not None]
        back = " && ".join(f"touch -m -d @{ms / 1000:.3f} {shlex.quote(p)}" for p, ms in timed)
        empty = " && ".join(f": > {shlex.quote(p)}" for p, _ in gone) + (f" && {back}" if back else "")
        times = "; ".join(f"{p} was modified at {when(ms)}" for p, ms in timed[:3])
        super().__init__(
            f"pipeline {pipeline!r}: micro-batch {batch_id} took {len(gone)} landing file(s) that "
            f"were gone when it read them: {shown} (moved, renamed, archived or deleted after "
            "the run listed the folder). Spark's file source would have recorded them as read "
            "without reading them and never offered them again, so the batch stopped before "
            "writing and was not committed. Recovery: put each file back at that path with "
            "its content and modification time (`mv` back, or `cp -p`"
            + (f"; a copy with a new time: `{back}`" if back else "") + f") and run again: "
            f"`{rerun}`; the batch is read again with them. To go on without a file on purpose "
            "(its changes will not be in the lake), put an empty file there with its old time: "
            f"`{empty}`" + (f" ({times})" if times else ""))


def check_batch_files_present(checkpoint: Path, batch_id: int, *, pipeline: str,
                              glob: str | None, rerun: str) -> None:
    """Raise :class:`LandedFileMissing` when a local file micro-batch ``batch_id`` took (its
    entries in ``<checkpoint>/sources/0``) is gone now. Call it after the batch's files have
    been read (its first Spark job over every row) and before it writes: a file there now was
    there when read. Non-local URIs and a log this module cannot read: no check (the stream
    itself reads that log and reports it)."""
    try:
        entries = batch_source_entries(checkpoint, batch_id)
    except (OSError, ValueError):
        return
    gone: list[tuple[str, int | None]] = []
    for uri, ms in entries or []:
        path = local_path(uri)
        if path is not None and not present(path, glob):
            gone.append((path, ms))
    if gone:
        raise LandedFileMissing(pipeline, batch_id, gone, rerun)


# Spark's words for a file that was listed but is gone when a task opens it
_MISSING_FILE = ("FILE_NOT_EXIST", "PATH_NOT_FOUND", "FileNotFoundException")


def explain_read_failure(error: BaseException, checkpoint: Path, batch_id: int, *, pipeline: str,
                         glob: str | None, rerun: str) -> None:
    """After a batch failed: raise :class:`LandedFileMissing` when Spark failed on a file that
    is gone (deleted after the batch was planned, before a task opened it: the tester's exit 1
    without the file named); return otherwise, for the caller to re-raise ``error`` (also when
    the file was only compressed in place: the retry reads the batch without it, then the
    compressed file as a new one)."""
    if any(m in str(error) for m in _MISSING_FILE):
        check_batch_files_present(checkpoint, batch_id, pipeline=pipeline, glob=glob, rerun=rerun)
