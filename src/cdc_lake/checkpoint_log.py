"""Reading Spark's streaming checkpoint files (the one place that knows their format).

A Structured Streaming checkpoint folder holds:

* ``metadata`` — one JSON line ``{"id": "<query uuid>"}``;
* ``offsets/N`` — ``v1``, a batch-metadata JSON line, then one JSON offset line per source
  (``{"logOffset": K}`` for the file source; ``-`` for a source without an offset);
* ``commits/N`` — ``v1`` and one JSON line: batch ``N`` finished;
* ``sources/0/K`` and ``sources/0/K.compact`` — the file source's log: ``v1`` then one JSON line
  ``{"path": "file:///...", "timestamp": ..., "batchId": ...}`` per file it has taken.

Spark writes them atomically, but a full disk, a copied folder or a storage fault can leave an
empty or truncated file, and Spark then fails with "Incomplete log file" (or a JSON error) deep in
a stack trace. :func:`validate_checkpoint` checks every one of them before Spark starts and raises
:class:`CheckpointDamaged` naming the file, what is wrong and the recovery command. It also
raises it when a checkpoint that has batches lacks ``metadata`` or an entry of the file source
log that Spark reads on a start (deleted by hand or lost in a copy: Spark failed with
STREAMING_CHECKPOINT_MISSING_METADATA_FILE or "batch K doesn't exist").

Spark writes each log file as a hidden temp file (``.N.<uuid>.tmp`` and its checksum
``..N.<uuid>.tmp.crc``) and renames it into place. A driver killed between the two leaves the
temp file, which Spark never reads — but a leftover in ``offsets/`` of a query without batches
makes Spark refuse the checkpoint on every later start (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY:
"should be empty on batch 0"). :func:`remove_unfinished_writes` deletes them before a start,
and the checksum ``.N.crc`` of a log file ``N`` that is gone (an operator deleted ``commits/N``
by hand): Spark's rename onto it would fail with a misleading "concurrent query" error.

Example::

    remove_unfinished_writes(Path("/lake/_checkpoints/shop"))  # under the pipeline lock
    last_committed_batch(Path("/lake/_checkpoints/shop"))   # 41, or None before the first batch
    validate_checkpoint(Path("/lake/_checkpoints/shop"), recovery="mv ... && spark-submit ...")
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_LOG_NAME = re.compile(r"(\d+)(\.compact)?")
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_UNFINISHED = re.compile(rf"\.\.?[^/]+\.{_UUID}\.tmp(\.crc)?")
_CHECKSUM = re.compile(r"\.(\d+(?:\.compact)?)\.crc")


class PipelineStateError(RuntimeError):
    """The pipeline's stored state (checkpoint, tables) needs an operator: the message says what
    is wrong and the command that recovers. Retrying does not help (CLI exit code 3)."""


class CheckpointDamaged(PipelineStateError):
    """A checkpoint file is empty, truncated or not in the expected format."""

    def __init__(self, file: Path, problem: str, recovery: str) -> None:
        self.file, self.problem, self.recovery = file, problem, recovery
        super().__init__(f"checkpoint file {file} is {problem}; Spark cannot resume from it. "
                         f"Recovery: {recovery}")


@dataclass(frozen=True)
class OffsetEntry:
    """``offsets/N``: the batch metadata and one offset per source (None for ``-``)."""

    batch_id: int
    metadata: dict[str, Any]
    sources: tuple[dict[str, Any] | None, ...]


def batch_ids(folder: Path) -> list[int]:
    """Sorted batch ids of the log files (``N``, not hidden/temp files) in ``offsets``/``commits``."""
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def last_committed_batch(checkpoint: Path) -> int | None:
    """The highest batch id with a ``commits/N`` file (the last batch Spark finished)."""
    ids = batch_ids(checkpoint / "commits")
    return ids[-1] if ids else None


def last_offset_batch(checkpoint: Path) -> int | None:
    """The highest batch id with an ``offsets/N`` file (planned; maybe not committed)."""
    ids = batch_ids(checkpoint / "offsets")
    return ids[-1] if ids else None


def _lines(path: Path) -> list[str]:
    """The lines of a ``v1`` log file; ValueError (with the problem) when it is not one."""
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError("empty")
    lines = text.splitlines()
    if lines[0] != "v1":
        raise ValueError(f"not a v1 log file (first line {lines[0][:40]!r})")
    return lines[1:]


def _json(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        raise ValueError(f"truncated or corrupt (line {line[:60]!r} is not JSON)") from None


SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def read_offsets(checkpoint: Path, batch_id: int) -> OffsetEntry:
    """Parse ``offsets/<batch_id>`` (ValueError naming the problem if it is damaged)."""
    lines = _lines(checkpoint / "offsets" / str(batch_id))
    if len(lines) < 2:
        raise ValueError("truncated (no source offset after the batch metadata)")
    meta = _json(lines[0])
    sources = tuple(None if ln == "-" else _json(ln) for ln in lines[1:])
    if not isinstance(meta, dict) or not all(s is None or isinstance(s, dict) for s in sources):
        raise ValueError("not in the offsets format")
    conf = meta.get("conf")
    if conf is not None and (not isinstance(conf, dict) or SHUFFLE_PARTITIONS not in conf):
        # Spark writes its session settings there and reads them back on a restart; without
        # this one its restart fails with "None.get" (tester: hand-edited offsets file)
        raise ValueError(f"its batch metadata lacks the setting {SHUFFLE_PARTITIONS} Spark "
                         "wrote there and reads on a restart")
    return OffsetEntry(batch_id, meta, sources)


def batch_source_offsets(checkpoint: Path, batch_id: int,
                         source: int = 0) -> tuple[dict[str, Any] | None, dict[str, Any]] | None:
    """``(start, end)`` offsets of ``source`` for micro-batch ``batch_id``: the batch reads what
    lies after ``start`` up to ``end``. ``end`` is in ``offsets/<batch_id>`` (written before the
    batch runs), ``start`` in ``offsets/<batch_id - 1>`` (Spark starts batch N where batch N-1
    ended; None for batch 0: the source's initial offset). None when either file is missing or
    not readable, so the caller can leave the reading to Spark."""
    try:
        end = read_offsets(checkpoint, batch_id).sources[source]
        start = read_offsets(checkpoint, batch_id - 1).sources[source] if batch_id > 0 else None
    except (OSError, ValueError, IndexError):
        return None
    if end is None or (batch_id > 0 and start is None):
        return None
    return start, end


def batch_watermark_ms(checkpoint: Path, batch_id: int) -> int:
    """The event-time watermark Spark used for ``batch_id`` (``batchWatermarkMs`` of
    ``offsets/<batch_id>``, written before the batch runs); 0 when there is none yet."""
    try:
        entry = read_offsets(checkpoint, batch_id)
    except FileNotFoundError:
        return 0
    value = entry.metadata.get("batchWatermarkMs", 0)
    return int(value) if isinstance(value, (int, float)) else 0


def late_events_watermark_ms(checkpoint: Path, batch_id: int) -> int:
    """The watermark Spark's stateful operators (``dropDuplicatesWithinWatermark``) use for late
    events in ``batch_id``: the watermark of the batch before (``batchWatermarkMs`` of
    ``offsets/<batch_id - 1>``; checked on Spark 4.2, also on the first batch of a run: a row
    at or before it is dropped before ``foreachBatch`` sees it). 0 for batch 0 and for a batch
    without an ``offsets/<batch_id>`` (not a streaming batch of this checkpoint). Raises
    ValueError when ``offsets/<batch_id>`` exists but the file before it is missing or damaged
    (Spark cannot have run the batch without it)."""
    if batch_id <= 0 or not (checkpoint / "offsets" / str(batch_id)).is_file():
        return 0
    try:
        entry = read_offsets(checkpoint, batch_id - 1)
    except (OSError, ValueError) as e:
        raise ValueError(f"{checkpoint / 'offsets' / str(batch_id - 1)}: "
                         f"{e if isinstance(e, ValueError) else 'missing or unreadable'}") from None
    value = entry.metadata.get("batchWatermarkMs", 0)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def read_source_log_batches(path: Path) -> list[tuple[str, int | None]]:
    """``(file URI, batchId)`` of one file-source log file (a ``K.compact`` file holds the
    entries of every log id up to ``K``, each with its ``batchId``)."""
    return _source_log(path, "batchId")


def source_log_entry_files(checkpoint: Path, log_id: int, source: int = 0) -> list[str]:
    """The file URIs of log id ``log_id`` of the file source's log, as Spark reads them: the
    file ``<log_id>``, else the entries of batchId ``log_id`` in ``<log_id>.compact`` or in the
    first compact file after it (Spark deletes entries a compact file holds). ValueError when
    none holds it or a file is damaged."""
    return [uri for uri, _ in source_log_entry_times(checkpoint, log_id, source)]


def source_log_entry_times(checkpoint: Path, log_id: int,
                           source: int = 0) -> list[tuple[str, int | None]]:
    """As :func:`source_log_entry_files`, with each file's modification time (ms) when the
    source took it (None when the entry has none)."""
    folder = checkpoint / "sources" / str(source)
    plain = folder / str(log_id)
    if plain.is_file():
        return read_source_entries(plain)
    compacts = [(n, p) for n, p in source_log_files(checkpoint, source)
                if p.name.endswith(".compact") and n >= log_id]
    if not compacts:
        raise ValueError(f"{plain}: missing (and no compact file after it holds log id {log_id})")
    _, path = compacts[0]
    return [(uri, ts) for uri, b, ts in _source_log_fields(path, "batchId", "timestamp")
            if b == log_id]


def batch_source_files(checkpoint: Path, batch_id: int, source: int = 0) -> list[str] | None:
    """The file URIs micro-batch ``batch_id`` of a file source read: the log ids after the
    batch's start ``logOffset`` up to its end (a batch that took no new file: []). None when
    the batch's offsets are not readable or not a file source's (not a streaming batch of this
    checkpoint); ValueError when a log entry the offsets name is missing or damaged."""
    entries = batch_source_entries(checkpoint, batch_id, source)
    return None if entries is None else [uri for uri, _ in entries]


def batch_source_entries(checkpoint: Path, batch_id: int,
                         source: int = 0) -> list[tuple[str, int | None]] | None:
    """As :func:`batch_source_files`, with each file's modification time (ms) when taken."""
    span = batch_source_offsets(checkpoint, batch_id, source)
    if span is None:
        return None
    start, end = span

    def log_offset(o: dict[str, Any] | None) -> int | None:
        k = -1 if o is None else o.get("logOffset")
        return k if isinstance(k, int) and not isinstance(k, bool) else None

    lo, hi = log_offset(start), log_offset(end)
    if lo is None or hi is None:
        return None
    return [e for k in range(lo + 1, hi + 1) for e in source_log_entry_times(checkpoint, k, source)]


def read_commit(checkpoint: Path, batch_id: int) -> dict[str, Any]:
    lines = _lines(checkpoint / "commits" / str(batch_id))
    if not lines:
        raise ValueError("truncated (no commit metadata after the version line)")
    meta = _json(lines[0])
    if not isinstance(meta, dict):
        raise ValueError("not in the commits format")
    return meta


def source_log_files(checkpoint: Path, source: int = 0) -> list[tuple[int, Path]]:
    """``(log id, file)`` of the file source's metadata log, compact files included."""
    folder = checkpoint / "sources" / str(source)
    if not folder.is_dir():
        return []
    out = []
    for p in folder.iterdir():
        m = _LOG_NAME.fullmatch(p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def read_source_log(path: Path) -> list[str]:
    """The file URIs one file-source log file lists."""
    return [uri for uri, _ in read_source_entries(path)]


def read_source_entries(path: Path) -> list[tuple[str, int | None]]:
    """``(file URI, modification time in ms when it was taken)`` of one file-source log file."""
    return _source_log(path, "timestamp")


def _source_log(path: Path, field: str) -> list[tuple[str, int | None]]:
    """``(file URI, the entry's integer ``field`` or None)`` of one file-source log file."""
    return [(uri, v) for uri, v in _source_log_fields(path, field)]


# Parsed file-source log files by (path, size, mtime, fields): Spark writes each log file once,
# by rename, and one run reads the log several times (the checkpoint check, the batch's files);
# a compact file lists every file the stream ever took (15,000 entries: 0.12-0.14 s per check
# of the whole log, one line at a time; now 0.12 s once, 0.009 s for each later read).
_PARSED: dict[tuple[str, int, int, tuple[str, ...]], list[tuple[Any, ...]]] = {}


def _source_log_fields(path: Path, *fields: str) -> list[tuple[Any, ...]]:
    """``(file URI, each of ``fields`` as an integer or None)`` of one file-source log file."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, fields)
    hit = _PARSED.get(key)
    if hit is None:
        hit = _parse_source_log(path, fields)
        if len(_PARSED) >= 64:
            _PARSED.clear()
        _PARSED[key] = hit
    return list(hit)


def _parse_source_log(path: Path, fields: tuple[str, ...]) -> list[tuple[Any, ...]]:
    lines = [ln for ln in _lines(path) if ln.strip()]
    try:  # one parse of all entries; a line that is not one JSON value: the line by line parse
        entries = json.loads("[" + ",".join(lines) + "]")  # names it
        if len(entries) != len(lines):
            raise ValueError
    except ValueError:
        entries = [_json(ln) for ln in lines]
    out: list[tuple[Any, ...]] = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise ValueError("not in the file source log format")
        vals = [entry.get(f) for f in fields]
        out.append((entry["path"], *(v if isinstance(v, int) and not isinstance(v, bool) else None
                                     for v in vals)))
    return out


def remove_unfinished_writes(checkpoint: Path) -> list[Path]:
    """Delete the temp files of log writes that never finished (see the module docstring) and
    checksums of log files that are gone, from ``offsets/``, ``commits/`` and ``sources/*/``;
    return what was deleted. Call it only under the pipeline lock (no run of this checkpoint is
    writing)."""
    folders = [checkpoint / "offsets", checkpoint / "commits"]
    sources = checkpoint / "sources"
    folders += sorted(p for p in sources.iterdir() if p.is_dir()) if sources.is_dir() else []
    removed = []
    for folder in folders:
        for f in sorted(folder.iterdir()) if folder.is_dir() else []:
            orphan = _CHECKSUM.fullmatch(f.name)
            if f.is_file() and (_UNFINISHED.fullmatch(f.name)
                                or (orphan and not (folder / orphan.group(1)).exists())):
                f.unlink()
                removed.append(f)
    return removed


def validate_checkpoint(checkpoint: Path, *, recovery: str) -> None:
    """Check every Spark log file of the checkpoint, and that a checkpoint with batches has its
    ``metadata`` and the file source log entries Spark reads on a start; raise
    :class:`CheckpointDamaged` on the first damaged or missing one. A checkpoint that does not
    exist yet (or holds only files of ours) is fine."""
    meta = checkpoint / "metadata"
    checks: list[tuple[Path, Any]] = []
    if meta.exists():
        checks.append((meta, lambda: _metadata(meta)))
    for n in batch_ids(checkpoint / "offsets"):
        checks.append((checkpoint / "offsets" / str(n), lambda n=n: read_offsets(checkpoint, n)))
    for n in batch_ids(checkpoint / "commits"):
        checks.append((checkpoint / "commits" / str(n), lambda n=n: read_commit(checkpoint, n)))
    sources = checkpoint / "sources"
    for folder in sorted(sources.iterdir()) if sources.is_dir() else []:
        if folder.name.isdigit():
            for _, p in source_log_files(checkpoint, int(folder.name)):
                checks.append((p, lambda p=p: read_source_log(p)))
    for path, check in checks:
        try:
            check()
        except (ValueError, UnicodeDecodeError, OSError) as e:
            raise CheckpointDamaged(path, str(e) if isinstance(e, ValueError) else
                                    f"unreadable ({e})",
                                    _newest_commit_recovery(checkpoint, path, recovery) or recovery
                                    ) from None
    _check_complete(checkpoint, recovery)


def _newest_commit_recovery(checkpoint: Path, path: Path, recovery: str) -> str | None:
    """The lossless recovery when ``path`` is the newest ``commits/N`` and ``offsets/N`` is
    intact: without the commit record Spark runs batch ``N`` again from its logged offsets (the
    ordinary replay after a crash), and the writes the batch already made are skipped by their
    Delta transaction ids. ``None`` for any other file."""
    from cdc_lake.paths import mv_aside

    commits = checkpoint / "commits"
    if path.parent != commits or not path.name.isdigit():
        return None
    n = int(path.name)
    if n != batch_ids(commits)[-1]:
        return None
    try:
        read_offsets(checkpoint, n)
    except (ValueError, UnicodeDecodeError, OSError):
        return None
    return (f"it is the newest batch's commit record and offsets/{n} is intact, so move the file "
            f"aside and run again: `{mv_aside(path)}`; batch {n} then runs again from its logged "
            "offsets, and the writes it already made are skipped by their Delta transaction ids "
            f"(nothing is read twice or lost). Only if that run fails: {recovery}")


def _check_complete(checkpoint: Path, recovery: str) -> None:
    """The files a checkpoint that has batches cannot lack (every file present is readable).

    A new checkpoint has none of them (Spark writes ``metadata`` when the query first starts,
    ``sources/0/K`` before the ``offsets/N`` that takes the file source to log entry ``K``). Once
    ``offsets/`` or ``commits/`` holds a batch, Spark refuses a checkpoint without ``metadata``
    (STREAMING_CHECKPOINT_MISSING_METADATA_FILE) and re-reads the file source's log from its
    newest ``K.compact`` (else from entry 0) up to its newest entry on every start ("batch K
    doesn't exist" when one is gone). Entries below the newest compact file are in it, so Spark
    may delete their files. The newest batch has an ``offsets/N`` (written before ``commits/N``),
    and ``offsets/N-1`` beside it."""
    offsets = batch_ids(checkpoint / "offsets")
    batches = sorted(set(offsets) | set(batch_ids(checkpoint / "commits")))
    if not batches:
        return
    meta = checkpoint / "metadata"
    if not meta.is_file():
        last = batches[-1]
        has = ", ".join(f"{d}/{last}" for d in ("offsets", "commits")
                        if last in batch_ids(checkpoint / d))
        raise CheckpointDamaged(meta, f"missing (it holds the query id) while the checkpoint "
                                f"has batches up to {last} ({has})", recovery)
    if batches[-1] not in offsets:
        # Spark writes offsets/N before it runs batch N and commits/N after: a commit above the
        # newest offsets file means that file (and perhaps more) was removed; Spark would re-run
        # an older batch and then fail to add its commit (a concurrent-update error)
        last = batches[-1]
        raise CheckpointDamaged(checkpoint / "offsets" / str(last), (
            f"missing while commits/{last} holds batch {last} as done (the offset log ends at "
            + (f"batch {offsets[-1]})" if offsets else "no batch)")), recovery)
    if offsets[-1] > 0 and offsets[-1] - 1 not in offsets:
        # Spark restarts from the newest offsets file and the one before it (the batch's start);
        # its purge keeps both. Without it: "batch N-1 doesn't exist" after a page of plan, exit 1
        prev = offsets[-1] - 1
        raise CheckpointDamaged(checkpoint / "offsets" / str(prev), (
            f"missing: Spark reads it with offsets/{offsets[-1]} (where batch {offsets[-1]} "
            "starts) on every start"), recovery)
    entry = read_offsets(checkpoint, offsets[-1])  # readable: checked before
    for source, offset in enumerate(entry.sources):
        k = offset.get("logOffset") if isinstance(offset, dict) else None
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            continue  # no file taken yet (or not a file source)
        folder = checkpoint / "sources" / str(source)
        if not folder.is_dir() and any(p.is_dir() for p in (checkpoint / "sources").glob("*")):
            # a query reading one folder twice (a union of two branches of one file stream:
            # the enrichment events source for non-string ids) lists one offset per branch but
            # keeps one log, in the first branch's folder; only a checkpoint whose sources/
            # folders are all gone is known to lack this one
            continue
        found = source_log_files(checkpoint, source)
        ids = {n for n, _ in found}
        top = max([k, *ids])
        first = max((n for n, p in found if p.name.endswith(".compact") and n <= top), default=0)
        missing = [n for n in range(first, top + 1) if n not in ids]
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
            gone = (f"the folder {folder} is gone" if not folder.is_dir()
                    else f"log entry {shown} is gone" if len(missing) == 1
                    else f"log entries {shown} are gone")
            raise CheckpointDamaged(folder / str(missing[0]), (
                f"missing ({gone}): offsets/{offsets[-1]} has taken the file source to entry {k} "
                f"of its log, and Spark re-reads entries {first}..{top} on every start"), recovery)


def _metadata(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError("empty")
    data = _json(text.splitlines()[0])
    if not isinstance(data, dict) or "id" not in data:
        raise ValueError("not in the metadata format (no query id)")
