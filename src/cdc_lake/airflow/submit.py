"""A pipeline's spark-submit, shared by every kind's operator: its ``--conf`` and Delta jars from
the YAML, and what the job's driver output says when it stops (which lock holder, which config
error, which recovery), for the task log.

Example::

    build_conf(cfg)["spark.sql.session.timeZone"]   # 'UTC' (always)
    held_by_maintenance(hook.output_tail)            # the lock holder is a maintenance run
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
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


def held_by_maintenance(tail: Sequence[str]) -> bool:
    """The job's lock message names a maintenance run as the holder (not an ingest run, which
    would process what this run was to process)."""
    return any(_MAINTENANCE_HOLDER.search(line) for line in tail if _LOCK_WORD.search(line))


def lock_lines(tail: Sequence[str]) -> str:
    """The job's lock message (names the holder's pid, host, run id, start) from the driver output."""
    lines = [line for line in tail if _LOCK_WORD.search(line)]
    return ("\n" + "\n".join(lines[-3:])) if lines else ""
