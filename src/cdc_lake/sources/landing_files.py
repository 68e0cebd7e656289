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

import errno
import fnmatch
import os
import shlex
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote, urlsplit

from cdc_lake.checkpoint_log import (PipelineStateError, batch_source_entries, read_source_entries,
                                     source_log_files)

__all__ = ["CODEC_SUFFIXES", "LandedFileMissing", "TASK_BYTES", "archived", "archived_files",
           "check_restorable", "restore_archived", "taken_files_gone",
           "check_batch_files_present", "existing", "explain_read_failure", "history_pattern",
           "LISTING_THRESHOLD", "driver_listing_conf", "present", "read_partitions",
           "rerun_command"]

# Spark reads a file by its codec suffix: `gzip f.json` in place leaves f.json.gz, a new file the
# stream takes (when the glob lets it), so f.json's lines are not lost.
CODEC_SUFFIXES = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst")


def present(path: str, glob: str | None) -> bool:
    """The file is there, or compressed in place under a name the source reads."""
    return os.path.exists(path) or any(
        os.path.exists(path + ext) and (glob is None or fnmatch.fnmatchcase(
            os.path.basename(path + ext), glob)) for ext in CODEC_SUFFIXES)


def archived(archive: str | os.PathLike[str], path: str | os.PathLike[str]) -> str:
    """Where Spark's ``cleanSource=archive`` moves a processed file: the archive folder plus the
    file's own absolute path (``archived("/arc", "/land/f.json")`` -> ``/arc/land/f.json``)."""
    return os.path.join(os.fspath(archive), os.fspath(path).lstrip("/"))


def history_pattern(landing: str | os.PathLike[str], archive: str | os.PathLike[str] | None) -> str:
    """The path a full refresh reads: the landing folder, or with an archive one Hadoop pattern
    over it and its archived copy, ``/{land,arc/land}`` (absolute local paths without ','; the
    braces must follow the root, since Spark qualifies a path before globbing it)."""
    if archive is None:
        return os.fspath(landing)
    return "/{" + os.fspath(landing).lstrip("/") + "," + archived(archive, landing).lstrip("/") + "}"


def archived_files(landing: Path, archive: Path) -> list[tuple[Path, Path]]:
    """Every file Spark's ``cleanSource=archive`` moved out of ``landing`` into ``archive``, as
    ``(archived copy, its place in the landing folder)``, in path order."""
    root = Path(archived(archive, landing))
    out = []
    for dirpath, _dirs, names in os.walk(root):  # nothing when the archive holds none yet
        for n in names:
            src = Path(dirpath) / n
            out.append((src, Path(landing) / src.relative_to(root)))
    return sorted(out)


def taken_files_gone(checkpoint: Path, archive: Path | None) -> list[str] | None:
    """The local files the file source has taken (every entry of ``<checkpoint>/sources/0``)
    that are neither where they were nor, with ``archive``, where Spark archives them (nor
    compressed in place), in path order: what a rebuild from the folder would lack. None when
    the log names a file of another file system (not checked)."""
    gone: set[str] = set()
    for _log_id, log in source_log_files(checkpoint, 0):
        for uri, _ts in read_source_entries(log):
            u = urlsplit(uri)
            if u.scheme != "file" or u.netloc not in ("", "localhost"):
                return None
            path = os.path.normpath(unquote(u.path))
            if not present(path, None) and (archive is None or not present(archived(archive, path), None)):
                gone.add(path)
    return sorted(gone)


def check_restorable(landing: Path, archive: Path, *, pipeline: str,
                     key: str) -> list[tuple[Path, Path]]:
    """The moves :func:`restore_archived` would make (:func:`archived_files`).

    Raises:
        PipelineStateError: a landing file has the name of an archived one (exit 3): which of
            the two is the event file to keep is the user's decision, not the job's.
    """
    moves = archived_files(landing, archive)
    clash = [(a, b) for a, b in moves if os.path.lexists(b)]
    if clash:
        shown = "; ".join(f"{b} and its archived copy {a}" for a, b in clash[:3])
        raise PipelineStateError(
            f"pipeline {pipeline}: {len(clash)} landing file(s) have the name of a file the stream "
            f"archived ({key}): {shown}{' ...' if len(clash) > 3 else ''}. The rebuild moves "
            "archived files back into the landing folder to read them again and will not "
            "overwrite one: keep one of each pair (rename or remove the other), then run it "
            "again. Nothing was moved or reset.")
    return moves


def restore_archived(landing: Path, archive: Path, *, pipeline: str, key: str) -> int:
    """Move every archived file back to its place in the landing folder (a rename: same name,
    same modification time, so a stream started from scratch reads it as it did the first
    time); the number moved. An events pipeline's ``--reprocess`` calls it before it resets the
    checkpoint: the new stream lists the landing folder only and would miss what the archive
    holds. A rerun after an interruption moves what is left. Raises as
    :func:`check_restorable`, before moving anything."""
    moves = check_restorable(landing, archive, pipeline=pipeline, key=key)
    for done, (a, b) in enumerate(moves):
        try:
            b.parent.mkdir(parents=True, exist_ok=True)
            os.rename(a, b)  # atomic per file; keeps the name and the modification time
        except OSError as e:
            cross = e.errno == errno.EXDEV
            raise PipelineStateError(
                f"pipeline {pipeline}: could not move the archived file {a} back to {b} "
                f"({e.strerror or e}); {done} of {len(moves)} moved"
                + (f". {key} is on another file system than the landing folder: Spark cannot "
                   "archive there either (it leaves the files in place with a WARN); move the "
                   "archive's files back by hand, keeping their times (`mv`, `cp -p`), and give "
                   f"{key} a folder on the landing folder's file system" if cross else
                   ". Fix the cause (the folder's permissions, a file where a folder belongs)")
                + ", then run it again: it moves what is left.") from None
    return len(moves)


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
        path = _local(uri)
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
    if not uris or any(_local(u) is None for u in uris):
        return {}
    return {LISTING_THRESHOLD: str(2**31 - 1)}


def _local(uri: str) -> str | None:
    """The local path of a file-source log URI, None for another file system."""
    u = urlsplit(uri)
    if u.scheme not in ("", "file") or u.netloc not in ("", "localhost"):
        return None
    return os.path.normpath(unquote(u.path))


def existing(uris: list[str]) -> list[str]:
    """The URIs whose local file exists now (URIs of other file systems are kept): a batch's
    second read of its files skips one compressed in place, as the stream's own read did."""
    return [u for u in uris if (p := _local(u)) is None or os.path.exists(p)]


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
        path = _local(uri)
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
