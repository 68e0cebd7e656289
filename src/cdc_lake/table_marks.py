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

* every commit file a reader replays (after the table's last Delta checkpoint, else from
  version 0, up to the current version) must hold an action. A Delta writer never writes an
  empty commit file, and readers take one as a commit without actions: an older commit emptied
  (``: > _delta_log/<v>.json``) loaded "fine" without that commit's adds and removes (tester:
  248 rows, 89 keys twice, stale values, exit 0). Only zero-byte or blank files count: a commit
  of only ``commitInfo`` (or ``txn``) is valid Delta. A later complete overwrite (a full
  refresh: ``WRITE`` mode ``Overwrite`` without predicate, or ``REPLACE TABLE``; not one tagged
  as keeping the same rows, which copied the damaged rows) replaced every row, so an empty
  commit before it no longer matters and the recovery converges.

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
# Classic (``<v>.checkpoint.parquet``), multi-part (``<v>.checkpoint.<i>.<n>.parquet``) and V2
# (``<v>.checkpoint.<uuid>.json|parquet``) checkpoints.
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.[^/]+)?\.(?:parquet|json)$")
# A commit file smaller than this is read to see whether it holds anything but blank space (a
# written one is larger: every writer's commitInfo carries a timestamp and an operation).
_TINY = 32
# Operations that replace every row of the table (see _replaces_all_rows).
_REPLACE_OPERATIONS = {"CREATE OR REPLACE TABLE", "REPLACE TABLE",
                       "CREATE OR REPLACE TABLE AS SELECT", "REPLACE TABLE AS SELECT"}


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


def latest_commit(table: Path | str) -> int | None:
    """The newest commit version of the Delta table at ``table``, from the names of its
    ``_delta_log/<version>.json`` files (the Delta protocol: any engine wrote them; no log
    replay), or None when there is no such file (or the log cannot be listed). Example::

        latest_commit(Path("/lake/orders"))  # 7
    """
    try:
        names = os.listdir(Path(table) / "_delta_log")
    except OSError:
        return None
    return max((int(m.group(1)) for n in names if (m := _COMMIT.match(n))), default=None)


def commit_fingerprint(table: Path, version: int) -> str | None:
    """Fingerprint of the table's commit ``version`` (None when its file cannot be read)."""
    try:
        return fingerprint(_commit_file(table, version).read_bytes())
    except OSError:
        return None


def _foreign_change(data: bytes, app_prefix: str) -> str | None:
    """The operation of a commit that changed rows without being the pipeline's, else None."""
    changes, own, info, foreign = False, False, {}, ""
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
        elif isinstance(txn, dict) and txn.get("appId"):
            foreign = str(txn["appId"])
        if isinstance(action.get("commitInfo"), dict):
            info = action["commitInfo"]
    same_rows = (str(info.get(SAME_ROWS, "")).strip().lower() == "true"
                 or SAME_ROWS in str(info.get("userMetadata") or ""))
    if not changes or own or same_rows:
        return None
    op = str(info.get("operation") or "an unnamed operation")
    # (tester: two CDC YAMLs sharing one storage.root, run by hand: the message did not say
    # that the commit was another pipeline's)
    return op if not foreign else f"{op} in Delta transaction {foreign!r}"


def _last_checkpoint(log: Path) -> int:
    """The version ``_delta_log/_last_checkpoint`` names (-1: none, or unreadable)."""
    try:
        v = json.loads((log / "_last_checkpoint").read_bytes()).get("version")
        return v if isinstance(v, int) and v >= 0 else -1
    except (OSError, ValueError, AttributeError):
        return -1


def _blank(f: Path) -> int | None:
    """The size of commit file ``f`` when it holds no action (zero bytes, or only blank space),
    else None (also when it cannot be read: gone by log retention, as elsewhere here)."""
    try:
        size = f.stat().st_size
        if size == 0:
            return 0
        if size < _TINY and not f.read_bytes().strip():
            return size
    except OSError:
        pass
    return None


def _replaces_all_rows(data: bytes) -> bool:
    """Whether a commit replaced every row of the table with rows not read from it: a
    ``WRITE`` in ``Overwrite`` mode without a predicate (delta-rs, delta-spark; a full refresh)
    or a ``REPLACE TABLE``. Not a rewrite tagged as keeping the same rows (it copied the rows
    the table had, lost commits and all) nor a partial (predicate, dynamic partition)
    overwrite."""
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            info = json.loads(line).get("commitInfo")
        except (ValueError, AttributeError):
            continue
        if not isinstance(info, dict):
            continue
        if (str(info.get(SAME_ROWS, "")).strip().lower() == "true"
                or SAME_ROWS in str(info.get("userMetadata") or "")):
            return False
        op = str(info.get("operation") or "")
        if op in _REPLACE_OPERATIONS:
            return True
        params = info.get("operationParameters")
        if op != "WRITE" or not isinstance(params, dict):
            return False
        partial = any(str(params.get(k, "")).strip().lower() not in ("", "none", "null", "false")
                      for k in ("predicate", "replaceWhere", "dynamicPartitionOverwrite",
                                "isDynamicPartitionOverwrite"))
        return str(params.get("mode", "")).lower() == "overwrite" and not partial
    return False


def _empty_commit(table: Path, current: int) -> str | None:
    """Why a commit file a reader of ``table`` at version ``current`` replays holds no action
    (the first such), else None. Cheap when intact: one stat per commit after the last
    checkpoint (named by ``_last_checkpoint``), no listing; only when a blank file is found is
    the log listed (a checkpoint at or after it: not replayed) and the commits after it read
    (a complete overwrite after it: no longer matters)."""
    log = Path(table) / "_delta_log"
    start = _last_checkpoint(log)
    start = start + 1 if start <= current else 0  # a hint above the table: not its checkpoint
    blank = [(v, size) for v in range(start, current + 1)
             if (size := _blank(_commit_file(table, v))) is not None]
    if not blank:
        return None
    try:  # _last_checkpoint is a hint: readers also find a checkpoint by listing
        cps = [int(m.group(1)) for n in os.listdir(log) if (m := _CHECKPOINT.match(n))]
    except OSError:
        cps = []
    cp = max((c for c in cps if c <= current), default=-1)
    blank = [(v, size) for v, size in blank if v > cp]
    if blank:
        for v in range(current, blank[0][0], -1):
            try:
                data = _commit_file(table, v).read_bytes()
            except OSError:
                continue
            if _replaces_all_rows(data):
                blank = [(b, size) for b, size in blank if b > v]
                break
    if not blank:
        return None
    v, size = blank[0]
    more = (f" (and {len(blank) - 1} more: version{'s' if len(blank) > 2 else ''} "
            f"{', '.join(str(b) for b, _ in blank[1:])})" if len(blank) > 1 else "")
    return (f"its commit file {_commit_file(table, v)} (version {v}) is empty "
            f"({size} bytes{'' if size == 0 else ', blank'}){more}: the table's log lost that "
            "commit's actions, so the table would be read without them (a Delta writer never "
            "writes an empty commit file: emptied by hand, a failed copy or disk trouble)")


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
    if (why := _empty_commit(table, current if current is not None else versions[-1])):
        return why
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
            if " in Delta transaction " in op:
                return (f"its commit of version {v} ({op}) changed rows after the version "
                        f"{version} a run of this pipeline left it at, and was written by another "
                        f"writer (its transaction id is not this pipeline's, {app_prefix}...): "
                        "another pipeline or job writes this table; when its id starts with cdc- "
                        "or enrich-, that pipeline's YAML names the same table path as this one "
                        "(a shared storage.root, or tables.<t>.path / outputs): give each "
                        "pipeline its own folder")
            return (f"its commit of version {v} ({op}) changed rows after the version {version} "
                    "a run of this pipeline left it at, and was not written by this pipeline "
                    "(no Delta transaction of it; not a maintenance OPTIMIZE/VACUUM): a RESTORE, "
                    "DELETE, UPDATE or overwrite by hand or by another job, or a full refresh "
                    "that did not finish")
    return None


def checkpoint_bypass(table: Path) -> str | None:
    """For a table whose log cannot be loaded: the shell command that moves its Delta
    checkpoint files (and ``_last_checkpoint``) aside when every commit file from version 0 on
    is still there and not empty, else None. Readers then replay the commits: the same table,
    nothing lost (a checkpoint only summarizes them). Moving the whole table aside and rebuilding
    it was the only advice before (tester: a ``_last_checkpoint`` naming a missing checkpoint,
    a corrupt checkpoint parquet). Example::

        checkpoint_bypass(Path("/lake/orders"))  # "mkdir '/lake/orders.delta-checkpoints...' && mv ..."
    """
    from datetime import datetime, timezone

    from cdc_lake.paths import q

    log = Path(table) / "_delta_log"
    try:
        names = os.listdir(log)
    except OSError:
        return None
    aside = sorted(n for n in names if n == "_last_checkpoint" or _CHECKPOINT.match(n))
    versions = sorted(int(m.group(1)) for n in names if (m := _COMMIT.match(n)))
    if not aside or not versions or versions != list(range(versions[-1] + 1)):
        return None
    if any(_blank(_commit_file(table, v)) is not None for v in versions):
        return None
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = f"{table}.delta-checkpoints.damaged-{stamp}"
    return (f"mkdir {q(dest)} && mv {' '.join(q(log / n) for n in aside)} {q(dest)}")
