"""``CdcSparkSubmitOperator``: one pipeline run = one spark-submit of ``spark_jobs/cdc_ingest.py``.

How a pipeline config maps to spark-submit (all built here, from the frozen ``PipelineConfig``):

==============================  ===========================================================
spark-submit                    from
==============================  ===========================================================
``--master`` (+ deploy mode)    Airflow connection ``conn_id`` (default ``spark_default``;
                                ``local[*]`` when it is not defined)
application                     ``<repo>/spark_jobs/cdc_ingest.py``
application args                ``--pipeline <yaml> --run-id {{ run_id }}`` + validated params
``--conf``                      ``spark.conf`` of the YAML, ``spark.sql.session.timeZone=UTC``
                                (always), ``spark.pyspark.python`` = this Python unless set;
                                engine ``delta-spark`` also gets the Delta SQL extension/catalog
``--packages/--repositories``   ``engine.delta_spark`` (engine ``delta-spark`` only)
``--jars``                      every ``*.jar`` in ``engine.delta_spark.jars_dir`` (instead of
                                ``--packages``, for machines without Maven access)
``--py-files``                  a zip of the ``cdc_lake`` package the worker runs
                                (:mod:`cdc_lake.packaging`), so executors run the same code
==============================  ===========================================================

Job exit codes -> task outcome (docs/contracts.md, docs/airflow.md):

* ``0``: success; the run summary ``<storage.runs>/<pipeline>/<run id>.json`` is logged and
  returned (XCom ``return_value``); each table **the run changed** gets an Asset event through
  the pipeline's :func:`pipeline_alias`, its metrics as ``extra`` (:func:`cdc_table_changed`);
  a run that found nothing new records none.
* ``75`` (another run holds the pipeline lock): the task is **skipped** when the holder reads
  everything this run would (every landed file is older than the holder's lock); nothing was
  written, no Asset event. When files landed after the holder took the lock (which it may not
  read), or the holder is the pipeline's maintenance, the task **fails so that Airflow retries**
  it. A ``full_refresh`` run **fails without retry**, so the requested rebuild is not silently
  dropped.
* ``2`` (config or argument error): fails without retry (a retry would fail the same way).
* ``3`` (checkpoint damaged or a table deleted behind it) and ``4`` (quarantine threshold
  exceeded): fail without retry; the task log shows the job's message with the recovery.
* anything else: fails; Airflow retries with exponential backoff.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, AssetAlias
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from cdc_lake.airflow import REPO_ROOT
from cdc_lake.airflow.assets import (TableEvent, cdc_output_paths, cdc_table_changed, format_summary, json_scalars,
                                     pipeline_alias, summary_count, table_asset)
from cdc_lake.airflow.hook import DEFAULT_CONN_ID, CdcSparkSubmitHook, lock_dsn_env
from cdc_lake.airflow.params import RunParams, run_type_of, validate_run_params
from cdc_lake.airflow.submit import (build_conf, covered_by_holder, delta_jars, held_by_maintenance, lock_lines,
                                     output_lines)
from cdc_lake.cdc.config import PipelineConfig
from cdc_lake.cdc.backlog import backlog
from cdc_lake.launch import DRIVER_JAVA_OPTIONS, FULL_JIT_FROM_MB, driver_jit, launch_conf
from cdc_lake.runids import run_summary_path
from cdc_lake.summary import record_failure

if TYPE_CHECKING:
    from airflow.sdk import Context

JOB_SCRIPT = REPO_ROOT / "spark_jobs" / "cdc_ingest.py"
EXIT_CONFIG_ERROR = 2
EXIT_NEEDS_RECOVERY = 3  # damaged checkpoint / table deleted behind it (docs/run-safety.md)
EXIT_QUARANTINE_THRESHOLD = 4
EXIT_LOCK_HELD = 75


_STOPPED = ("the Airflow task was stopped while spark-submit ran (marked failed or success, "
            "cleared, or timed out); the job was killed")


class CdcSparkSubmitOperator(SparkSubmitOperator):
    """Run one CDC pipeline with spark-submit and return its run summary.

    Args:
        pipeline: the validated pipeline config (``cdc_lake.config.load_pipeline``).
        conn_id: Airflow Spark connection; ``local[*]`` if it is not defined.
        application: job script (default ``<repo>/spark_jobs/cdc_ingest.py``).
        **kwargs: any other ``SparkSubmitOperator`` / ``BaseOperator`` argument.

    Outlets: ``[pipeline_alias(pipeline.name)]`` unless ``outlets=`` is given. After a
    successful run the task adds an Asset event through the alias for each target table the run
    changed (:func:`cdc_table_changed`) and for the quarantine table if the run quarantined rows;
    Assets given as static ``outlets`` get an event on every success, as Airflow records them.

    Example::

        CdcSparkSubmitOperator(task_id="ingest", pipeline=load_pipeline("pipelines/shop_maxwell.yaml"))
    """

    ui_color = "#c9e4f6"

    def __init__(self, *, pipeline: PipelineConfig, conn_id: str = DEFAULT_CONN_ID,
                 application: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("name", f"cdc_lake-{pipeline.name}")
        kwargs.setdefault("outlets", [pipeline_alias(pipeline.name)])
        super().__init__(
            application=application or str(JOB_SCRIPT),
            application_args=["--pipeline", str(pipeline.file), "--run-id", "{{ run_id }}"],
            conf=build_conf(pipeline),
            conn_id=conn_id,
            **delta_jars(pipeline),
            **kwargs,
        )
        self.pipeline = pipeline
        self._run_params = RunParams()

    def execute(self, context: Context) -> dict[str, Any] | None:
        """Validate params, spark-submit, map the exit code, return the run summary."""
        dag_run = context.get("dag_run")
        self._run_params = validate_run_params(context["params"], table_names=list(self.pipeline.tables),
                                               conf=getattr(dag_run, "conf", None),
                                               run_type=run_type_of(dag_run))
        run_id = context["run_id"]
        if run_id.startswith("-"):  # would read as an option of the job's CLI
            raise AirflowFailException(f"Run id {run_id!r} starts with '-'; use a run id that does not")
        self.log.info("Pipeline %s, run %s, params %s", self.pipeline.name, run_id, self._run_params)
        self._ship_package()
        self._choose_driver_jit()
        self._start_try(run_id)
        try:
            super().execute(context)
        except AirflowException as e:
            self._record_unreported_failure(e)
            self._raise_for_exit_code(e)
            raise
        summary = self._read_summary(run_id)
        if summary is not None:
            self.log.info("%s", format_summary(summary))
            self._annotate_asset_events(context, summary)
        return summary

    # -- the run record of a run the job could not record itself ---------------------------------
    def _start_try(self, run_id: str) -> None:
        self._try_run_id, self._try_started = run_id, datetime.now(timezone.utc)

    def _recorded_by_job(self) -> bool:
        """Whether the job wrote this try's run record (``<run id>.json`` newer than its start)."""
        path = run_summary_path(self.pipeline.runs_path, self.pipeline.name, self._try_run_id)
        try:
            return path.stat().st_mtime >= self._try_started.timestamp() - 1
        except OSError:
            return False

    def _record_unreported_failure(self, error: BaseException | str) -> None:
        """A run that ended without its own record (driver killed, config refused before the
        job's lock, task killed by Airflow) gets a ``failed`` one, so the status view and
        ``latest.json`` do not go on showing the previous run as the last (tester, 2026-11-29:
        "succeeded" after a killed and a marked-failed run). Not for exit 75: a run that met the
        lock ran nothing; the holder records."""
        if getattr(self, "_try_started", None) is None:
            return
        hook = getattr(self, "_hook", None)
        code = hook.returncode if isinstance(hook, CdcSparkSubmitHook) else None
        if code == EXIT_LOCK_HELD or self._recorded_by_job():
            return
        tail = hook.output_tail if isinstance(hook, CdcSparkSubmitHook) else []
        if getattr(self, "_stopped_by_airflow", False):
            # on_kill and execute's own failure both get here, in either order (the killed
            # spark-submit wakes execute's thread): the first record is kept, so both say why
            error = _STOPPED
        why = error if isinstance(error, str) else (
            f"spark-submit ended with exit code {code} and the job wrote no run record "
            f"(killed, or stopped before its lock): {str(error)[:300]}")
        last = output_lines(tail, "ERROR", "Error", "NEEDS", "Killed")
        record_failure(self.pipeline.runs_path, self.pipeline.name, {
            "pipeline": self.pipeline.name, "run_id": self._try_run_id, "status": "failed",
            "error": (why + (f"; the job's last message(s):{last}" if last else ""))[:2000],
            "recorded_by": "airflow",
            "started_at": self._try_started.isoformat(timespec="seconds"),
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})

    def on_kill(self) -> None:
        """Airflow stops the task (marked failed, timed out, cleared): stop spark-submit, then
        record the run as failed unless the job recorded it."""
        self._stopped_by_airflow = True
        try:
            super().on_kill()
        finally:
            self._record_unreported_failure(_STOPPED)

    def _choose_driver_jit(self) -> None:
        """The driver JVM's JIT for this run's backlog (:func:`cdc_lake.launch.launch_conf`):
        C1 only for a short run, the full JIT from ``spark.full_jit_from_mb`` of landed input
        the run will read. A pipeline that sets ``spark.driver.defaultJavaOptions`` decides."""
        if DRIVER_JAVA_OPTIONS in self.pipeline.spark_conf:
            return
        pending = backlog(self.pipeline, full_refresh=self._run_params.full_refresh)
        self._set_launch_options(pending.bytes if pending else None,
                                 f"{pending.files} files, {pending.bytes / 2**20:.1f} MiB" if pending else "unknown")

    def _set_launch_options(self, backlog_bytes: int | None, described: str) -> None:
        """The driver JVM options of this run (:func:`cdc_lake.launch.launch_conf`): the JIT
        for ``backlog_bytes`` and the class-data-sharing archive when one is built for this
        environment (:mod:`cdc_lake.jvm_archive`), read on the worker at execute time."""
        from cdc_lake.jvm_archive import option

        archive = option()
        chosen = launch_conf(backlog_bytes, getattr(self.pipeline, "full_jit_from_mb", FULL_JIT_FROM_MB),
                             archive=archive)
        conf = {k: v for k, v in (self.conf or {}).items() if k != DRIVER_JAVA_OPTIONS}
        self.conf = {**conf, **chosen}
        self.log.info("Backlog %s: driver JIT %s, JVM class archive %s", described,
                      "C1 only" if driver_jit(chosen.get(DRIVER_JAVA_OPTIONS, "")) == "C1"
                      else "C1+C2 (JVM default)", archive or "none (python -m cdc_lake.jvm_archive status)")

    def _ship_package(self) -> None:
        """``--py-files``: the ``cdc_lake`` package the driver runs, for executor Python workers.

        Built at execute time (never at DAG parse time); see :mod:`cdc_lake.packaging`.
        """
        from cdc_lake.packaging import package_zip

        shipped = str(package_zip())
        self._shipped_zip = shipped
        if shipped not in (self.py_files or "").split(","):
            self.py_files = ",".join(p for p in ((self.py_files or ""), shipped) if p)
        self.log.info("Shipping the cdc_lake package to executors: --py-files %s", self.py_files)
        self._export_lock_dsn()

    def _export_lock_dsn(self) -> None:
        """``lock: {backend: postgres, conn_id: X}`` without a DSN: the job reads the DSN from
        ``CDC_LOCK_DSN``, exported here from the Airflow connection (metadata DB, secrets backend
        or env) into spark-submit's environment (the driver's, on YARN/Kubernetes)."""
        env = lock_dsn_env(self.pipeline)
        if env:
            self.env_vars = {**(self.env_vars or {}), **env}
            self.log.info("Lock backend postgres: DSN from Airflow connection %r",
                          self.pipeline.lock.conn_id)
        if not any(os.environ.get(v) for v in ("LC_ALL", "LC_CTYPE", "LANG")) \
                and not any((self.env_vars or {}).get(v) for v in ("LC_ALL", "LC_CTYPE", "LANG")):
            # a worker without a locale (systemd, cron, slim images): the driver JVM would take
            # file names as ASCII and skip landing files with other characters (tester)
            self.env_vars = {**(self.env_vars or {}), "LANG": "C.UTF-8"}
            self.log.info("No locale in the worker's environment: spark-submit gets LANG=C.UTF-8")

    def _get_hook(self) -> CdcSparkSubmitHook:
        hook = self._build_hook()
        hook.driver_pythonpath = getattr(self, "_shipped_zip", None)
        return hook

    def _build_hook(self) -> CdcSparkSubmitHook:
        return CdcSparkSubmitHook(
            conf=self.conf,
            conn_id=self._conn_id,
            files=self.files,
            py_files=self.py_files,
            archives=self._archives,
            driver_class_path=self.driver_class_path,
            jars=self.jars,
            java_class=self._java_class,
            packages=self.packages,
            exclude_packages=self.exclude_packages,
            repositories=self._repositories,
            total_executor_cores=self._total_executor_cores,
            executor_cores=self._executor_cores,
            executor_memory=self._executor_memory,
            driver_memory=self._driver_memory,
            keytab=self.keytab,
            principal=self.principal,
            proxy_user=self.proxy_user,
            name=self.name,
            num_executors=self._num_executors,
            status_poll_interval=self._status_poll_interval,
            application_args=[*(self.application_args or []), *self._run_params.to_cli_args()],
            env_vars=self.env_vars,
            verbose=self._verbose,
            spark_binary=self._spark_binary,
            properties_file=self.properties_file,
            yarn_queue=self._yarn_queue,
            deploy_mode=self._deploy_mode,
            use_krb5ccache=self._use_krb5ccache,
            post_submit_commands=self.post_submit_commands,
            track_driver_via_k8s_api=self._track_driver_via_k8s_api,
            yarn_track_via_rm_api=self._yarn_track_via_rm_api,
            yarn_rm_auth=self._yarn_rm_auth,
        )

    def _raise_for_exit_code(self, error: AirflowException) -> None:
        """Turn the job's exit codes 75 and 2 into skip / fail-without-retry; others stay failures."""
        hook = self._hook
        if not isinstance(hook, CdcSparkSubmitHook):
            return
        code = hook.returncode
        if code == EXIT_LOCK_HELD:
            holder = lock_lines(hook.output_tail)
            message = (f"Pipeline {self.pipeline.name!r} is locked by another run (job exit code 75); "
                       "nothing was written by this run.")
            if self._run_params.full_refresh:
                raise AirflowFailException(
                    f"{message} This run asked for {self._run_params.to_cli_args()}: trigger it again "
                    f"when the other run has finished.{holder}") from error
            if held_by_maintenance(hook.output_tail):  # it ingests nothing: the data would wait
                raise AirflowException(
                    f"{message} The holder is the pipeline's maintenance, which ingests nothing: "
                    f"failing so that Airflow retries this run once it is done.{holder}") from error
            covered, why = covered_by_holder(hook.output_tail, folders=[self.pipeline.landing_path])
            if not covered:
                raise AirflowException(
                    f"{message} {why}: failing so that Airflow retries this run once the holder "
                    f"is done.{holder}") from error
            raise AirflowSkipException(
                f"{message} Skipped: the lock holder is processing the pipeline (every landed "
                f"file is older than its lock).{holder}") from error
        if code == EXIT_CONFIG_ERROR:
            raise AirflowFailException(
                f"Pipeline {self.pipeline.name!r}: the job rejected its config or arguments (exit code 2); "
                f"not retrying. The job's message:"
                f"{output_lines(hook.output_tail, 'CONFIG ERROR', 'ARGUMENT ERROR') or ' ' + str(error)}") from error
        if code == EXIT_NEEDS_RECOVERY:
            raise AirflowFailException(
                f"Pipeline {self.pipeline.name!r}: its checkpoint or a table it wrote needs recovery "
                f"(exit code 3); not retrying. The job's message names the recovery:"
                f"{output_lines(hook.output_tail, 'RECOVERY', 'NEEDS')}") from error
        if code == EXIT_QUARANTINE_THRESHOLD:
            raise AirflowFailException(
                f"Pipeline {self.pipeline.name!r}: the run quarantined more than the pipeline's quarantine "
                f"threshold allows (exit code 4); the data it wrote is kept, a retry would find nothing "
                f"new. Inspect the quarantine table, then fix the producer or raise the threshold:"
                f"{output_lines(hook.output_tail, 'quarantin')}") from error

    def _read_summary(self, run_id: str) -> dict[str, Any] | None:
        path = run_summary_path(self.pipeline.runs_path, self.pipeline.name, run_id)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.log.warning("The job succeeded but wrote no run summary at %s (is storage.runs on storage "
                             "this worker can read?)", path)
        except (OSError, ValueError) as e:
            self.log.warning("Could not read run summary %s: %s", path, e)
        return None

    def output_assets(self) -> list[Asset]:
        """Every Asset a run of this task can add an event for (lineage; docs, tests)."""
        return [table_asset(p) for p in cdc_output_paths(self.pipeline)]

    def _table_events(self, summary: dict[str, Any]) -> list[TableEvent]:
        """The targets in the summary (a subset full refresh lists only its tables) and the
        quarantine table, each with its metrics and whether this run changed it."""
        common = {"pipeline": self.pipeline.name, "run_id": summary.get("run_id")}
        full_refresh = summary.get("full_refresh") is True
        tables = summary.get("tables") or {}
        found = []
        for name, table in self.pipeline.tables.items():
            metrics = tables.get(name)
            if isinstance(metrics, dict):
                found.append(TableEvent(table.path, {**common, **json_scalars(metrics)},
                                        cdc_table_changed(metrics, full_refresh=full_refresh)))
        found.append(TableEvent(self.pipeline.quarantine_path, {
            **common, **json_scalars({"quarantined": summary.get("quarantined"),
                                       "delta_version": summary.get("quarantine_version")})},
            summary_count(summary.get("quarantined")) > 0))
        return found

    def _annotate_asset_events(self, context: Context, summary: dict[str, Any]) -> None:
        """Record the run's Asset events (downstream DAGs read the metrics as ``extra``).

        Through this pipeline's alias: one event per table the run changed, none for the
        others. An Asset declared as a static outlet (``outlets=[table_asset(p)]`` by the
        caller) gets its event from Airflow on every success; only its ``extra`` is set here.
        """
        events = context.get("outlet_events")
        if events is None:
            return
        outlets = list(self.outlets or [])
        static = {o.uri for o in outlets if isinstance(o, Asset)}
        alias = pipeline_alias(self.pipeline.name)
        has_alias = any(isinstance(o, AssetAlias) and o.name == alias.name for o in outlets)
        recorded = []
        for event in self._table_events(summary):
            asset = table_asset(event.path)
            if asset.uri in static:
                events[asset].extra = event.extra
            elif event.changed and has_alias:
                events[alias].add(asset, extra=event.extra)
                recorded.append(asset.uri)
        if has_alias:
            self.log.info("Asset events handed to Airflow (tables this run changed; recorded "
                          "when the task's success is): %s",
                          ", ".join(recorded) if recorded else "none: the run changed no table")
