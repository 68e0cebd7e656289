"""A pipeline's spark-submit, shared by every kind's operator: its ``--conf`` and Delta jars from
the YAML, and what the job's driver output says when it stops (which lock holder, which config
error, which recovery), for the task log.

Example::

    build_conf(cfg)["spark.sql.session.timeZone"]   # 'UTC' (always)
    held_by_maintenance(hook.output_tail)            # the lock holder is a maintenance run
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from cdc_lake.launch import LAUNCH_CONF

if TYPE_CHECKING:
    from cdc_lake.cdc.config import PipelineConfig

_LOCK_WORD = re.compile(r"\block(ed|s)?\b", re.IGNORECASE)  # not "BlockManager"
DELTA_SQL_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def build_conf(cfg: PipelineConfig) -> dict[str, str]:
    """``--conf`` of a pipeline's spark-submit: ``spark.conf`` of the YAML, the Delta SQL extension
    for engine ``delta-spark``, this Python for PySpark, the launch defaults, the UTC session zone."""
    conf = dict(cfg.spark_conf)
    if cfg.engine == "delta-spark":
        for key, value in DELTA_SQL_CONF.items():
            conf.setdefault(key, value)
    conf.setdefault("spark.pyspark.python", sys.executable)
    for key, value in LAUNCH_CONF.items():
        conf.setdefault(key, value)
    conf["spark.sql.session.timeZone"] = "UTC"  # the Delta tables' timestamps are UTC by contract
    return conf


def delta_jars(cfg: PipelineConfig) -> dict[str, str | None]:
    """``packages``/``repositories`` or ``jars`` for engine ``delta-spark``; nothing otherwise."""
    if cfg.engine != "delta-spark":
        return {}
    ds = cfg.delta_spark
    if ds.jars_dir is not None:
        jars = sorted(str(p) for p in ds.jars_dir.glob("*.jar"))
        return {"jars": ",".join(jars) or None}
    return {"packages": ds.packages, "repositories": ds.repositories}


def output_lines(tail: Sequence[str], *words: str) -> str:
    """The driver output lines mentioning any of ``words`` (case-insensitive), last 8."""
    lines = [line for line in tail if any(w.lower() in line.lower() for w in words)]
    return ("\n" + "\n".join(lines[-8:])) if lines else ""


_MAINTENANCE_HOLDER = re.compile(r'"run_id":\s*"maintenance-')  # cdc_lake.maintenance's run id
# the holder's lock time in the job's lock message: the file lock's JSON ("since": "...") or the
# PostgreSQL lock's text (since=...)
_HOLDER_SINCE = re.compile(r'since"?\s*[:=]\s*"?(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)')


def held_by_maintenance(tail: Sequence[str]) -> bool:
    """The job's lock message names a maintenance run as the holder (not an ingest run, which
    would process what this run was to process)."""
    return any(_MAINTENANCE_HOLDER.search(line) for line in tail if _LOCK_WORD.search(line))


def lock_lines(tail: Sequence[str]) -> str:
    """The job's lock message (names the holder's pid, host, run id, start) from the driver output."""
    lines = [line for line in tail if _LOCK_WORD.search(line)]
    return ("\n" + "\n".join(lines[-3:])) if lines else ""


def holder_since(tail: Sequence[str]) -> datetime | None:
    """When the lock holder named in the job's lock message took the lock (UTC), or None."""
    for line in reversed(tail):
        m = _HOLDER_SINCE.search(line) if _LOCK_WORD.search(line) else None
        if m:
            return datetime.fromisoformat(m.group(1)).replace(tzinfo=timezone.utc)
    return None


def landed_after(since: datetime, folders: Sequence[Path] = (), tables: Sequence[Path] = ()) -> list[str]:
    """Input a run that took the lock at ``since`` may not have seen: visible files directly in
    ``folders`` (landing / event folders) and commits of the Delta ``tables`` (change feeds)
    modified at or after it. A run fixes what it reads (Trigger.AvailableNow) only after it has
    the lock, so anything older is the holder's; a folder that cannot be listed counts as new,
    one that does not exist as empty."""
    limit = since.timestamp()
    found: list[str] = []
    for folder, pattern in [*((f, None) for f in folders), *((t / "_delta_log", ".json") for t in tables)]:
        try:
            with os.scandir(folder) as entries:
                for e in entries:
                    if e.name.startswith((".", "_")) or (pattern and not e.name.endswith(pattern)):
                        continue
                    if e.is_file() and e.stat().st_mtime >= limit:
                        found.append(str(Path(folder) / e.name))
        except FileNotFoundError:
            continue  # no folder, no table yet: nothing landed
        except OSError:
            found.append(f"{folder} (could not be listed)")
    return sorted(found)


def covered_by_holder(tail: Sequence[str], folders: Sequence[Path] = (),
                      tables: Sequence[Path] = ()) -> tuple[bool, str]:
    """Whether the run holding the lock reads everything this run would: (True, "") or
    (False, why). Tester, 2026-11-29: runs of a backfill that met the lock were skipped (green)
    while files landed after the holder had started waited, unread, for the next run."""
    since = holder_since(tail)
    if since is None:
        return False, "the lock message does not say when the holder started"
    newer = landed_after(since, folders, tables)
    if not newer:
        return True, ""
    shown = ", ".join(newer[:3]) + (f" and {len(newer) - 3} more" if len(newer) > 3 else "")
    return False, (f"{len(newer)} input file(s) landed after the holder took the lock at "
                   f"{since.isoformat()} ({shown}); the holder may not read them")
