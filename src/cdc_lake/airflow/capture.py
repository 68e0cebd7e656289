"""``CdcCaptureOperator``: the ``capture`` task of a pipeline whose YAML has a ``capture:`` section.

The DAG of such a pipeline is ``capture >> ingest``. The capture task runs the capture module
once-style — read the MariaDB/MySQL row binlog from the saved position to its current end, land
Maxwell JSON files in ``source.path``, save the position, stop::

    python -m cdc_lake.capture.mariadb_maxwell --until-now --host H --port P --user U \\
        --password-env CDC_CAPTURE_PASSWORD --out <source.path> --databases shop [--tables ...]

Host, port, login and password come from the Airflow connection ``capture.conn_id`` (default
``cdc_mariadb``, type ``mysql``); the password reaches the child process through its environment,
never its command line. Exit codes map like the ingest task's:

* ``0``: success; the ``CAPTURE_SUMMARY`` (files, events, position) is logged and returned (XCom).
* ``75`` (another capture holds the state lock): **skipped** — the holder is landing the same
  binlog; the ingest task is skipped with it (its trigger rule needs a successful capture).
* ``2`` (bad arguments, unsuitable server settings such as ``binlog_format`` not ``ROW``): fails
  without retry.
* ``3`` (a value the capture cannot land, e.g. not valid in its column's character set; the
  message names table and binlog position): fails without retry.
* anything else: fails; Airflow retries. A failed capture never runs the ingest.

Example::

    CdcCaptureOperator(task_id="capture", pipeline=load_pipeline("pipelines/shop_live.yaml"))
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from cdc_lake.airflow.subprocess_task import run_module
from cdc_lake.cdc.config import CaptureConfig, PipelineConfig

if TYPE_CHECKING:
    from airflow.sdk import Context

CAPTURE_MODULE = "cdc_lake.capture.mariadb_maxwell"
PASSWORD_ENV = "CDC_CAPTURE_PASSWORD"
SUMMARY_PREFIX = "CAPTURE_SUMMARY "
EXIT_CONFIG, EXIT_LOCKED, EXIT_NEEDS_OPERATOR = 2, 75, 3


def capture_command(cfg: PipelineConfig, *, host: str, port: int | None, user: str,
                    python: str = sys.executable) -> list[str]:
    """The capture module's argv for one once-style capture of ``cfg`` (no password in it).

    Example::

        capture_command(cfg, host="db", port=3306, user="cdc")
        # [python, '-m', 'cdc_lake.capture.mariadb_maxwell', '--until-now', '--host', 'db', ...]
    """
    cap = _capture(cfg)
    argv = [python, "-m", CAPTURE_MODULE, "--until-now", "--host", host, "--port", str(port or 3306),
            "--user", user, "--password-env", PASSWORD_ENV, "--out", str(cfg.landing_path),
            "--databases", ",".join(cap.databases), "--start", cap.start]
    if cap.tables:
        argv += ["--tables", ",".join(cap.tables)]
    if cap.server_id is not None:
        argv += ["--server-id", str(cap.server_id)]
    if cap.state_path is not None:
        argv += ["--state", str(cap.state_path)]
    return argv


def _capture(cfg: PipelineConfig) -> CaptureConfig:
    if cfg.capture is None:
        raise ValueError(f"pipeline {cfg.name!r} ({cfg.file}) has no capture: section")
    return cfg.capture


class CdcCaptureOperator(BaseOperator):
    """Land the source's binlog up to now (see the module docstring); returns the capture summary."""

    ui_color = "#f6e2c9"
    template_fields = ()

    def __init__(self, *, pipeline: PipelineConfig, timeout_s: float | None = 3600, **kwargs: Any) -> None:
        _capture(pipeline)
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.timeout_s = timeout_s

    def execute(self, context: Context) -> dict[str, Any] | None:
        cap = _capture(self.pipeline)
        conn = BaseHook.get_connection(cap.conn_id)
        if not conn.host or not conn.login:
            raise AirflowFailException(
                f"Airflow connection {cap.conn_id!r} (capture.conn_id of {self.pipeline.file}) needs "
                "a host and a login, e.g. AIRFLOW_CONN_CDC_MARIADB='mysql://cdc:secret@db:3306'")
        argv = capture_command(self.pipeline, host=conn.host, port=conn.port, user=conn.login)
        env = {**os.environ, PASSWORD_ENV: conn.password or ""}
        self.log.info("Capturing %s from %s:%s into %s", ",".join(cap.databases), conn.host,
                      conn.port or 3306, self.pipeline.landing_path)
        result = run_module(self.log, argv, summary_prefix=SUMMARY_PREFIX, env=env,
                            timeout_s=self.timeout_s)
        code, tail, summary = result.code, result.tail, result.summary
        if code == EXIT_LOCKED:
            raise AirflowSkipException(
                f"Another capture of {self.pipeline.name!r} holds the capture state lock (exit 75); "
                "it is landing the same binlog. Skipped.\n" + "\n".join(tail[-3:]))
        if code == EXIT_NEEDS_OPERATOR:
            raise AirflowFailException(
                f"Capture of {self.pipeline.name!r} stopped at a value it cannot land (exit 3); "
                "every retry would stop there again, not retrying:\n" + "\n".join(tail[-5:]))
        if code == EXIT_CONFIG:
            raise AirflowFailException(
                f"Capture of {self.pipeline.name!r} rejected its arguments or the server settings "
                "(exit 2); not retrying:\n" + "\n".join(tail[-5:]))
        if code != 0:
            raise AirflowException(f"Capture of {self.pipeline.name!r} failed (exit {code}):\n"
                                   + "\n".join(tail[-10:]))
        if summary is not None:
            self.log.info("Capture summary: %s", json.dumps(summary, sort_keys=True))
        return summary
