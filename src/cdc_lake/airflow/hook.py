"""``CdcSparkSubmitHook``: the provider's ``SparkSubmitHook`` with a local default master.

The provider falls back to ``yarn`` when the Spark connection does not exist. cdc-lake's default
is a single machine, so a missing connection means ``local[*]`` here; pointing the pipelines at
a cluster is done by defining the connection only (``spark://host:7077``, ``yarn``,
``k8s://https://host:443``), never by editing a DAG.

Everything else (command building, masking, log streaming, killing, cluster tracking) is the
provider's code, unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowNotFoundException

DEFAULT_CONN_ID = "spark_default"
DEFAULT_MASTER = "local[*]"


class CdcSparkSubmitHook(SparkSubmitHook):
    """A ``SparkSubmitHook`` whose master is ``local[*]`` when the connection is not defined.

    Also exposes the spark-submit exit code and output tail, so the operator can map the job's
    exit codes (docs/contracts.md) to task outcomes.
    """

    driver_pythonpath: str | None = None
    """Prepended to ``PYTHONPATH`` of spark-submit in client/local mode (the package zip): the
    Python processes the driver JVM starts itself (e.g. a Python streaming source's planner,
    run with ``spark.pyspark.python``) do not see ``--py-files`` otherwise. In cluster deploy
    mode the driver runs elsewhere and this is not applied (``--py-files`` is)."""

    def _build_spark_submit_command(self, application: str) -> list[str]:
        cmd = super()._build_spark_submit_command(application)
        if self.driver_pythonpath and self._connection.get("deploy_mode") != "cluster":
            existing = (self._env or {}).get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
            self._env = {**(self._env or {}),
                         "PYTHONPATH": os.pathsep.join(p for p in (self.driver_pythonpath, existing) if p)}
        return cmd

    def _resolve_connection(self) -> dict[str, Any]:
        data = super()._resolve_connection()
        try:
            self.get_connection(self._conn_id)
        except AirflowNotFoundException:
            self.log.info("Spark connection %r is not defined; using master %s", self._conn_id, DEFAULT_MASTER)
            data["master"] = DEFAULT_MASTER
        return data

    @property
    def returncode(self) -> int | None:
        """Exit code of the last spark-submit process (``None`` before it ran or while running)."""
        return self._submit_sp.returncode if self._submit_sp is not None else None

    @property
    def output_tail(self) -> Sequence[str]:
        """The last lines spark-submit printed (driver output in client mode), secrets masked."""
        return [self._mask_cmd([line]) for line in self._last_submit_log_lines]


def lock_dsn_env(pipeline: Any) -> dict[str, str]:
    """``{"CDC_LOCK_DSN": uri}`` for a pipeline with ``lock: {backend: postgres, conn_id: X}`` and
    no ``dsn``: the connection read from Airflow (metadata DB, secrets backend or env), for the
    environment of the process that takes the lock (spark-submit, the maintenance module);
    ``{}`` otherwise. Example::

        env = {**os.environ, **lock_dsn_env(cfg)}
    """
    lock = getattr(pipeline, "lock", None)
    if lock is None or lock.backend != "postgres" or lock.dsn or not lock.conn_id:
        return {}
    from airflow.sdk import BaseHook

    return {"CDC_LOCK_DSN": BaseHook.get_connection(lock.conn_id).get_uri()}

