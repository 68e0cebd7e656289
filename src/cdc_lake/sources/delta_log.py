"""Driver-side reading of a Delta table's commit log for the change-feed source.

The Delta log format is the protocol: ``_delta_log/<version:020>.json`` holds one JSON action
per line (``commitInfo``, ``metaData``, ``add``, ``remove``, ``cdc``, ...). Reading the commits
of a version range lets the source refuse, *before* any task runs, ranges that have no usable
change data: a rewrite without change data (overwrite/replace), a removed log entry or data
file (log retention, VACUUM), change data feed switched off, or a re-created table.

Files are read through ``pyarrow.fs`` (local paths, ``file://``, ``s3://``, ``gs://``,
``hdfs://``...). Imports nothing from Spark.

Example::

    log = DeltaLog("/lake/shop/orders")
    commits = log.check(first=5, last=9, table_id=None)   # raises ChangeFeedUnavailable
    sum(c.rows for c in commits)
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pyarrow.fs as pafs

from cdc_lake.sources.errors import DEFAULT_RECOVERY, ChangeFeedUnavailable
from cdc_lake.table_writers import rebuild_hint

CDF_KEY = "delta.enableChangeDataFeed"
# Operations that replace the table's content wholesale. Without `cdc` actions such a commit
# is a rewrite: its add/remove files are not the row changes of the source.
_REPLACE_OPERATIONS = {"CREATE OR REPLACE TABLE", "REPLACE TABLE", "CREATE OR REPLACE TABLE AS SELECT",
                       "REPLACE TABLE AS SELECT", "TRUNCATE", "RESTORE"}
_OVERWRITE_MODES = {"overwrite"}
# A rewrite that keeps every row and only changes the schema (e.g. the deltalake engine's type
# widening) may say so in its commit: delta-rs ``CommitProperties(custom_metadata={SAME_ROWS:
# "true"})`` or delta-spark ``userMetadata`` containing SAME_ROWS. Such a version has no row
# changes: the feed skips it instead of refusing it.
SAME_ROWS = "cdc_lake.same_rows"


@dataclass(frozen=True)
class Commit:
    """What the change-feed source needs to know about one table version."""

    version: int
    operation: str
    rows: int            # estimated change rows (admission control by rows)
    table_id: str | None  # metaData.id when this commit has a metaData action
    cdf: bool            # change data feed enabled after this commit
    skip: bool = False   # a rewrite tagged SAME_ROWS: no row changes, not read
    bytes: int = 0       # size of the data files its change rows are read from
    fingerprint: str = ""  # of the commit file's bytes (:func:`fingerprint`)


def fingerprint(data: bytes) -> str:
    """Identity of one commit: a hash of its ``_delta_log/<v>.json`` bytes. Commit files are
    immutable, and every commit carries its own timestamp and new file names, so the version of
    a re-created table has another fingerprint than the version it replaced."""
    return hashlib.sha256(data).hexdigest()[:20]


def _is_true(v: object) -> bool:
    return str(v).strip().lower() == "true"


def _stats_rows(action: dict) -> int:
    try:
        return int(json.loads(action.get("stats") or "{}").get("numRecords", 0))
    except (ValueError, TypeError, AttributeError):
        return 0


def _size(action: dict) -> int:
    try:
        return int(action.get("size") or 0)
    except (TypeError, ValueError):
        return 0


def _metric(m: dict, *names: str) -> int:
    for n in names:
        if m.get(n) not in (None, ""):
            try:
                return int(m[n])
            except (TypeError, ValueError):
                return 0
    return 0


def estimate_rows(info: dict, adds: list[dict], removes: list[dict]) -> int:
    """Change rows of a commit, from its metrics (both engines' names), else file statistics."""
    m = info.get("operationMetrics") or {}
    op = str(info.get("operation", ""))
    if op == "MERGE":
        return (_metric(m, "num_target_rows_inserted", "numTargetRowsInserted")
                + 2 * _metric(m, "num_target_rows_updated", "numTargetRowsUpdated")
                + _metric(m, "num_target_rows_deleted", "numTargetRowsDeleted"))
    if op == "DELETE":
        return _metric(m, "num_deleted_rows", "numDeletedRows")
    if op == "UPDATE":
        return 2 * _metric(m, "num_updated_rows", "numUpdatedRows")
    if op == "WRITE" or "STREAMING" in op:
        n = _metric(m, "num_added_rows", "numOutputRows")
        if n:
            return n
    return sum(_stats_rows(a) for a in adds) + sum(_stats_rows(r) for r in removes)


def _same_rows(info: dict) -> bool:
    return _is_true(info.get(SAME_ROWS, "false")) or SAME_ROWS in str(info.get("userMetadata") or "")


class DeltaLog:
    """Reads commits ``first..last`` of the table at ``table`` and validates them as one feed."""

    def __init__(self, table: str, recovery: str = DEFAULT_RECOVERY) -> None:
        self.table = table
        self.recovery = recovery
        uri = table if "://" in table else os.path.abspath(table)
        self.fs, root = pafs.FileSystem.from_uri(uri)
        self.root = root.rstrip("/")

    def unavailable(self, first: int | None, last: int | None, reason: str) -> ChangeFeedUnavailable:
        return ChangeFeedUnavailable(self.table, first, last, reason, self.recovery)

    def _commit_bytes(self, version: int) -> bytes | None:
        """The commit file of ``version``; None when it does not exist (any more)."""
        path = f"{self.root}/_delta_log/{version:020d}.json"
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read()
        except (FileNotFoundError, OSError) as exc:
            if isinstance(exc, FileNotFoundError) or "not found" in str(exc).lower() \
                    or "no such file" in str(exc).lower():
                return None
            raise

    def _commit_actions(self, version: int, first: int, last: int) -> tuple[list[dict], str]:
        data = self._commit_bytes(version)
        if data is None:
            path = f"{self.root}/_delta_log/{version:020d}.json"
            raise self.unavailable(first, last, f"the log entry of version {version} "
                                   f"({path}) was removed (log retention / cleanup)")
        return self._parse_commit(version, data, first, last), fingerprint(data)

    def _parse_commit(self, version: int, data: bytes, first: int, last: int) -> list[dict]:
        """The actions of a commit file; a file that is empty or not JSON lines of actions is
        damage, never "no changes" (tester: a commit emptied by hand was read as a version
        without changes, and the enrichment lost its rows with exit 0)."""
        path = f"{self.root}/_delta_log/{version:020d}.json"

        def damaged(what: str) -> ChangeFeedUnavailable:
            return self.unavailable(first, last, f"the log entry of version {version} ({path}) is "
                                    f"damaged: {what}; put the file back from a copy if you have "
                                    "one and run again, else reprocess (below)")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise damaged(f"not UTF-8 text ({e})") from None
        actions: list[dict] = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                action = json.loads(line)
            except ValueError as e:
                raise damaged(f"line {n} is not JSON ({e}; {len(data)} bytes)") from None
            if not isinstance(action, dict):
                raise damaged(f"line {n} is not a Delta action: {line[:80]!r}")
            actions.append(action)
        if not actions:
            raise damaged(f"it holds no action ({len(data)} bytes); every Delta commit holds at "
                          "least one")
        return actions

    def commit_fingerprint(self, version: int) -> str | None:
        """:func:`fingerprint` of ``version``'s commit; None when its log entry is gone."""
        data = self._commit_bytes(version)
        return None if data is None else fingerprint(data)

    def table_id_in_log(self, table_id: str) -> bool:
        """Whether a commit file still in ``_delta_log`` carries a metaData action with
        ``table_id`` (slow path for offsets written before fingerprints were recorded)."""
        sel = pafs.FileSelector(f"{self.root}/_delta_log", allow_not_found=True)
        needle = table_id.encode("utf-8")
        for fi in self.fs.get_file_info(sel):
            if not fi.base_name.endswith(".json") or not fi.base_name[:-5].isdigit():
                continue
            with self.fs.open_input_stream(fi.path) as f:
                data = f.read()
            if needle not in data:
                continue
            for line in data.decode("utf-8").splitlines():
                if '"metaData"' in line and (json.loads(line).get("metaData") or {}).get("id") == table_id:
                    return True
        return False

    def check(self, first: int, last: int, *, table_id: str | None,
              cdf_enabled_before: bool) -> list[Commit]:
        """Validate versions ``first..last`` (inclusive); return one :class:`Commit` each.

        ``cdf_enabled_before``: whether change data feed is on at version ``first - 1`` (use
        :meth:`cdf_enabled_at`). Raises :class:`ChangeFeedUnavailable` naming the first bad
        version and why.
        """
        commits: list[Commit] = []
        cdf = cdf_enabled_before
        needed: list[tuple[int, str]] = []
        for v in range(first, last + 1):
            actions, fp = self._commit_actions(v, first, last)
            info: dict = {}
            adds: list[dict] = []
            removes: list[dict] = []
            cdcs: list[dict] = []
            meta_id = None
            for a in actions:
                if "commitInfo" in a:
                    info = a["commitInfo"] or {}
                elif "metaData" in a:
                    md = a["metaData"] or {}
                    meta_id = md.get("id")
                    # a metaData action applies to its own commit, wherever it is in the file
                    cdf = _is_true((md.get("configuration") or {}).get(CDF_KEY, "false"))
                elif "add" in a and a["add"].get("dataChange", True):
                    adds.append(a["add"])
                elif "remove" in a and a["remove"].get("dataChange", True):
                    removes.append(a["remove"])
                elif "cdc" in a:
                    cdcs.append(a["cdc"])
            op = str(info.get("operation", "UNKNOWN"))
            if table_id is not None and meta_id is not None and meta_id != table_id:
                raise self.unavailable(first, last, f"version {v} ({op}) re-created the table "
                                       f"(table id {table_id} became {meta_id})")
            mode = str((info.get("operationParameters") or {}).get("mode", "")).lower()
            rewrite = (op in _REPLACE_OPERATIONS or (mode in _OVERWRITE_MODES and removes))
            if rewrite and not cdcs and _same_rows(info):
                commits.append(Commit(v, op, 0, meta_id, cdf, skip=True, fingerprint=fp))
                continue
            if rewrite and not cdcs:
                what = op + (f" ({mode})" if mode else "")
                raise self.unavailable(first, last, f"version {v} is a rewrite without change data "
                                       f"({what}, e.g. a full refresh of the upstream table)")
            if (adds or removes or cdcs) and not cdf:
                raise self.unavailable(first, last, f"version {v} ({op}) was written while "
                                       f"{CDF_KEY} was not 'true', so it has no change data "
                                       f"(enable it on the table, then reprocess)")
            files = cdcs if cdcs else adds + removes
            needed.extend((v, f["path"]) for f in files)
            commits.append(Commit(v, op, estimate_rows(info, adds, removes), meta_id, cdf,
                                  bytes=sum(_size(f) for f in files), fingerprint=fp))
        self._check_files(needed, first, last)
        return commits

    def _check_files(self, needed: list[tuple[int, str]], first: int, last: int) -> None:
        if not needed:
            return
        # relative paths only: absolute URIs (shallow clones) live on another store
        pairs = [(v, f"{self.root}/{unquote(p)}") for v, p in needed if "://" not in p]
        infos = self.fs.get_file_info([p for _, p in pairs])
        for (v, p), fi in zip(pairs, infos):
            if fi.type == pafs.FileType.NotFound:
                if self._in_current_snapshot(p):  # VACUUM removes only files no longer in it
                    raise ChangeFeedUnavailable(
                        self.table, first, last, f"version {v} needs {p}, which is gone although "
                        "the table's current version still holds it (deleted by hand, or by a "
                        "tool other than VACUUM): the table itself cannot be read", "put the "
                        "file back from a copy if you have one; else first "
                        f"{rebuild_hint(Path(self.root))}; then {self.recovery}")
                raise self.unavailable(first, last, f"version {v} needs {p}, which was removed "
                                       f"(VACUUM / retention)")

    def _in_current_snapshot(self, path: str) -> bool:
        from deltalake import DeltaTable

        try:
            current = {unquote(u.removeprefix("file://")) for u in DeltaTable(self.table).file_uris()}
        except Exception:  # noqa: BLE001 - unreadable now: the VACUUM wording stays
            return False
        return unquote(path.removeprefix("file://")) in current

    def cdf_enabled_at(self, version: int) -> bool:
        """Whether change data feed is on at ``version`` (False for version < 0).

        An old version whose log was cleaned up cannot be loaded; then the table's current
        setting is used (the commits checked afterwards still track every metaData change).
        """
        if version < 0:
            return False
        from deltalake import DeltaTable

        try:
            conf = DeltaTable(self.table, version=version).metadata().configuration or {}
        except Exception:  # noqa: BLE001 - delta-rs raises its own error types
            try:
                conf = DeltaTable(self.table).metadata().configuration or {}
            except Exception as exc:  # noqa: BLE001
                raise self.unavailable(version, version, f"the table cannot be loaded ({exc})") \
                    from None
        return _is_true(conf.get(CDF_KEY, "false"))
