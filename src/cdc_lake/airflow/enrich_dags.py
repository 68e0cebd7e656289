"""DAGs of the ``enrich`` and ``dimension`` pipeline kinds (``dag_factory.build_dag`` dispatches here).

* :func:`build_enrich_dag` — DAG ``<pipeline>`` with one :class:`EnrichSparkSubmitOperator`
  task ``enrich``. ``schedule:`` may be time (cron / ``{every: 30m}``), upstream Assets
  (``{assets: [...]}``: entries are table paths — relative to the YAML — or Asset URIs; a path
  becomes ``file:///abs/path``, the URI of the CDC DAGs' Asset events, so the UI shows the
  lineage CDC -> enrichment), or both (``{assets: [...], every: 30m}`` / ``{assets: [...], cron:
  ...}`` -> Airflow's ``AssetOrTimeSchedule``). The DAG runs when **any** listed Asset updates
  (the job reads everything new since its checkpoint, so collapsed events lose nothing).
  Outlet: AssetAlias ``cdc_lake:<pipeline>``; events for the outputs a run changed (enriched,
  pending, each aggregate, quarantine). Run param ``reprocess``.
* :func:`build_dimension_dag` — DAG ``<pipeline>`` with one :class:`DimensionRefreshOperator`
  task ``refresh`` running ``--date {{ ds }}``. ``max_active_runs=1`` and ``depends_on_past``:
  a date runs only after the previous date's run succeeded, also inside a backfill (whose own
  ``max_active_runs`` defaults to 10 in Airflow 3.3) — snapshots are applied in date order, one
  at a time. Outlet: AssetAlias ``cdc_lake:<pipeline>``; an event for the dimension table when a
  run changed it.

Example::

    dag = build_dimension_dag(load_pipeline("pipelines/product_categories.yaml"))
    dag.task_dict["refresh"].application_args   # ['--pipeline', '/abs/...yaml', '--date', '{{ ds }}', ...]
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG
from airflow.sdk.definitions.param import Param

from cdc_lake.airflow.dag_factory import (BASE_TAGS, MAX_RETRY_DELAY, RETRY_BACKOFF, RETRY_DELAY,
                                          _resolve_schedule, _resolve_start_date, asset_for)
from cdc_lake.airflow.enrich_operator import (DimensionRefreshOperator, EnrichSparkSubmitOperator,
                                              enrich_output_paths)
from cdc_lake.airflow.assets import table_asset

ENRICH_TASK_ID = "enrich"
DIMENSION_TASK_ID = "refresh"


def _schedule_text(cfg: Any) -> str:
    s = cfg.schedule
    when = {"none": "manual only", "cron": f"cron `{s.cron}`", "interval": f"every {s.interval}",
            "assets": "when any of these Assets updates", "assets_or_time":
            f"when any of these Assets updates, or {('cron `' + s.cron + '`') if s.cron else f'every {s.interval}'}"}
    text = when.get(s.kind, s.kind)
    if s.assets:
        text += ": " + ", ".join(f"`{asset_for(a, cfg.file).uri}`" for a in s.assets)
    return text


def build_enrich_dag(cfg: Any) -> DAG:
    """The DAG of one ``kind: enrich`` pipeline."""
    outputs = enrich_output_paths(cfg)
    upstream = "\n".join(f"- `{table_asset(p).uri}`" for p in getattr(cfg, "upstream_tables", ()))
    rows = "\n".join(f"| {name} | `{table_asset(p).uri}` |" for name, p in outputs.items())
    dag = DAG(
        dag_id=cfg.name,
        description=cfg.description or f"Enrichment {cfg.name}",
        doc_md=f"""# Enrichment pipeline `{cfg.name}`

{cfg.description}

Config: `{cfg.file}` · Schedule: {_schedule_text(cfg)} (one run at a time, no catchup) ·
Checkpoint `{cfg.checkpoint_path}` · Run summaries `{cfg.runs_path}/{cfg.name}/`

Reads (upstream Delta tables):
{upstream}

| output | Delta table = Asset URI |
|---|---|
{rows}

Asset-scheduled DAGs cannot be backfilled; each run reads everything new since the checkpoint,
so trigger a run by hand (param `reprocess` rebuilds from the upstream snapshot). See docs/airflow.md.
""",
        schedule=_resolve_schedule(cfg),  # every kind's rules (dag_factory)
        start_date=_resolve_start_date(cfg),
        catchup=False,
        max_active_runs=1,
        tags=sorted({*BASE_TAGS, "enrich", *cfg.tags}),
        params={"reprocess": Param(False, type="boolean", title="Reprocess",
                                   description="Reset this pipeline's checkpoint and outputs and rebuild "
                                               "from the upstream tables' current snapshot.")},
    )
    EnrichSparkSubmitOperator(
        task_id=ENRICH_TASK_ID, dag=dag, pipeline=cfg, conn_id=cfg.spark_conn_id, owner=cfg.owner,
        retries=cfg.retries, retry_delay=RETRY_DELAY, retry_exponential_backoff=RETRY_BACKOFF,
        max_retry_delay=MAX_RETRY_DELAY,
        doc_md="spark-submit `spark_jobs/enrich.py` for this pipeline; returns the run summary.")
    return dag


def build_dimension_dag(cfg: Any) -> DAG:
    """The DAG of one ``kind: dimension`` pipeline (snapshot date = the run's logical date)."""
    s = cfg.snapshots
    dag = DAG(
        dag_id=cfg.name,
        description=cfg.description or f"Dimension {cfg.name} from daily {s.format} snapshots",
        doc_md=f"""# Dimension refresh `{cfg.name}`

{cfg.description}

Config: `{cfg.file}` · Schedule: {_schedule_text(cfg)} · SCD{cfg.scd} · keys {', '.join(cfg.keys)}

Each run applies `{s.path}/{s.pattern}` with `date` = the run's logical date (`{{{{ ds }}}}`) to
`{table_asset(cfg.table).uri}` (an Asset: an event when a run changes the table). A date older than the last
applied date changes nothing; the same date again changes nothing.

Backfill: `airflow backfill create --dag-id {cfg.name} --from-date A --to-date B --max-active-runs 1
--reprocess-behavior failed` (Airflow requires a reprocess behaviour with `depends_on_past`).
Runs apply in date order, one at a time (`depends_on_past`: a date waits for the previous date's
run to succeed; a failed date — e.g. a missing snapshot — holds the later ones until it is fixed
and cleared, or marked success to skip it; in a backfill, set the next date's run back to queued
after clearing: docs/airflow.md). A manual run without a logical date applies the snapshot of
the UTC day it was triggered for.
""",
        schedule=_resolve_schedule(cfg),
        start_date=_resolve_start_date(cfg),
        catchup=False,
        max_active_runs=1,
        tags=sorted({*BASE_TAGS, "dimension", *cfg.tags}),
        params={},
    )
    DimensionRefreshOperator(
        task_id=DIMENSION_TASK_ID, dag=dag, pipeline=cfg, conn_id=cfg.spark_conn_id, owner=cfg.owner,
        retries=cfg.retries, retry_delay=RETRY_DELAY, retry_exponential_backoff=RETRY_BACKOFF,
        max_retry_delay=MAX_RETRY_DELAY, depends_on_past=True,
        doc_md="spark-submit `spark_jobs/dimension_refresh.py --date {{ ds }}`; returns the run summary.")
    return dag
