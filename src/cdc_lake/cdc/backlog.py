"""What the next run's file source will pick up, read without Spark: the no-op check and the
backlog size.

Spark's file source lists the landing folder and takes every file its metadata log
(``<checkpoint>/sources/0``) does not hold yet. Both functions here mirror that listing on the
driver (or the Airflow worker) before any JVM starts:

* :func:`nothing_new` lets a scheduled run with nothing to do skip Spark entirely;
* :func:`backlog` sizes the work, so the launcher can pick driver JVM options for it
  (:func:`cdc_lake.launch.launch_conf`: C1-only JIT for short runs, the full JIT for big ones);
* :func:`check_landed_files_unchanged` stops a run when a file the stream already took has been
  modified since (lines appended to it would never be read: the file source takes a file once).

Both answer conservatively: any doubt (a folder in the landing path, a glob ``fnmatch`` cannot
mirror, a URI instead of a local path, an unreadable log) is ``False`` / ``None``.

Example::

    cfg = load_pipeline("pipelines/shop_maxwell.yaml")
    nothing_new(cfg)            # True: the checkpoint covers every landed file
    backlog(cfg)                # Backlog(files=3, bytes=181432): not yet taken by the stream
    backlog(cfg, full_refresh=True).bytes   # a full refresh reads the whole landing history
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
from dataclasses import dataclass

from cdc_lake.cdc.config import PipelineConfig
from cdc_lake.config import ConfigError
from cdc_lake.checkpoint_log import (PipelineStateError, last_committed_batch, last_offset_batch,
                                     read_offsets, source_log_files)
from cdc_lake.paths import mv_aside
from cdc_lake.sources.landing_history import (archived, local_entries, present, spark_skips,
                                             taken_files)

__all__ = ["Backlog", "LandedFileChanged", "LandingFileNames", "backlog", "check_landed_files_unchanged",
           "check_landing_names", "nothing_new"]

_GLOB_SAFE = re.compile(r"[^{}\\^]*")  # fnmatch agrees with Hadoop's glob on these patterns
# State files cdc-lake itself keeps in a landing folder (hidden, so Spark never reads them): the
# binlog capture's resume state and its lock (capture.state: ``.<prefix>-capture-state.json``)
# and the demo generator's state (demo.generator.STATE_FILE). Not named in the hidden-file
# warning: its advice to rename them would break the capture's resume (docs tester).
OWN_STATE_FILES = re.compile(r"\.(?:.+-capture-state\.json(?:\.lock)?|cdc-demo-state\.json)")


@dataclass(frozen=True)
class Backlog:
    """Landed files the stream has not taken yet (``files``) and their total size in bytes."""

    files: int
    bytes: int


def nothing_new(cfg: PipelineConfig) -> bool:
    """True only when the checkpoint provably covers every file Spark's file source would list.

    Conditions: the last offset batch ``offsets/N`` is committed (``commits/N``), and every file in
    the landing folder (non-recursive; hidden ``.``/``_`` names skipped as Spark does;
    ``source.glob`` applied) appears in the file source's metadata log at or below the source
    offset recorded in ``offsets/N``. Local paths only; any doubt (subfolders, unusual glob, an
    unreadable or unexpected log) answers False, and the run goes through Spark as usual.
    """
    try:
        last = last_offset_batch(cfg.checkpoint_path)
        if last is None or last_committed_batch(cfg.checkpoint_path) != last:
            return False  # no batch yet, or the last planned batch is not committed
        pending = _pending(cfg, full_refresh=False)
        return pending is not None and pending.files == 0
    except Exception:  # noqa: BLE001 - a doubt is a "no"
        return False


def backlog(cfg: PipelineConfig, *, full_refresh: bool = False) -> Backlog | None:
    """Files (and bytes) the next run will read: landed files not in the file source's log at or
    below the last *committed* batch (a planned, uncommitted batch is read again), or every
    landed file for a full refresh. ``None`` when it cannot be known for sure (see the module
    docstring)."""
    try:
        return _pending(cfg, full_refresh=full_refresh)
    except Exception:  # noqa: BLE001 - unknown, not zero
        return None


def _pending(cfg: PipelineConfig, *, full_refresh: bool) -> Backlog | None:
    landing, glob = cfg.landing_path, cfg.file_glob
    if any(ch in str(landing) for ch in "*?[]{}\\") or ":" in str(landing):
        return None  # Spark would glob-expand / parse a URI: not a plain local folder
    if glob is not None and not _GLOB_SAFE.fullmatch(glob):
        return None
    seen = set() if full_refresh else _taken(cfg)
    if seen is None:
        return None
    base = os.path.abspath(landing)
    files = size = 0
    folders = [str(landing)]
    if full_refresh and cfg.archive_path is not None:  # the rebuild reads the archive too
        kept = archived(cfg.archive_path, base)
        folders += [kept] if os.path.isdir(kept) else []
    for entry in (e for folder in folders for e in os.scandir(folder)):
        name = entry.name
        if spark_skips(name):
            continue  # what Spark's file index skips (InMemoryFileIndex.shouldFilterOutPathName)
        if not entry.is_file():
            return None  # a folder (Spark lists recursively) or something odd
        if glob is not None and not fnmatch.fnmatchcase(name, glob):
            continue
        if os.path.normpath(os.path.join(base, name)) not in seen:
            files += 1
            size += entry.stat().st_size
    return Backlog(files, size)


class LandingFileNames(ConfigError):
    """Landing files Spark cannot read by their name, or reads wrongly (exit 2: bad input,
    nothing written)."""

    def __init__(self, cfg: PipelineConfig, names: list[str], problem: str | None = None) -> None:
        self.names = names
        shown = ", ".join(repr(n) for n in names[:5]) + (
            f" and {len(names) - 5} more" if len(names) > 5 else "")
        super().__init__(cfg.file, "source.path", (
            f"{len(names)} landing file(s) in {cfg.landing_path} have a ':' in their name: "
            f"{shown}. Hadoop cannot open such a file (URISyntaxException 'Relative path in "
            "absolute URI'), so every run would fail on it; nothing was read or written. Rename "
            "them without ':' (e.g. 2026-11-26T10-00-00 for an ISO time), and name landed "
            "files without ':' from now on, then run again") if problem is None else (
            f"{len(names)} entries in the landing folder {cfg.landing_path}: {shown}: {problem}"))


GLOB_CHARACTERS = "*?[]{}\\"
_GLOBBED = ("Spark's file source takes such a name for a glob pattern when it reads a "
            "micro-batch: every other file of the batch was read once more for each of them "
            "(tester: 20 files, 96 events read), so the run's counts and the quarantine share "
            "were wrong, and a pattern can match another file or none. No table was read or "
            "written. Rename them without * ? [ ] { } \\ (a renamed file is a new file to the "
            "stream: if it was read before, its changes are applied again, which leaves the "
            "tables as they are), name landed files so from now on, then run again")
_PARTITIONED = ("Spark reads a sub-folder named key=value as a partition of the landing "
                "folder; mixed with files at the top level or other sub-folders the stream "
                "breaks (tester: once a top-level file followed partition folders every run "
                "failed with ArrayIndexOutOfBoundsException; with a plain sub-folder too, "
                "CONFLICTING_DIRECTORY_STRUCTURES). "
                "No table was read or written. Land every file at the top level of the folder "
                "(move those files up, under names not used yet), or every file in key=value "
                "folders, then run again")


def check_landing_names(cfg: PipelineConfig) -> None:
    """Before the stream starts: raise :class:`LandingFileNames` (a config error, exit 2) for
    landing files the file source would read whose name holds ``':'`` or a glob character
    (``* ? [ ] { } \\``), and for ``key=value`` sub-folders next to top-level files or other
    sub-folders; print one warning line each naming the files Spark skips as hidden (a name
    starting with ``_`` or ``.``; a file still being written under such a temporary name is
    expected), the sub-folders it does not read, and the files a ``glob:`` leaves out when it
    matches none. Local landing folders whose listing this module mirrors only (see
    :func:`backlog`); otherwise no check.

    Example::

        check_landing_names(cfg)   # LandingFileNames: ... 'orders_2026-11-26T10:00:00.json' ...
    """
    landing, glob = cfg.landing_path, cfg.file_glob
    if any(ch in str(landing) for ch in "*?[]{}\\") or ":" in str(landing) \
            or not os.path.isdir(landing):
        return
    if glob is not None and not _GLOB_SAFE.fullmatch(glob):
        glob = None  # unusual glob: check every visible file
    bad, globbed, hidden, folders, files, left_out = [], [], [], [], 0, []
    for entry in os.scandir(landing):
        name = entry.name
        if spark_skips(name):
            if not name.endswith("._COPYING_") and not OWN_STATE_FILES.fullmatch(name) \
                    and entry.is_file():
                hidden.append(name)
            continue
        if entry.is_dir():
            folders.append(name)
            continue
        if glob is not None and not fnmatch.fnmatchcase(name, glob):
            left_out.append(name)
            continue
        files += 1
        if ":" in name:
            bad.append(name)
        elif any(ch in name for ch in GLOB_CHARACTERS):
            globbed.append(name)
    _warn(landing, sorted(hidden), "are skipped as hidden (Spark's file source ignores names "
          "starting with '_' or '.'; expected for a file still being written under a temporary "
          "name, otherwise rename it)")
    partitions = sorted(f for f in folders if "=" in f)
    if partitions and (files or len(partitions) < len(folders)):
        raise LandingFileNames(cfg, partitions + sorted(f for f in folders if "=" not in f),
                               _PARTITIONED)
    if not partitions:
        _warn(landing, sorted(folders), "are not read, nor the files in them (only files at "
              "the top of the landing folder are; move files to be ingested up)", "sub-folder(s)")
    if glob is not None and not files and left_out:
        _warn(landing, sorted(left_out), f"do not match source.glob {glob!r} of {cfg.file} and "
              "none does: nothing is read (a typo in the glob?)")
    if bad:
        raise LandingFileNames(cfg, sorted(bad))
    if globbed:
        raise LandingFileNames(cfg, sorted(globbed), _GLOBBED)


def _warn(landing: object, names: list[str], what: str, noun: str = "landing file(s)") -> None:
    if names:
        print(f"[cdc] WARNING: {len(names)} {noun} in {landing} {what}: "
              + ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else ""),
              flush=True)


def _log_offset(cfg: PipelineConfig, batch: int, src: object) -> int:
    """The file source's ``logOffset`` in ``offsets/<batch>``; PipelineStateError (exit 3) when
    it holds another source's offset (was a bare KeyError 'logOffset', exit 1: tester)."""
    if not isinstance(src, dict) or isinstance(src.get("logOffset"), bool) \
            or not isinstance(src.get("logOffset"), int):
        from cdc_lake.cdc.state import reset_command

        raise PipelineStateError(
            f"pipeline {cfg.name!r}: {cfg.checkpoint_path / 'offsets' / str(batch)} does not hold the "
            f"file source's offset (logOffset) but {str(src)[:120]}: not written by this pipeline's "
            f"stream (copied from another checkpoint?). Recovery: put the right file back from a "
            f"copy; else {reset_command(cfg)}")
    return int(src["logOffset"])


def _taken(cfg: PipelineConfig) -> set[str] | None:
    """Local paths the file source took in committed batches; None when the log says something
    this module does not understand (more than one source, a non-local URI)."""
    cp = cfg.checkpoint_path
    committed = last_committed_batch(cp)
    if committed is None:
        return set()
    entry = read_offsets(cp, committed)
    if len(entry.sources) != 1 or entry.sources[0] is None:  # one file source
        return None
    return taken_files(cp, _log_offset(cfg, committed, entry.sources[0]))


class LandedFileChanged(PipelineStateError):
    """A landing file was modified after the stream took it."""

    def __init__(self, changed: list[tuple[str, int, int]], landing: str) -> None:
        self.files = [p for p, _, _ in changed]
        shown = changed[:5]
        listing = "; ".join(f"{p} (taken when modified at {_iso(t)}, now modified at {_iso(n)})"
                            for p, t, n in shown)
        more = f" and {len(changed) - len(shown)} more" if len(changed) > len(shown) else ""
        # every file (not only the ones listed): following a partial command stopped the next
        # run again on the rest (tester)
        touch = " && ".join(f"touch -m -d @{t / 1000:.3f} {shlex.quote(p)}" for p, t, _ in changed)
        super().__init__(
            f"{len(changed)} landing file(s) in {landing} changed after the stream read them: "
            f"{listing}{more}. Spark's file source reads each file once, so lines written to it "
            "later would never be read (a file must be complete when it appears in the landing "
            "folder: write it under a temporary name — hidden, starting with '.' — and rename it "
            "into place; a correction goes into a new file, never over a file already read). "
            "If a file's content is unchanged (restored from an archive by a copy that set a new "
            f"time), only give it its old time back: `{touch}`, and run again. Otherwise: copy the lines added since the first read into a NEW file in "
            "the landing folder (a line that was cut off then is in the quarantine; its completed "
            "form belongs in the new file), then give each changed file its old modification time "
            f"back (`{touch}`) and run again")


class LandingMoved(PipelineStateError):
    """The checkpoint's file source took files from another folder than ``source.path``."""

    def __init__(self, cfg: PipelineConfig, outside: list[str]) -> None:
        self.files = outside
        folder = os.path.dirname(outside[0])
        cp = cfg.checkpoint_path
        super().__init__(
            f"pipeline {cfg.name!r}: checkpoint {cp} took {len(outside)} file(s) from outside "
            f"the landing folder {cfg.landing_path} (source.path of {cfg.file}), e.g. "
            f"{outside[0]}: the landing folder was moved or renamed, source.path changed, or the "
            "checkpoint was copied from another pipeline. Spark re-plans the last batch's files "
            "from the recorded paths on every start and fails (\"Wrong basePath\"), and files "
            "in the new folder named like taken ones would be taken for read. Recovery: put the "
            f"folder back where it was ({folder}) or set source.path back; or, to go on from "
            f"the new folder, move the checkpoint aside: `{mv_aside(cp, '.moved')} && spark-submit "
            f"spark_jobs/cdc_ingest.py --pipeline {shlex.quote(str(cfg.file))}` (the new checkpoint re-reads the "
            "whole landing folder; every MERGE is ordered by binlog sequence, so re-applied "
            "changes leave the tables as they are)")


def _iso(ms: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


def check_landed_files_unchanged(cfg: PipelineConfig) -> None:
    """Raise :class:`LandedFileChanged` when a file the file source took in a committed batch is
    still in the landing folder and has another modification time than the one the source
    recorded for it (later: appended to; earlier: replaced by a copy keeping an older time).

    Local landing folders only (a URI or a log this module does not read: no check). A recorded
    time that is a whole second may be a file system without milliseconds: then only a change in
    a later second counts.

    Example::

        check_landed_files_unchanged(cfg)   # before the stream starts, under the pipeline lock
    """
    check_landing_names(cfg)  # (the job's one check of the landing folder before the stream)
    if ":" in str(cfg.landing_path):
        return
    taken = _taken_entries(cfg)
    landing = os.path.normpath(str(cfg.landing_path))
    inside = landing.rstrip(os.sep) + os.sep  # (normalized paths: a prefix test is exact)
    outside = [] if any(ch in landing for ch in "*?[]{}\\") else \
        [p for p in sorted(taken) if not p.startswith(inside)]
    if outside:
        raise LandingMoved(cfg, outside)
    try:  # files the folder holds now: no stat for a taken file that is gone (archived)
        names: set[str] | None = {e.name for e in os.scandir(landing)}
    except OSError:
        names = None
    changed = []
    for path, recorded in sorted(taken.items()):
        if names is not None and os.path.dirname(path) == landing \
                and os.path.basename(path) not in names:
            continue
        try:
            now = os.stat(path).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            continue  # archived / cleaned up: nothing more to read from it
        slack = 999 if recorded % 1000 == 0 else 0
        # an older time is a change too: a corrected copy put in place with its old time kept
        # (`cp -p`, `rsync -t`) was taken for the file already read (tester: exit 0, stale rows)
        if now > recorded + slack or now < recorded:
            changed.append((path, recorded, now))
    if changed:
        raise LandedFileChanged(changed, str(cfg.landing_path))


class LandingHistoryIncomplete(PipelineStateError):
    """A full refresh would rebuild from a landing folder lacking files the stream has taken."""

    def __init__(self, cfg: PipelineConfig, gone: list[str]) -> None:
        self.files = gone
        shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
        cp = cfg.checkpoint_path
        super().__init__(
            f"pipeline {cfg.name!r}: a full refresh rebuilds tables from the landing folder "
            f"{cfg.landing_path}"
            + (f" and its archive {archived(cfg.archive_path, cfg.landing_path)}"
               if cfg.archive_path is not None else "")
            + f", but {len(gone)} file(s) the pipeline has ingested are in neither any more "
            f"({shown}; moved, archived elsewhere or deleted): the rebuilt tables would lack "
            "their changes, so nothing was rebuilt. Recovery: put those files back into the "
            "landing folder"
            + (" (or the archive)" if cfg.archive_path is not None else "")
            + " under their names, keeping their modification times (`mv`, `cp -p`, "
            "`rsync -t`: a new time makes the next incremental run take them for changed files), "
            "and run the full refresh again. To rebuild without them "
            "on purpose (their changes are lost from the rebuilt tables for good), move the "
            f"checkpoint aside first (`{mv_aside(cp, '.before-refresh')}`): the next incremental run "
            "then re-reads the landing folder from its start")


def check_history_complete(cfg: PipelineConfig) -> None:
    """Before a full refresh: raise :class:`LandingHistoryIncomplete` when files the stream
    took in committed batches are gone from the landing folder (tester: two archived files, a
    full refresh, 6 of 31 rows missing, exit 0). Local landing folders only."""
    if ":" in str(cfg.landing_path):
        return
    try:
        taken = _taken_entries(cfg)
    except (OSError, ValueError, KeyError, TypeError, PipelineStateError):
        return  # a damaged checkpoint: a full refresh does not need it (its own checks report it)
    # a file compressed in place (`gzip f.json`) is still there for the refresh: Spark reads
    # it by its codec suffix
    arc = cfg.archive_path  # (Spark's cleanSource=archive moved the files taken before)
    gone = [p for p in sorted(taken) if not present(p, cfg.file_glob)
            and (arc is None or not present(archived(arc, p), cfg.file_glob))]
    if gone:
        raise LandingHistoryIncomplete(cfg, gone)


def _taken_entries(cfg: PipelineConfig) -> dict[str, int]:
    """Local path -> recorded mtime (ms) of the files taken in committed batches (the last time
    a path was taken counts); empty when the log holds anything else (a URI, no times)."""
    cp = cfg.checkpoint_path
    committed = last_committed_batch(cp)
    if committed is None:
        return {}
    entry = read_offsets(cp, committed)
    if len(entry.sources) != 1 or entry.sources[0] is None:
        return {}
    log_offset = _log_offset(cfg, committed, entry.sources[0])
    out: dict[str, int] = {}
    for log_id, path in source_log_files(cp, 0):
        if log_id > log_offset:
            continue
        for local, ts in local_entries(path):
            if local is None or ts is None:
                return {}
            out[local] = max(ts, out.get(local, ts))
    return out
