"""Pipeline YAML -> Airflow DAG: one DAG per file in ``$CDC_PIPELINES_DIR`` (default ``<repo>/pipelines``).

Two DAG files call this module and do nothing else:

* ``dags/cdc_pipelines.py`` - ``globals().update(build_dags())``: a DAG for every *valid* YAML.
* ``dags/cdc_pipelines_config_check.py`` - ``check_pipeline_configs()``: no DAGs; raises when any
  YAML is broken, so Airflow shows the problem as an import error of *that* file.

Why two files: Airflow keys import errors by DAG file, and when a file has an import error the
DAG processor marks **every DAG defined in that file** ``has_import_errors`` and stale - they are
no longer scheduled and cannot be triggered (``collection._update_import_errors`` in Airflow 3.3).
Reporting a broken YAML from the file that also defines the healthy DAGs would therefore stop
all pipelines. The check file defines no DAGs, so its import error (which names the YAML file,
the dotted key and the fix) costs nothing but the broken pipeline itself.

Example::

    cfg = load_pipeline("pipelines/shop_maxwell.yaml")
    dag = build_dag(cfg)        # DAG "shop_maxwell" with one CdcSparkSubmitOperator "ingest"
"""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import (DAG, Asset, AssetAny, AssetOrTimeSchedule, CronTriggerTimetable,
                         DeltaTriggerTimetable)
from airflow.sdk.exceptions import AirflowTimetableInvalid

from cdc_lake.airflow import pipelines_dir
from cdc_lake.airflow.assets import pipeline_alias, table_asset
from cdc_lake.airflow.operator import CdcSparkSubmitOperator
from cdc_lake.airflow.params import build_params
from cdc_lake.cdc.config import PipelineConfig
from cdc_lake.config import ConfigError, Schedule, load_all

TASK_ID = "ingest"
CAPTURE_TASK_ID = "capture"
RETRY_DELAY = timedelta(minutes=1)
RETRY_BACKOFF = 2.0  # 1 min, 2 min, 4 min, ... capped at MAX_RETRY_DELAY
MAX_RETRY_DELAY = timedelta(minutes=30)
BASE_TAGS = ("cdc-lake",)


class PipelineConfigErrors(Exception):
    """One or more pipeline YAML files are broken; each error names its file and key."""

    def __init__(self, directory: Path, errors: list[ConfigError]) -> None:
        self.directory, self.errors = directory, errors
        listing = "\n".join(dict.fromkeys(f"  - {e}" for e in errors))
        files = len({str(getattr(e, "file", "")) for e in errors})
        super().__init__(
            f"{files} pipeline config file(s) in {directory} are broken; their DAGs are not "
            f"loaded (the DAGs of the files not listed here are unaffected; a file listed for a "
            f"clash with another, e.g. one storage path, loses its DAG until the clash is "
            f"resolved, even if it ran before):\n{listing}")


def build_dags(directory: str | os.PathLike[str] | None = None) -> dict[str, DAG]:
    """A DAG per valid pipeline YAML in ``directory`` (default :func:`pipelines_dir`), by DAG id.

    Broken files are left out here and reported by :func:`check_pipeline_configs`.
    """
    return _build_all(directory)[0]


def check_pipeline_configs(directory: str | os.PathLike[str] | None = None) -> None:
    """Raise :class:`PipelineConfigErrors` if any pipeline YAML in ``directory`` is broken.

    "Broken" means anything that keeps its DAG out of :func:`build_dags`: an invalid config, a
    duplicate pipeline name, a schedule or start date Airflow rejects.
    """
    folder = Path(directory) if directory is not None else pipelines_dir()
    errors = _build_all(folder)[1]
    if errors:
        raise PipelineConfigErrors(folder, errors)


def _build_all(directory: str | os.PathLike[str] | None) -> tuple[dict[str, DAG], list[ConfigError]]:
    folder = Path(directory) if directory is not None else pipelines_dir()
    if not folder.is_dir():
        return {}, [ConfigError(folder, "", "pipelines folder not found (set $CDC_PIPELINES_DIR or create it)")]
    configs, errors = load_all(folder)
    dags: dict[str, DAG] = {}
    for cfg in configs:
        try:
            dag = build_dag(cfg)
            dag.validate()
        except ConfigError as e:
            errors.append(e)
        except Exception as e:  # noqa: BLE001 - one pipeline's problem must not hide the others
            errors.append(ConfigError(cfg.file, "", f"Airflow cannot build this DAG: {type(e).__name__}: {e}"))
        else:
            dags[cfg.name] = dag
        # (a maintenance DAG of a file whose main DAG failed would repeat its error)
        if getattr(cfg, "maintenance", None) is not None and cfg.name in dags:
            try:
                from cdc_lake.airflow.maintenance import build_maintenance_dag

                mdag = build_maintenance_dag(cfg, start_date=_resolve_start_date(cfg),
                                             tags=[*BASE_TAGS, *cfg.tags])
                mdag.validate()
            except ConfigError as e:
                errors.append(e)
            except Exception as e:  # noqa: BLE001
                errors.append(ConfigError(cfg.file, "maintenance", f"Airflow cannot build the maintenance "
                                          f"DAG: {type(e).__name__}: {e}"))
            else:
                dags[mdag.dag_id] = mdag
    return dags, errors


def build_dag(cfg: Any) -> DAG:
    """The DAG of one pipeline YAML of any kind (``cfg.kind``: ``cdc``, ``enrich``, ``dimension``).

    Raises:
        ConfigError: ``start_date`` or a schedule Asset URI that Airflow cannot use.
    """
    if cfg.kind == "enrich":
        from cdc_lake.airflow.enrich_dags import build_enrich_dag
        return build_enrich_dag(cfg)
    if cfg.kind == "dimension":
        from cdc_lake.airflow.enrich_dags import build_dimension_dag
        return build_dimension_dag(cfg)
    return build_cdc_dag(cfg)


def build_cdc_dag(cfg: PipelineConfig) -> DAG:
    """The DAG of one CDC pipeline: a single ``CdcSparkSubmitOperator`` task.

    Raises:
        ConfigError: ``start_date`` or a schedule Asset URI that Airflow cannot use.
    """
    dag = DAG(
        dag_id=cfg.name,
        description=cfg.description or f"CDC {cfg.source_format} -> Delta: {', '.join(cfg.tables)}",
        doc_md=build_doc_md(cfg),
        schedule=_resolve_schedule(cfg),
        start_date=_resolve_start_date(cfg),
        catchup=False,
        max_active_runs=1,
        tags=sorted({*BASE_TAGS, cfg.source_format, *cfg.tags}),
        params=build_params(list(cfg.tables)),
    )
    ingest = CdcSparkSubmitOperator(
        task_id=TASK_ID,
        dag=dag,
        pipeline=cfg,
        conn_id=cfg.spark_conn_id,
        owner=cfg.owner,
        retries=cfg.retries,
        retry_delay=RETRY_DELAY,
        retry_exponential_backoff=RETRY_BACKOFF,
        max_retry_delay=MAX_RETRY_DELAY,
        doc_md="spark-submit `spark_jobs/cdc_ingest.py` for this pipeline; returns the run summary.",
    )
    if cfg.capture is not None:
        from cdc_lake.airflow.capture import CdcCaptureOperator

        capture = CdcCaptureOperator(
            task_id=CAPTURE_TASK_ID,
            dag=dag,
            pipeline=cfg,
            owner=cfg.owner,
            retries=cfg.retries,
            retry_delay=RETRY_DELAY,
            retry_exponential_backoff=RETRY_BACKOFF,
            max_retry_delay=MAX_RETRY_DELAY,
            doc_md=f"Land the binlog of `{', '.join(cfg.capture.databases)}` up to now from "
                   f"connection `{cfg.capture.conn_id}` into `{cfg.landing_path}`; then stop.",
        )
        capture >> ingest  # a failed or skipped capture never runs the ingest
    return dag


def build_doc_md(cfg: PipelineConfig) -> str:
    """The DAG's documentation (shown on the DAG page), generated from the config."""
    schedule = {
        "none": "manual only",
        "cron": f"cron `{cfg.schedule.cron}`",
        "interval": f"every {cfg.schedule.interval}",
        "assets": "when any of these Assets updates: " + ", ".join(
            f"`{_asset_text(a, cfg.file)}`" for a in cfg.schedule.assets),
        "assets_or_time": (f"when any of these Assets updates or {cfg.schedule.cron or cfg.schedule.interval}: "
                           + ", ".join(f"`{_asset_text(a, cfg.file)}`" for a in cfg.schedule.assets)),
    }[cfg.schedule.kind]
    rows = "\n".join(
        f"| `{t.name}` | `{t.database or '*'}.{t.source_table}` "
        f"| {', '.join(f'`{k}`' for k in t.keys) or '(from the events)'} "
        f"| {'SCD2 (every version)' if t.scd == 2 else 'SCD1 (latest)'} | `{t.path.as_uri()}` |"
        for t in cfg.tables.values())
    ignored = f"\nIgnored source tables: {', '.join(cfg.ignore_tables)}\n" if cfg.ignore_tables else ""
    if cfg.capture is not None:
        c = cfg.capture
        ignored += (f"\nTasks: `capture` (binlog of `{', '.join(c.databases)}` from Airflow connection "
                    f"`{c.conn_id}`, up to now) >> `ingest`. A failed capture does not run the ingest.\n")
    return f"""\
# CDC pipeline `{cfg.name}`

{cfg.description}

{cfg.source_format.capitalize()} change files from `{cfg.landing_path}` -> Delta tables under `{cfg.lake_root}`.
Config: `{cfg.file}`

| | |
|---|---|
| Schedule | {schedule} (one run at a time, no catchup) |
| Trigger | `{cfg.trigger}`, at most {cfg.max_files_per_trigger} files per micro-batch |
| Engine | `{cfg.engine}` |
| Checkpoint | `{cfg.checkpoint_path}` |
| Quarantine | `{cfg.quarantine_path.as_uri()}` (Delta table, also an Asset) |
| Asset events | through the AssetAlias `{pipeline_alias(cfg.name).name}`, only for the tables a run changed |
| Run summaries | `{cfg.runs_path}/{cfg.name}/<run id>.json` (also the task's XCom `return_value`) |

| table | source | keys | history | Delta table = Asset URI |
|---|---|---|---|---|
{rows}
{ignored}
Trigger with params: `tables` (subset), `max_files_per_trigger`, `full_refresh`.
A run processes every landing file not yet in the checkpoint; runs are not date-partitioned,
so a backfilled or repeated run after an up-to-date run writes nothing. See docs/airflow.md.
"""


def _resolve_start_date(cfg: PipelineConfig) -> datetime:
    try:
        parsed = pendulum.parse(cfg.start_date, tz="UTC")
    except ValueError as e:  # pendulum's ParserError is a ValueError
        raise ConfigError(cfg.file, "start_date",
                          f"{cfg.start_date!r} is not a date like '2026-01-01' ({e})") from None
    if not isinstance(parsed, datetime):
        raise ConfigError(cfg.file, "start_date", f"{cfg.start_date!r} is not a date like '2026-01-01'")
    return parsed


def _resolve_schedule(cfg: PipelineConfig) -> Any:
    """The DAG's ``schedule``, checked the way Airflow will check it, so a bad value is reported
    as this pipeline's config error instead of failing the shared DAG file."""
    s = cfg.schedule
    if s.kind == "cron" and s.cron:
        if s.cron not in ("@once", "@continuous"):
            try:
                CronTriggerTimetable(s.cron, timezone="UTC").validate()
            except (AirflowTimetableInvalid, ValueError) as e:
                raise ConfigError(cfg.file, "schedule", f"{s.cron!r} is not a valid cron expression: {e}") \
                    from None
        return s.cron
    if s.kind == "interval" and s.interval is not None:
        if s.interval <= timedelta(0):
            raise ConfigError(cfg.file, "schedule.every", "must be a positive duration like '30m'")
        return s.interval
    if s.kind not in ("assets", "assets_or_time"):
        return None
    # {assets: [...]}: a run when ANY of them updates (the README's "whichever comes first";
    # a plain list would be Airflow's AND: a DAG on two tables waited for both, tester)
    assets = []
    for i, entry in enumerate(s.assets):
        try:
            assets.append(asset_for(entry, cfg.file))
        except (ValueError, TypeError) as e:
            raise ConfigError(cfg.file, f"schedule.assets[{i}]", f"{entry!r} is not a table path or "
                              f"usable Asset URI: {e}") from None
    condition = AssetAny(*assets)
    if s.kind == "assets":
        return condition
    timed = _resolve_schedule(replace(cfg, schedule=Schedule(  # {assets, every|cron}: either
        "cron" if s.cron else "interval", cron=s.cron, interval=s.interval)))
    timetable = (CronTriggerTimetable(timed, timezone="UTC") if isinstance(timed, str)
                 else DeltaTriggerTimetable(timed))
    return AssetOrTimeSchedule(timetable=timetable, assets=condition)


def _asset_text(entry: str, yaml_file: Path) -> str:
    try:
        return asset_for(entry, yaml_file).uri
    except (ValueError, TypeError):
        return entry  # _resolve_schedule names the bad entry


def asset_for(entry: str, yaml_file: Path) -> Asset:
    """A ``schedule.assets`` entry -> Asset: a URI as is, a path (relative to the YAML's folder)
    as :func:`~cdc_lake.airflow.assets.table_asset`, the URI a table's writer emits (a relative
    path used to become the literal URI ``../lake/x``, which no writer emits; tester)."""
    if "://" in entry:
        return Asset(entry)
    p = Path(entry).expanduser()
    return table_asset(p if p.is_absolute() else yaml_file.parent / p)
