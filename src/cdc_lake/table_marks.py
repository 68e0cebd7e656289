"""Has an output table changed behind its pipeline since the last run left it? (both job kinds)

After every run (CDC) or batch (enrichment) a job records, per table it owns, the Delta version
it left the table at and the fingerprint of that version's commit file
(:func:`commit_fingerprint`). Before the next run, :func:`changed_behind` compares:

* the commit of the recorded version must still be the one recorded. A version number alone is
  not enough: when the newest commit files were removed and a later commit (a maintenance
  OPTIMIZE or VACUUM) took the same version number, the table was "at or above" the recorded
  version again and the lost changes went unnoticed (seen: 12 rows missing, exit 0);
* every commit after it that changes rows (an ``add`` or ``remove`` with ``dataChange`` true)
  must be the pipeline's own: a Delta transaction (``txn``) whose app id starts with the
  pipeline's prefix (``cdc-<name>-`` / ``enrich-<name>-``: a write of a run that stopped before
  recording), or a rewrite tagged as keeping the same rows (type widening). Maintenance's
  OPTIMIZE (``dataChange`` false) and VACUUM change no rows and pass. A RESTORE, DELETE, UPDATE,
  MERGE or overwrite by another writer does not (seen: a hand-made RESTORE and DELETE on a CDC
  table, then incremental runs on top, exit 0 with keys missing and deleted keys back).

Commit files removed by the table's log retention (older than ``delta.logRetentionDuration``)
cannot be compared; the check skips what it cannot read rather than stopping on it.

A data file a table's log still references, deleted behind it, is found only when a run reads
or merges it: :func:`missing_data_files` picks the files out of the failure's text (both engines'
wording), and each job kind names the table and its recovery (exit 3, not a retried exit 1).

Example::

    mark = (version, commit_fingerprint(table, version))     # recorded after a run
    why = changed_behind(table, *mark, app_prefix="cdc-shop-")  # before the next: None if intact
    missing_data_files(traceback_text)                       # [Path('/lake/orders/part-0.parquet')]
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import unquote

from cdc_lake.sources.delta_log import SAME_ROWS, fingerprint

_COMMIT = re.compile(r"^(\d{20})\.json$")


# delta-rs: ``Object at location <f> not found``; Spark: ``File <f> does not exist``,
# ``[PATH_NOT_FOUND] Path does not exist: file:<f>``, ``[FAILED_READ_FILE.FILE_NOT_EXIST] Error
# while reading file file:<f>. File does not exist``. Paths may come percent-encoded (delta-rs
# URIs); a pipeline's paths never hold ``%XX`` (config refuses them), so decoding is safe.
# Paths may hold spaces (a match ends at the line's end).
_MISSING_FILE = (re.compile(r"Object at location /?(.+?) not found"),  # '/' absent: OPTIMIZE
                 re.compile(r"File (?:file:)?(/.+?\.parquet) does not exist"),
                 re.compile(r"Path does not exist: (?:file:)?(/.+?\.parquet)"),
                 re.compile(r"Error while reading file (?:file:)?(/.+?\.parquet)\. File does "
                            r"not exist"))


def missing_data_files(error_text: str) -> list[Path]:
    """The data files a failed run's error text says are missing (first seen first, once each)."""
    found: dict[Path, None] = {}
    for pattern in _MISSING_FILE:
        for m in pattern.finditer(error_text):
            found.setdefault(Path("/" + unquote(m.group(1)).lstrip("/")), None)
    return list(found)


def absent_snapshot_files(uris: list[str]) -> list[Path]:
    """The local data files among ``uris`` (``DeltaTable.file_uris()``: paths percent-encoded,
    ``with%20space``, with or without ``file://``) that are not on disk; other stores are not
    checked. Used by maintenance before it touches a table and before ``--reprocess``."""
    out = []
    for u in uris:
        if "://" in u and not u.startswith("file://"):
            continue
        raw = u.removeprefix("file://")
        f = Path(unquote(raw))
        if not f.exists() and not Path(raw).exists():
            out.append(f)
    return out


def _commit_file(table: Path, version: int) -> Path:
    return Path(table) / "_delta_log" / f"{version:020d}.json"


def commit_fingerprint(table: Path, version: int) -> str | None:
    """Fingerprint of the table's commit ``version`` (None when its file cannot be read)."""
    try:
        return fingerprint(_commit_file(table, version).read_bytes())
    except OSError:
        return None


def _foreign_change(data: bytes, app_prefix: str) -> str | None:
    """The operation of a commit that changed rows without being the pipeline's, else None."""
    changes, own, info = False, False, {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            action = json.loads(line)
        except ValueError:
            return "an unreadable commit"
        if not isinstance(action, dict):
            continue
        for kind in ("add", "remove"):
            a = action.get(kind)
            if isinstance(a, dict) and a.get("dataChange", True) is not False:
                changes = True
        txn = action.get("txn")
        if isinstance(txn, dict) and str(txn.get("appId", "")).startswith(app_prefix):
            own = True
        if isinstance(action.get("commitInfo"), dict):
            info = action["commitInfo"]
    same_rows = (str(info.get(SAME_ROWS, "")).strip().lower() == "true"
                 or SAME_ROWS in str(info.get("userMetadata") or ""))
    if not changes or own or same_rows:
        return None
    return str(info.get("operation") or "an unnamed operation")


def changed_behind(table: Path, version: int, recorded: str | None, *, app_prefix: str,
                   current: int | None = None) -> str | None:
    """Why ``table`` is not as a run of the pipeline left it at ``version`` (whose commit had
    fingerprint ``recorded``; None: not recorded, by an older release), or None when intact.
    ``current``: the table's version now, when the caller has loaded it (the commit files are
    then opened by name; else the log folder is listed, which grows with the history)."""
    log = Path(table) / "_delta_log"
    if current is None:
        try:
            names = os.listdir(log)
        except OSError:
            return None  # no log: the kind's own checks report a missing table
        versions = sorted(int(m.group(1)) for n in names if (m := _COMMIT.match(n)))
        if not versions:
            return None
        older_kept = versions[0] < version
        later = [v for v in versions if v > version]
    else:
        older_kept = version > 0 and _commit_file(table, version - 1).is_file()
        later = list(range(version + 1, current + 1))
    if recorded is not None:
        now = commit_fingerprint(table, version)
        if now is None and older_kept:
            return (f"its commit of version {version}, which a run of this pipeline left it at, "
                    f"is gone ({_commit_file(table, version)}) while older commits remain")
        if now is not None and now != recorded:
            return (f"its commit of version {version} is not the one a run of this pipeline left "
                    f"it at (fingerprint {now}, recorded {recorded}): the newest commit files were "
                    "removed and other commits took their version numbers (a maintenance run, "
                    "another writer), or the table was replaced")
    for v in later:
        try:
            data = _commit_file(table, v).read_bytes()
        except OSError:
            continue  # removed by the log retention (or never readable): nothing to compare
        op = _foreign_change(data, app_prefix)
        if op is not None:
            return (f"its commit of version {v} ({op}) changed rows after the version {version} "
                    "a run of this pipeline left it at, and was not written by this pipeline "
                    "(no Delta transaction of it; not a maintenance OPTIMIZE/VACUUM): a RESTORE, "
                    "DELETE, UPDATE or overwrite by hand or by another job, or a full refresh "
                    "that did not finish")
    return None
