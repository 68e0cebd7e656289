"""How far back maintenance may clean a table that change-feed readers follow.

An enrichment pipeline reading a table's change feed (its checkpoint's last committed offsets
say which version it has read, :func:`committed_source_versions`) still needs the data files of
the versions after it (VACUUM's retention is raised to keep them, :func:`vacuum_retention_hours`)
and the ``_delta_log`` commits from that version on (:func:`log_hold`; delta-rs cannot bound its
log cleanup by version, so :mod:`cdc_lake.maintenance` skips the cleanup while a commit it
would delete is still needed, :func:`expired_log_versions`). The change-data files of those
versions (``_change_data/``) are kept by the same retention: delta-rs's VACUUM never deletes
them (1.6.6), so maintenance removes the ones older than it, :func:`expired_change_files`.

Example::

    readers = lagging_readers(Path("/lake/orders"), pipelines)   # [("shop_lines", 41)]
    hours, held_by = vacuum_retention_hours(DeltaTable("/lake/orders"), 168, readers)
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deltalake import DeltaTable

DEFAULT_LOG_RETENTION_S = 30 * 86400  # Delta's delta.logRetentionDuration default
LOG_RETENTION_MARGIN_S = 3600         # a commit expiring within this counts as expired already
_UNIT_S = {"microsecond": 1e-6, "millisecond": 1e-3, "second": 1, "minute": 60, "hour": 3600,
           "day": 86400, "week": 7 * 86400}
_LOG_FILE = re.compile(r"^(\d{20})\.")  # <version>.json / .checkpoint.parquet / .crc ...


def _commit_time(dt: DeltaTable, version: int) -> datetime | None:
    """When ``version`` was committed: its commit file's ``commitInfo.timestamp`` (one small
    read), else the table history (which replays every commit: its cost grew with the table)."""
    from urllib.parse import unquote, urlparse

    uri = dt.table_uri
    local = Path(unquote(urlparse(uri).path)) if uri.startswith("file:") else Path(uri)
    try:
        with open(local / "_delta_log" / f"{version:020d}.json", encoding="utf-8") as f:
            for line in f:
                info = json.loads(line).get("commitInfo") if line.strip() else None
                if isinstance(info, dict) and isinstance(info.get("timestamp"), int):
                    return datetime.fromtimestamp(info["timestamp"] / 1000, tz=timezone.utc)
    except (OSError, ValueError, AttributeError):
        pass  # not a local table, the commit file cleaned up or unreadable: ask the history
    for entry in dt.history():
        if entry.get("version") == version and entry.get("timestamp") is not None:
            return datetime.fromtimestamp(entry["timestamp"] / 1000, tz=timezone.utc)
    return None


def committed_source_versions(checkpoint: Path) -> list[int]:
    """The last Delta version read, per change-feed source, from the last committed offsets of
    a streaming checkpoint: ``{"version": n}`` (the deltalake change-feed source) is ``n``;
    Delta's own source (delta-spark, ``{"reservoirVersion": v, "index": i, ...}``) is ``v - 1``
    (version ``v`` may be read only in part, or not at all with ``index`` -1: counted as not
    read, which keeps one version more). A damaged offsets file counts as "reads from the
    beginning" (-1): VACUUM then keeps everything."""
    from cdc_lake.checkpoint_log import last_committed_batch, read_offsets

    last = last_committed_batch(checkpoint)
    if last is None:
        return []
    try:
        entry = read_offsets(checkpoint, last)
    except (OSError, ValueError):
        return [-1]
    found = []
    for o in entry.sources:
        if not isinstance(o, dict):
            continue
        if isinstance(o.get("version"), int):
            found.append(o["version"])
        elif isinstance(o.get("reservoirVersion"), int):
            found.append(max(o["reservoirVersion"] - 1, -1))
    return found


def lagging_readers(table: Path, pipelines: list[Any]) -> list[tuple[str, int]]:
    """``(reader pipeline, last version it has read)`` for pipelines reading ``table``'s change feed."""
    resolved = table.resolve()
    found = []
    for p in pipelines:
        sources = getattr(p, "change_feed_sources", None)
        paths = sources() if callable(sources) else (sources or [])
        if not any(Path(s).resolve() == resolved for s in paths):
            continue
        versions = committed_source_versions(Path(p.checkpoint_path))
        found.append((p.name, min(versions) if versions else -1))
    return found


def pinned_readers(table: Path, pipelines: list[Any]) -> list[tuple[str, int]]:
    """``(reader, version - 1)`` for every batch a pipeline planned on ``table`` at ``version``
    and has not committed (an enrichment batch interrupted after its plan: its replay reads its
    dimensions and its own tables at the planned versions, by time travel). In the form of
    :func:`lagging_readers` (the last version "read"), so the same retention keeps the files of
    the planned version (tester: a VACUUM between the crash and the replay removed a dimension
    version the replay needed; it then stopped with exit 3 blaming a VACUUM outside the
    pipeline). A plan file that cannot be read holds the table entirely (-1)."""
    from cdc_lake.checkpoint_log import last_committed_batch

    resolved = table.resolve()
    found = []
    for p in pipelines:
        pinned = getattr(p, "pinned_tables", None)
        keys = [k for k, path in (pinned or {}).items() if Path(path).resolve() == resolved]
        if not keys:
            continue
        from cdc_lake.enrich.plan import PLANS_DIR
        from cdc_lake.enrich.rejoin import PLAN_ROOT

        checkpoint = Path(p.checkpoint_path)
        done = last_committed_batch(checkpoint)
        # a re-join pass's plan exists only until the pass has written everything
        plans = [(plan, "batch") for plan in sorted((checkpoint / PLANS_DIR).glob("*.json"))
                 if plan.stem.isdigit() and (done is None or int(plan.stem) > done)]
        plans += [(plan, "re-join pass") for plan in sorted((checkpoint / PLAN_ROOT / PLANS_DIR).glob("*.json"))
                  if plan.stem.isdigit()]
        for plan, what in plans:
            try:
                versions = json.loads(plan.read_text(encoding="utf-8"))["versions"]
                needed = [versions.get(k) for k in keys]
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                needed = [-1]
            for v in needed:
                if isinstance(v, int) and not isinstance(v, bool):
                    found.append((f"{p.name} ({what} {plan.stem} replay)", max(v - 1, -1)))
    return found


def vacuum_retention_hours(dt: DeltaTable, configured: int,
                           readers: list[tuple[str, int]]) -> tuple[int, str | None]:
    """VACUUM's retention in hours: ``configured``, raised to keep every file the oldest
    lagging reader's next version references; and the reader that raised it."""
    hours, held_by = max(0, configured), None
    now = datetime.now(timezone.utc)
    for name, version in readers:
        needed = version + 1
        if needed > dt.version():
            continue
        when = _commit_time(dt, max(needed, 0))
        if when is None:  # history no longer has it: keep everything we can
            return 10 ** 6, name
        age = int((now - when).total_seconds() // 3600) + 1
        if age >= hours:
            hours, held_by = age + 1, name
    return hours, held_by


def log_retention_seconds(dt: DeltaTable) -> float:
    """``delta.logRetentionDuration`` of the table in seconds (default 30 days). A value this
    cannot parse counts as 0: every commit is then taken as expired, so a lagging reader holds
    the log cleanup back rather than losing commits."""
    raw = (dt.metadata().configuration or {}).get("delta.logRetentionDuration")
    if raw is None:
        return DEFAULT_LOG_RETENTION_S
    m = re.fullmatch(r"\s*(?:interval\s+)?(\d+)\s*([a-z]+?)s?\s*", str(raw).lower())
    if m is None or m.group(2) not in _UNIT_S:
        return 0.0
    return int(m.group(1)) * _UNIT_S[m.group(2)]


def log_hold(dt: DeltaTable, readers: list[tuple[str, int]]) -> tuple[int, str] | None:
    """``(oldest version whose commit a reader still needs, that reader)``, or None when no reader
    lags. A reader that has read version *v* reads the commits of *v+1…* and the commit of *v*
    (to see that the table still continues what it read), so everything from *v* on is kept."""
    hold: tuple[int, str] | None = None
    latest = dt.version()
    for name, version in readers:
        if version + 1 > latest:
            continue  # has read everything: needs only commits that do not exist yet
        keep = max(version, 0)
        if hold is None or keep < hold[0]:
            hold = (keep, name)
    return hold


def expired_log_versions(path: Path, keep_from: int, retention_s: float) -> list[int]:
    """Versions >= ``keep_from`` with a ``_delta_log`` file (commit, checkpoint, crc) old enough
    for delta-rs's log cleanup to delete (modified before now - retention + a margin)."""
    import pyarrow.fs as pafs

    uri = str(path)
    fs, root = pafs.FileSystem.from_uri(uri if "://" in uri else str(Path(uri).resolve()))
    cutoff = time.time() - retention_s + LOG_RETENTION_MARGIN_S
    found = set()
    for fi in fs.get_file_info(pafs.FileSelector(f"{root.rstrip('/')}/_delta_log", allow_not_found=True)):
        m = _LOG_FILE.match(fi.base_name)
        if m is None or int(m.group(1)) < keep_from or fi.mtime is None:
            continue
        if fi.mtime.timestamp() <= cutoff:
            found.add(int(m.group(1)))
    return sorted(found)


def expired_change_files(path: Path, hours: int, keep_from: int | None = None) -> list[tuple[str, int]]:
    """``(path, bytes)`` of the table's change-data files (``_change_data/``, partition folders
    included) last modified more than ``hours`` ago and not referenced by the ``cdc`` action of a
    commit from version ``keep_from`` on (a lagging reader's :func:`log_hold`; None: no reader).

    MERGE/UPDATE/DELETE of a table with the change feed on write these files and commit them in
    ``cdc`` actions; no snapshot ever references them, and delta-rs 1.6.6's VACUUM skips the folder
    (checked: after VACUUM with retention 0 all of them were still there), so without this they
    pile up forever. A file is written just before its commit, so one older than the VACUUM
    retention (``vacuum_retention_hours``, raised for lagging readers) belongs to a version no
    reader still needs, like the data files VACUUM removes; the files of the versions a reader
    still has to read are kept by name as well, whatever their modification time says."""
    import pyarrow.fs as pafs

    uri = str(path)
    fs, root = pafs.FileSystem.from_uri(uri if "://" in uri else str(Path(uri).resolve()))
    root = root.rstrip("/")
    cutoff = time.time() - max(0, hours) * 3600
    selector = pafs.FileSelector(f"{root}/_change_data", allow_not_found=True, recursive=True)
    old = [(fi.path, int(fi.size or 0)) for fi in fs.get_file_info(selector)
           if fi.type == pafs.FileType.File and fi.mtime is not None
           and fi.mtime.timestamp() < cutoff]
    if not old or keep_from is None:
        return sorted(old)
    needed = _cdc_paths(fs, root, keep_from)
    return sorted((f, size) for f, size in old if f[len(root) + 1:] not in needed)


def _cdc_paths(fs: Any, root: str, keep_from: int) -> set[str]:
    """Table-relative paths in the ``cdc`` actions of the commits ``keep_from``.. of the log."""
    import json
    from urllib.parse import unquote

    import pyarrow.fs as pafs

    paths: set[str] = set()
    selector = pafs.FileSelector(f"{root}/_delta_log", allow_not_found=True)
    for fi in fs.get_file_info(selector):
        m = re.fullmatch(r"(\d{20})\.json", fi.base_name)
        if m is None or int(m.group(1)) < keep_from:
            continue
        with fs.open_input_stream(fi.path) as f:
            for line in f.read().decode("utf-8").splitlines():
                if '"cdc"' in line:
                    action = json.loads(line).get("cdc")
                    if isinstance(action, dict) and isinstance(action.get("path"), str):
                        paths.add(unquote(action["path"]))
    return paths


def remove_files(path: Path, files: list[tuple[str, int]]) -> None:
    """Delete ``files`` (paths from :func:`expired_change_files`) on the table's file system."""
    import pyarrow.fs as pafs

    uri = str(path)
    fs, _ = pafs.FileSystem.from_uri(uri if "://" in uri else str(Path(uri).resolve()))
    for f, _ in files:
        fs.delete_file(f)
