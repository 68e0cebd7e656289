"""Operators for the enrichment and dimension-refresh kinds (subclasses of the CDC operator).

Both spark-submit their job exactly like :class:`~cdc_lake.airflow.operator.CdcSparkSubmitOperator`
(master from the Spark connection, ``spark.conf`` of the YAML, UTC, Delta jars for engine
``delta-spark``, ``--py-files`` with the ``cdc_lake`` package); what differs:

=========================  ============================================  ==========================================
                           :class:`EnrichSparkSubmitOperator`            :class:`DimensionRefreshOperator`
=========================  ============================================  ==========================================
application                ``spark_jobs/enrich.py``                      ``spark_jobs/dimension_refresh.py``
application args           ``--pipeline Y --run-id {{ run_id }}``        ``--pipeline Y --date {{ ds }} --run-id {{ run_id }}``
                           (+ ``--reprocess`` when the run param is set)
outlets                    AssetAlias ``cdc_lake:<pipeline>``            AssetAlias ``cdc_lake:<pipeline>``
Asset events (through it)  the outputs that got a new Delta version:     the dimension table, if the run changed
                           enriched, pending, aggregates, quarantine     rows or widened a column
exit 75 (locked)           **skipped**: the holder processes everything   **fails, retried**: this date must still
                           new since the checkpoint                      be applied (a skip would let the next
                                                                         date run and this one be lost)
exit 2 (config)            fails, no retry                               fails, no retry
exit 3                     fails, no retry (change feed unavailable /    fails, no retry (invalid snapshot:
                           upstream rewritten: needs ``--reprocess``)    NULL/duplicate keys, a lost column)
exit 66                    —                                             fails, retried (snapshot not landed yet)
other                      fails, retried with backoff                   fails, retried with backoff
=========================  ============================================  ==========================================

Example::

    EnrichSparkSubmitOperator(task_id="enrich", pipeline=load_pipeline("pipelines/shop_order_lines.yaml"))
    DimensionRefreshOperator(task_id="refresh", pipeline=load_pipeline("pipelines/product_categories.yaml"))
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from cdc_lake.airflow import REPO_ROOT
from cdc_lake.airflow.hook import DEFAULT_CONN_ID, CdcSparkSubmitHook
from cdc_lake.airflow.assets import TableEvent, delta_version, json_scalars, pipeline_alias, summary_count, table_asset
from cdc_lake.airflow.operator import CdcSparkSubmitOperator
from cdc_lake.airflow.params import RunParams, refuse_in_backfill, run_type_of, unknown_conf_message
from cdc_lake.airflow.submit import build_conf, covered_by_holder, delta_jars, held_by_maintenance, lock_lines
from cdc_lake.launch import DRIVER_JAVA_OPTIONS

if TYPE_CHECKING:
    from airflow.sdk import Context

ENRICH_JOB = REPO_ROOT / "spark_jobs" / "enrich.py"
DIMENSION_JOB = REPO_ROOT / "spark_jobs" / "dimension_refresh.py"
ENRICH_PARAMS = ("reprocess",)


def enrich_output_paths(cfg: Any) -> dict[str, Path]:
    """Tables an enrichment pipeline writes that others may schedule on, by output name."""
    outs = dict(getattr(cfg, "output_tables", {}) or {})
    outs.pop("manifest", None)  # bookkeeping, not data to schedule on
    return outs


class _KindOperator(CdcSparkSubmitOperator):
    """Shared ``execute``: no CDC params, spark-submit, exit-code mapping, run summary -> XCom,
    Asset events through the pipeline's alias for the outputs the run changed (``_table_events``)."""

    kind_label = "job"

    def __init__(self, *, pipeline: Any, application: str, application_args: list[str],
                 conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        kwargs.setdefault("outlets", [pipeline_alias(pipeline.name)])
        # SparkSubmitOperator's constructor directly: the CDC one reads CDC-only config.
        SparkSubmitOperator.__init__(
            self, application=application, application_args=application_args,
            conf=build_conf(pipeline), conn_id=conn_id, **delta_jars(pipeline), **kwargs)
        self.pipeline = pipeline
        self._run_params = RunParams()

    def _extra_args(self, context: Context) -> list[str]:
        return []

    def execute(self, context: Context) -> dict[str, Any] | None:
        run_id = context["run_id"]
        if run_id.startswith("-"):  # would read as an option of the job's CLI
            raise AirflowFailException(f"Run id {run_id!r} starts with '-'; use a run id that does not")
        extra = self._extra_args(context)
        # CdcSparkSubmitOperator._get_hook appends these to the application args
        self._run_params = _CliArgs(extra)  # type: ignore[assignment]
        self.log.info("%s %s, run %s, extra args %s", self.kind_label, self.pipeline.name, run_id, extra)
        if DRIVER_JAVA_OPTIONS not in self.pipeline.spark_conf:
            self._set_launch_options(None, "not sized for this job kind")
        self._ship_package()
        self._before_run()
        self._start_try(run_id)
        try:
            SparkSubmitOperator.execute(self, context)
        except AirflowException as e:
            self._record_unreported_failure(e)
            self._raise_for_exit_code(e)
            raise
        summary = self._read_summary(run_id)
        if summary is not None:
            self.log.info("%s run summary: %s", self.kind_label, json_scalars(summary))
            self._annotate_asset_events(context, summary)
        return summary

    def output_assets(self) -> list[Asset]:
        """Every Asset a run of this task can add an event for (lineage; docs, tests)."""
        return [table_asset(p) for p in self._outputs().values()]

    def _table_events(self, summary: dict[str, Any]) -> list[TableEvent]:
        raise NotImplementedError

    def _outputs(self) -> dict[str, Path]:
        raise NotImplementedError

    def _before_run(self) -> None:
        """What ``_table_events`` compares the run summary with (nothing by default)."""

    def _code(self) -> int | None:
        hook = self._hook
        return hook.returncode if isinstance(hook, CdcSparkSubmitHook) else None


class _CliArgs(RunParams):
    """Extra job CLI arguments in the shape ``_get_hook`` expects (``to_cli_args()``)."""

    def __init__(self, args: list[str]) -> None:
        super().__init__()
        object.__setattr__(self, "_args", list(args))

    def to_cli_args(self) -> list[str]:
        return list(self._args)  # type: ignore[attr-defined]


class EnrichSparkSubmitOperator(_KindOperator):
    """Run one enrichment pipeline (``spark_jobs/enrich.py``) and return its run summary.

    Run param ``reprocess`` (boolean, default false) adds ``--reprocess``: reset this
    pipeline's checkpoint and outputs and rebuild from the upstream tables' current snapshot
    (the recovery the job names after exit 3).

    Asset events (through ``pipeline_alias(pipeline.name)``): each output (enriched, pending,
    aggregates, quarantine) whose Delta version after the run (summary ``tables``) differs from
    its version just before spark-submit — the job commits nothing for an empty write, so a new
    version is a change — and every output after a ``--reprocess`` (rebuilt) or after a run that
    finished a micro-batch an interrupted attempt had partly written (``replayed_batches``,
    ``skipped_writes``: that attempt's commits were never announced). An output this run created
    without rows (version 0 adding no data file, e.g. the pending or quarantine table of a first
    run) gets no event: a downstream DAG would find nothing in it.
    """

    ui_color = "#fde6c8"
    kind_label = "Enrichment"

    def __init__(self, *, pipeline: Any, conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        kwargs.setdefault("name", f"cdc_lake-enrich-{pipeline.name}")
        kwargs.setdefault("application", str(ENRICH_JOB))
        kwargs.setdefault("application_args", ["--pipeline", str(pipeline.file), "--run-id", "{{ run_id }}"])
        super().__init__(pipeline=pipeline, conn_id=conn_id, **kwargs)

    def _extra_args(self, context: Context) -> list[str]:
        conf = getattr(context.get("dag_run"), "conf", None) or {}
        message = unknown_conf_message(conf, ENRICH_PARAMS, dag_id=self.pipeline.name)
        if message:
            raise AirflowFailException(message)
        reprocess = (context.get("params") or {}).get("reprocess", False)
        if not isinstance(reprocess, bool):
            raise AirflowFailException(f"Run param 'reprocess' must be true or false, got {reprocess!r}")
        if reprocess:
            refuse_in_backfill("reprocess", run_type_of(context.get("dag_run")),
                               "reset and rebuild the outputs")
        return ["--reprocess"] if reprocess else []

    def _outputs(self) -> dict[str, Path]:
        return enrich_output_paths(self.pipeline)

    def _before_run(self) -> None:
        self._versions_before = {name: delta_version(path) for name, path in self._outputs().items()}

    def _table_events(self, summary: dict[str, Any]) -> list[TableEvent]:
        common = {"pipeline": self.pipeline.name, "run_id": summary.get("run_id")}
        tables = summary.get("tables") or {}
        before = getattr(self, "_versions_before", {})
        every = summary.get("reprocess") is True or any(
            summary_count(summary.get(k)) for k in ("replayed_batches", "skipped_writes"))
        found = []
        for name, path in self._outputs().items():
            after = tables.get(name)
            metrics = after if isinstance(after, dict) else {"delta_version": after}
            version = metrics.get("delta_version")
            changed = version is not None and (every or version != before.get(name))
            if changed and before.get(name) is None and version == 0 and _holds_no_files(path):
                changed = False  # created empty by this run (a first run, a first reprocess)
            found.append(TableEvent(path, {**common, **json_scalars(metrics)}, changed))
        return found

    def _raise_for_exit_code(self, error: AirflowException) -> None:
        code, name = self._code(), self.pipeline.name
        tail = self._hook.output_tail if isinstance(self._hook, CdcSparkSubmitHook) else []
        if code == 75 and "--reprocess" in self._run_params.to_cli_args():
            raise AirflowFailException(  # a skip would drop the requested rebuild silently
                f"Enrichment {name!r} is locked by another run (exit 75); nothing was rebuilt. This "
                "run asked for --reprocess: trigger it again when the other run has finished."
                f"{lock_lines(tail)}") from error
        if code == 75 and held_by_maintenance(tail):  # it enriches nothing: the facts would wait
            raise AirflowException(
                f"Enrichment {name!r} is locked by its maintenance (exit 75), which enriches "
                f"nothing: failing so that Airflow retries this run once it is done."
                f"{lock_lines(tail)}") from error
        if code == 75:
            fact = self.pipeline.fact
            covered, why = covered_by_holder(
                tail, folders=[fact.events.path] if fact.events is not None else [],
                tables=list(self.pipeline.change_feed_sources))
            if not covered:  # the holder's end was fixed before these commits / files
                raise AirflowException(
                    f"Enrichment {name!r} is locked by another run (exit 75); {why}: failing so "
                    f"that Airflow retries this run once the holder is done.{lock_lines(tail)}"
                    ) from error
            raise AirflowSkipException(
                f"Enrichment {name!r} is locked by another run (exit 75); skipped: the holder "
                f"processes everything new since the checkpoint (every fact change is older "
                f"than its lock).{lock_lines(tail)}") from error
        if code == 2:
            raise AirflowFailException(f"Enrichment {name!r}: the job rejected its config or "
                                       f"arguments (exit 2); not retrying.{_job_lines(tail, 'enrich')}"
                                       ) from error
        if code == 3:
            raise AirflowFailException(
                f"Enrichment {name!r}: an upstream change feed is unavailable or the upstream "
                "table was rewritten, or an upstream table holds two rows for one declared key "
                "(exit 3); not retrying. The job's message below names the recovery: fix the "
                "upstream table and clear this task, or a manual run with param reprocess=true "
                f"(spark_jobs/enrich.py --pipeline {self.pipeline.file} --reprocess)."
                + _job_lines(tail, "enrich")) from error


class DimensionRefreshOperator(_KindOperator):
    """Refresh one dimension table from the snapshot of the run's logical date (``{{ ds }}``; a
    manual run without a logical date: the UTC day of its ``run_after``).

    Asset event (through ``pipeline_alias(pipeline.name)``): the dimension table, when the run
    applied a snapshot that changed rows (``inserted``/``updated``/``deleted``/``closed``) or
    widened a column; none for a date already applied or older than the last applied one, nor
    for a snapshot equal to the table.
    """

    ui_color = "#e8dcf5"
    kind_label = "Dimension refresh"

    def __init__(self, *, pipeline: Any, conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        kwargs.setdefault("name", f"cdc_lake-dimension-{pipeline.name}")
        kwargs.setdefault("application", str(DIMENSION_JOB))
        # the logical date's snapshot; a manual run without a logical date (Airflow 3 allows
        # one) takes the day it was triggered for (run_after, UTC): 'ds' is undefined there
        kwargs.setdefault("application_args", [
            "--pipeline", str(pipeline.file), "--date",
            "{{ ds if ds is defined and ds else (dag_run.run_after | ds) }}", "--run-id", "{{ run_id }}"])
        super().__init__(pipeline=pipeline, conn_id=conn_id, **kwargs)

    def _extra_args(self, context: Context) -> list[str]:
        conf = getattr(context.get("dag_run"), "conf", None) or {}
        message = unknown_conf_message(conf, (), dag_id=self.pipeline.name)
        if message:
            raise AirflowFailException(message + " (the snapshot date is the run's logical date)")
        return []

    def _outputs(self) -> dict[str, Path]:
        return {"table": self.pipeline.table}

    def _table_events(self, summary: dict[str, Any]) -> list[TableEvent]:
        common = {"pipeline": self.pipeline.name, "run_id": summary.get("run_id")}
        metrics = (summary.get("tables") or {}).get("table")
        metrics = metrics if isinstance(metrics, dict) else {"delta_version": summary.get("delta_version")}
        changed = summary.get("status") == "succeeded" and (
            any(summary_count(summary.get(k)) for k in ("inserted", "updated", "deleted", "closed"))
            or bool(summary.get("widened")))
        return [TableEvent(self.pipeline.table, {**common, **json_scalars(metrics)}, changed)]

    def _raise_for_exit_code(self, error: AirflowException) -> None:
        code, name = self._code(), self.pipeline.name
        tail = self._hook.output_tail if isinstance(self._hook, CdcSparkSubmitHook) else []
        last = _job_lines(tail, "dimension")
        if code == 75:
            raise AirflowException(
                f"Dimension {name!r} is locked by another run (exit 75); failing so Airflow retries: "
                f"this date must still be applied.{lock_lines(tail)}") from error
        if code == 2:
            raise AirflowFailException(f"Dimension {name!r}: the job rejected its config or arguments "
                                       f"(exit 2); not retrying.{last}") from error
        if code == 3:
            if "NEEDS RECOVERY" in last:
                raise AirflowFailException(f"Dimension {name!r}: its table or state file needs recovery "
                                           f"(exit 3); not retrying. The job's message names it and "
                                           f"the recovery:{last}") from error
            raise AirflowFailException(f"Dimension {name!r}: the snapshot is not a valid full snapshot "
                                       f"(exit 3); fix the file, then clear this task.{last}") from error
        if code == 66:
            raise AirflowException(f"Dimension {name!r}: the snapshot file is not there yet (exit 66); "
                                   f"a retry (if the task has retries left) looks again.{last}"
                                   ) from error


def _job_lines(tail: list[str], kind: str) -> str:
    """The job's own lines (``[enrich] ...`` / ``[dimension] ...``: the reason and the recovery)
    from the driver output, last 5; Spark's shutdown lines come after them."""
    lines = [line for line in tail if f"[{kind}]" in line]
    return ("\n" + "\n".join(lines[-5:])) if lines else ("\n" + "\n".join(tail[-5:]) if tail else "")


def _holds_no_files(path: Path) -> bool:
    """True when the first commit of the Delta table at ``path`` adds no data file (the Delta
    protocol's ``add`` actions; any engine's create of an empty table). False when unreadable."""
    try:
        with open(path / "_delta_log" / f"{0:020d}.json", encoding="utf-8") as f:
            return not any("add" in json.loads(line) for line in f if line.strip())
    except (OSError, ValueError, TypeError):
        return False
