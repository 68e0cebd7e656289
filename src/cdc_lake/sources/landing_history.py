"""The landing folder's history, read without Spark: which names Spark's file source lists,
which files its log says it took, and where those files are now (in the folder, compressed in
place, or moved by ``cleanSource=archive``); moving archived files back for a rebuild.

The CDC job's no-op check and backlog (:mod:`cdc_lake.cdc.backlog`), the enrichment job's
(:mod:`cdc_lake.enrich.fast_path`) and both kinds' rebuild checks read the file source's log
through these helpers; the log's format itself is read in :mod:`cdc_lake.checkpoint_log`.

Example::

    taken = taken_files(cfg.checkpoint_path, log_offset)   # {"/data/landing/f1.json", ...}
    new = [e.name for e in os.scandir(landing) if not spark_skips(e.name)
           and os.path.join(landing, e.name) not in taken]
    archived("/arc", "/land/f.json")                       # "/arc/land/f.json"
"""

from __future__ import annotations

import errno
import fnmatch
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from cdc_lake.checkpoint_log import PipelineStateError, read_source_entries, source_log_files

__all__ = ["CODEC_SUFFIXES", "archived", "archived_files", "check_restorable", "history_pattern",
           "local_entries", "local_path", "present", "restore_archived", "spark_skips",
           "taken_files", "taken_files_gone"]

# Spark reads a file by its codec suffix: `gzip f.json` in place leaves f.json.gz, a new file the
# stream takes (when the glob lets it), so f.json's lines are not lost.
CODEC_SUFFIXES = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst")


def present(path: str, glob: str | None) -> bool:
    """The file is there, or compressed in place under a name the source reads."""
    return os.path.exists(path) or any(
        os.path.exists(path + ext) and (glob is None or fnmatch.fnmatchcase(
            os.path.basename(path + ext), glob)) for ext in CODEC_SUFFIXES)


def spark_skips(name: str) -> bool:
    """Names Spark's file index never reads (``InMemoryFileIndex.shouldFilterOutPathName``):
    ``.x``, ``_x`` (but not a partition folder ``_x=1``) and ``x._COPYING_``."""
    return name.startswith(".") or (name.startswith("_") and "=" not in name) \
        or name.endswith("._COPYING_")


# Per file-source log file (by path, size and modification time: Spark writes each file once,
# by rename): its entries as (local path or None for another file system, recorded time in ms).
# A run reads the log several times before Spark starts (nothing new? a taken file changed? the
# backlog), and the compact file lists every file ever taken: 0.12 s per read at 15,000 files.
_LOCAL: dict[tuple[str, int, int], list[tuple[str | None, int | None]]] = {}


def local_entries(log: Path) -> list[tuple[str | None, int | None]]:
    """``(local path, or None for a file of another file system; modification time in ms when it
    was taken)`` of each entry of one file-source log file."""
    st = log.stat()
    key = (str(log), st.st_size, st.st_mtime_ns)
    hit = _LOCAL.get(key)
    if hit is None:
        hit = [(local_path(uri), ts) for uri, ts in read_source_entries(log)]
        if len(_LOCAL) >= 64:
            _LOCAL.clear()
        _LOCAL[key] = hit
    return hit


def taken_files(checkpoint: Path, log_offset: int) -> set[str] | None:
    """The local paths of the files the file source took in its log entries up to
    ``log_offset`` (a batch's ``logOffset`` in ``offsets/N``); None when one of them is a file of
    another file system (not mirrored here).

    Example::

        taken = taken_files(cfg.checkpoint_path, 7)   # {"/data/landing/f1.json", ...}
    """
    seen: set[str] = set()
    for log_id, log in source_log_files(checkpoint, 0):
        if log_id > log_offset:
            continue  # a compact file N lists every entry up to N
        entries = local_entries(log)
        if any(local is None for local, _ in entries):
            return None
        seen.update(local for local, _ in entries)  # type: ignore[misc]
    return seen


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
        for path, _ts in local_entries(log):
            if path is None:
                return None
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


def local_path(uri: str) -> str | None:
    """The local path of a file-source log URI, None for another file system."""
    u = urlsplit(uri)
    if u.scheme not in ("", "file") or u.netloc not in ("", "localhost"):
        return None
    return os.path.normpath(unquote(u.path))
