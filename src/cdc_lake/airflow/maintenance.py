"""The maintenance DAG of a pipeline: ``<pipeline>__maintenance`` with one ``maintain`` task.

Created for every pipeline YAML with a ``maintenance:`` section (schedule
``maintenance.schedule``, default ``@daily``; ``null`` = manual only). The task runs
``python -m cdc_lake.maintenance --pipeline <yaml>`` (compaction, Delta checkpoint + log
cleanup, VACUUM held back by lagging change-feed readers; see :mod:`cdc_lake.maintenance`) on
the Airflow worker — delta-rs, no Spark — and returns the report (XCom) after logging it.
Exit 75 (an ingest run holds the pipeline lock) skips the task: the next scheduled run does it.
Exit 3 (a table's Delta log cannot be read; the other tables were maintained) fails the task
without a retry: the log names the table and the recovery. Exit 1 (another failure) is retried.

Example::

    dag = build_maintenance_dag(load_pipeline("pipelines/shop_maxwell.yaml"))
    dag.dag_id    # 'shop_maxwell__maintenance'
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import DAG, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from cdc_lake.airflow.hook import lock_dsn_env
from cdc_lake.airflow.subprocess_task import run_module

if TYPE_CHECKING:
    from airflow.sdk import Context

MAINTENANCE_SUFFIX = "__maintenance"
SUMMARY_PREFIX = "CDC_MAINTENANCE_SUMMARY "


class CdcMaintenanceOperator(BaseOperator):
    """Maintain every Delta table of one pipeline; returns the maintenance report."""

    ui_color = "#e2f0d9"
    template_fields = ()

    def __init__(self, *, pipeline: Any, dry_run: bool = False, timeout_s: float | None = 6 * 3600,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline, self.dry_run, self.timeout_s = pipeline, dry_run, timeout_s

    def execute(self, context: Context) -> dict[str, Any] | None:
        argv = [sys.executable, "-m", "cdc_lake.maintenance", "--pipeline", str(self.pipeline.file)]
        if self.dry_run:
            argv.append("--dry-run")
        env = lock_dsn_env(self.pipeline)  # lock: {conn_id: X}: the DSN from Airflow, as ingest
        if env:
            self.log.info("Lock backend postgres: DSN from Airflow connection %r",
                          self.pipeline.lock.conn_id)
        result = run_module(self.log, argv, summary_prefix=SUMMARY_PREFIX, timeout_s=self.timeout_s,
                            env={**os.environ, **env} if env else None)
        if result.code == 75:
            schedule = getattr(getattr(self.pipeline, "maintenance", None), "schedule", "@daily")
            then = ("the next scheduled run does it" if schedule
                    else "this DAG has no schedule: trigger it again when that run is over")
            raise AirflowSkipException(f"Pipeline {self.pipeline.name!r} is locked by a run; maintenance "
                                       f"skipped ({then}).\n" + "\n".join(result.tail[-3:]))
        if result.code == 2:
            raise AirflowFailException("Maintenance rejected the config (exit 2); not retrying:\n"
                                       + "\n".join(result.tail[-5:]))
        if result.code == 3:
            raise AirflowFailException(
                f"Maintenance of {self.pipeline.name!r}: a table or the pipeline's state needs "
                "recovery (exit 3: a Delta log that cannot be read, a table changed behind the "
                "pipeline, a data file or a table gone, or the record of the tables' versions "
                "unreadable); not retrying. The messages below name the table or file and the "
                "recovery:\n" + "\n".join(result.tail[-10:]))
        if result.code != 0:
            raise AirflowException(f"Maintenance of {self.pipeline.name!r} failed (exit {result.code}):\n"
                                   + "\n".join(result.tail[-10:]))
        r = result.summary or {}
        if self.dry_run:
            self.log.info("Maintenance of %s (dry run, nothing changed): %s files and %s "
                          "change-data files would be vacuumed", self.pipeline.name,
                          r.get("files_would_vacuum"), r.get("change_files_would_vacuum"))
        else:
            self.log.info("Maintenance of %s: files %s -> %s, bytes %s -> %s, %s files vacuumed, "
                          "%s change-data files removed",
                          self.pipeline.name, r.get("files_before"), r.get("files_after"),
                          r.get("bytes_before"), r.get("bytes_after"), r.get("files_vacuumed"),
                          r.get("change_files_vacuumed"))
        return result.summary


def build_maintenance_dag(cfg: Any, *, start_date: Any, tags: list[str]) -> DAG:
    """The maintenance DAG of ``cfg`` (which has ``cfg.maintenance``)."""
    m = cfg.maintenance
    dag = DAG(
        dag_id=f"{cfg.name}{MAINTENANCE_SUFFIX}",
        description=f"Compaction, Delta checkpoints and VACUUM for the tables of {cfg.name}",
        doc_md=(f"# Maintenance of `{cfg.name}`\n\nCompaction (target {m.target_file_mb} MB files: "
                f"{'on' if m.compact else 'off'}), Delta checkpoint + log cleanup "
                f"({'on' if m.checkpoint else 'off'}), VACUUM with retention "
                f"{m.vacuum_retention_hours} h, held back for lagging change-feed readers "
                f"({'on' if m.vacuum else 'off'}). Takes the pipeline lock: skipped while a run holds "
                "it. Report: task log and XCom. See `cdc_lake.maintenance`."),
        schedule=m.schedule,
        start_date=start_date,
        catchup=False,
        max_active_runs=1,
        tags=sorted({*tags, "maintenance"}),
    )
    CdcMaintenanceOperator(task_id="maintain", dag=dag, pipeline=cfg, owner=cfg.owner,
                           retries=1, retry_delay=timedelta(minutes=10))
    return dag
