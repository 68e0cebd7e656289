"""What a pipeline run announces to Airflow: one Asset per Delta table it writes, events for the
tables a run changed (through the pipeline's :class:`AssetAlias`), with the run's metrics as
``extra``; and the run summary as a readable block for the task log.

Shared by every kind's operator (:mod:`cdc_lake.airflow.operator`,
:mod:`cdc_lake.airflow.enrich_operator`) and by the DAG factory, which schedules downstream
DAGs on the same URIs.

Example::

    table_asset(Path("data/lake/shop/orders"))   # Asset("file:///abs/data/lake/shop/orders")
    pipeline_alias("shop_maxwell")               # AssetAlias(name="cdc_lake:shop_maxwell")
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow.sdk import Asset, AssetAlias

if TYPE_CHECKING:
    from cdc_lake.cdc.config import PipelineConfig


def table_asset(path: Path) -> Asset:
    """The Airflow Asset of a Delta table folder: URI ``file:///abs/path`` (name = URI).

    Downstream DAGs schedule on ``Asset("file:///abs/path")`` - the same name and URI.
    """
    return Asset(path.resolve().as_uri())


ALIAS_PREFIX = "cdc_lake:"


def pipeline_alias(name: str) -> AssetAlias:
    """The AssetAlias a pipeline's task declares as its outlet: ``cdc_lake:<pipeline name>``.

    The task adds an event through it, at run time, for each :func:`table_asset` the run
    changed; Airflow records it against that Asset, which triggers DAGs scheduled on it.

    Example::

        pipeline_alias("shop_maxwell")   # AssetAlias(name="cdc_lake:shop_maxwell")
    """
    return AssetAlias(f"{ALIAS_PREFIX}{name}")


class TableEvent(NamedTuple):
    """One output table of a successful run: its Asset event ``extra`` and whether it changed."""

    path: Path
    extra: dict[str, Any]
    changed: bool


def summary_count(value: Any) -> int:
    """A summary counter as an int (absent, None or not a number: 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def cdc_table_changed(metrics: dict[str, Any], *, full_refresh: bool = False) -> bool:
    """Whether a CDC run changed a target table, from its entry in the run summary.

    Changed: the run inserted, updated or deleted rows (``inserted``/``updated``/``deleted``);
    or it replayed a micro-batch whose write an interrupted earlier attempt had committed
    (``skipped_batches``: that attempt failed, so no event announced those rows); or a full
    refresh replaced the table (``delta_version`` set: it was rebuilt, whatever the counts).
    A run with nothing new has all counts 0 and changes nothing.

    Example::

        cdc_table_changed({"inserted": 0, "updated": 0, "deleted": 0, "delta_version": 7})  # False
    """
    if any(summary_count(metrics.get(k)) for k in ("inserted", "updated", "deleted", "skipped_batches")):
        return True
    return full_refresh and metrics.get("delta_version") is not None


def delta_version(path: Path) -> int | None:
    """The latest commit version of the Delta table at ``path``, or None when there is no table
    (:func:`cdc_lake.table_marks.latest_commit`: from the log's file names, any engine wrote it)."""
    from cdc_lake.table_marks import latest_commit

    return latest_commit(path)


def format_summary(summary: dict[str, Any]) -> str:
    """One readable block for the task log.

    Example::

        CDC run shop_maxwell / manual__2026-11-21T12:00:00+00:00: succeeded in 4.2 s (engine deltalake)
          batches 2 [3, 4], events 1234, quarantined 3, DDL 1, skipped lines 0
          orders       +10 ~4 -1  delta v7
    """
    lines = [
        f"CDC run {summary.get('pipeline')} / {summary.get('run_id')}: {summary.get('status')} "
        f"in {summary.get('duration_s')} s (engine {summary.get('engine')})"
        + (" [full refresh]" if summary.get("full_refresh") else ""),
        f"  batches {summary.get('batches')} {summary.get('batch_ids', [])}, "
        f"events {summary.get('events_read')}, quarantined {summary.get('quarantined')}, "
        f"DDL {summary.get('ddl_events')}, skipped lines {summary.get('skipped_lines')}",
    ]
    tables = summary.get("tables") or {}
    width = max((len(t) for t in tables), default=0)
    for name, m in sorted(tables.items()):
        lines.append(f"  {name:<{width}}  +{m.get('inserted', 0)} ~{m.get('updated', 0)} "
                     f"-{m.get('deleted', 0)}  delta v{m.get('delta_version')}")
    return "\n".join(lines)


def cdc_output_paths(cfg: PipelineConfig) -> list[Path]:
    """Delta tables a CDC pipeline writes that other DAGs may schedule on: targets and quarantine."""
    return [*(t.path for t in cfg.tables.values()), cfg.quarantine_path]


def json_scalars(d: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``d`` an Asset event's ``extra`` can hold (JSON scalars; nested values dropped)."""
    return {k: v for k, v in d.items() if isinstance(v, (str, int, float, bool)) or v is None}
