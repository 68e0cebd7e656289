"""DAGs of the enrichment and dimension-refresh kinds (issue 7, Airflow): parse, schedules,
Asset URIs equal to the CDC DAGs' outlets (lineage), task arguments, exit-code mapping.

No live Airflow: the DAGs are built by the same factory the DAG file uses; the operators run
against a recording stand-in for the ``spark-submit`` binary (like tests/test_dag_e2e.py).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import airflow_env  # noqa: F401  (configures Airflow before it is imported)
import pytest
from airflow.sdk import AssetAny, AssetOrTimeSchedule
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from airflow_env import airflow_db  # noqa: F401
from cdc_lake.airflow.dag_factory import build_dags, check_pipeline_configs
from cdc_lake.airflow.assets import table_asset
from cdc_lake.config import load_pipeline

REPO = Path(__file__).resolve().parents[1]

CDC = """\
pipeline: shop
source: {format: maxwell, path: landing/shop}
storage: {root: lake/shop}
tables:
  orders: {keys: [id]}
  order_items: {keys: [order_id, line_no]}
  products: {keys: [id]}
"""
DIMENSION = """\
kind: dimension
pipeline: product_categories
schedule: {cron: "0 2 * * *"}
snapshots: {path: snapshots/product_categories, format: csv}
keys: [product_id]
schema: {product_id: int, category: string}
table: lake/dims/product_categories
"""
ENRICH = """\
kind: enrich
pipeline: order_lines
schedule: SCHEDULE
fact:
  change_feed: lake/shop/order_items
  keys: [order_id, line_no]
dimensions:
  orders: {table: lake/shop/orders, keys: [id], scd: 1, on: {order_id: id}, columns: {order_time: created_at}}
  products: {table: lake/shop/products, keys: [id], scd: 1, on: {product_id: id}, columns: {product_name: name}}
  categories: {table: lake/dims/product_categories, keys: [product_id], scd: 1,
               on: {product_id: product_id}, columns: {category: category}}
event_time: order_time
outputs:
  enriched: lake/gold/order_lines
  pending: lake/gold/_pending/order_lines
  quarantine: lake/gold/_quarantine
  aggregates:
    revenue_by_category_day: {path: lake/gold/revenue_by_category_day, group_by: [category],
                              time_bucket: day, sums: {units: "qty"}}
"""


def _enrich_kind_available() -> str | None:
    try:
        import cdc_lake.enrich.config  # noqa: F401
    except ImportError as e:
        return f"cdc_lake.enrich.config not importable ({e}); the enrich DAG tests did not run"
    return None


needs_enrich = pytest.mark.skipif(_enrich_kind_available() is not None,
                                  reason=str(_enrich_kind_available()))


def _folder(tmp: Path, schedule: str = "{assets: [lake/shop/order_items, lake/dims/product_categories]}",
            enrich: bool = True) -> Path:
    d = tmp / "pipelines"
    d.mkdir(exist_ok=True)
    (d / "shop.yaml").write_text(CDC)
    (d / "product_categories.yaml").write_text(DIMENSION)
    if enrich:
        (d / "order_lines.yaml").write_text(ENRICH.replace("SCHEDULE", schedule))
    return d


def _uris(assets) -> set[str]:  # type: ignore[no-untyped-def]
    return {a.uri for a in assets}


@needs_enrich
def test_enrich_dag_on_upstream_assets_connects_lineage(tmp_path):
    folder = _folder(tmp_path)
    check_pipeline_configs(folder)
    dags = build_dags(folder)
    assert set(dags) == {"shop", "product_categories", "order_lines"}
    enrich, cdc, dim = dags["order_lines"], dags["shop"], dags["product_categories"]
    cond = enrich.timetable.asset_condition
    assert isinstance(cond, AssetAny), "any upstream update triggers the run"
    upstream = {a.uri for a in cond.objects}
    # the very URIs the producers emit (through their aliases): CDC tables and the dimension table
    for dag in (enrich, cdc, dim):
        assert [(type(o).__name__, o.name) for o in dag.tasks[0].outlets] == [("AssetAlias", f"cdc_lake:{dag.dag_id}")]
    produced = _uris(cdc.task_dict["ingest"].output_assets()) | _uris(dim.task_dict["refresh"].output_assets())
    assert upstream == {table_asset(folder / "lake/shop/order_items").uri,
                        table_asset(folder / "lake/dims/product_categories").uri}
    assert upstream <= produced
    task = enrich.task_dict["enrich"]
    assert _uris(task.output_assets()) == {table_asset(folder / p).uri for p in (
        "lake/gold/order_lines", "lake/gold/_pending/order_lines", "lake/gold/_quarantine",
        "lake/gold/revenue_by_category_day")}
    assert task.application == str(REPO / "spark_jobs" / "enrich.py")
    assert task.application_args == ["--pipeline", str(folder / "order_lines.yaml"), "--run-id", "{{ run_id }}"]
    assert enrich.max_active_runs == 1 and enrich.catchup is False
    assert set(enrich.params) == {"reprocess"}
    assert "enrich" in enrich.tags and "cdc-lake" in enrich.tags


@needs_enrich
def test_enrich_yaml_with_maintenance_gets_a_maintenance_dag(tmp_path):
    """``maintenance:`` in an enrichment YAML (the docs promise a ``<pipeline>__maintenance`` DAG
    for any pipeline YAML) was refused as an unknown key; the unloadable YAML then held back the
    VACUUM of every table in the folder (tester H). Its outputs are the tables maintained."""
    from cdc_lake.maintenance import run_maintenance

    folder = _folder(tmp_path)
    yaml = folder / "order_lines.yaml"
    yaml.write_text(yaml.read_text() + "maintenance: {schedule: '@weekly', vacuum_retention_hours: 24}\n")
    check_pipeline_configs(folder)
    dags = build_dags(folder)
    assert set(dags) == {"shop", "product_categories", "order_lines", "order_lines__maintenance"}
    cfg = load_pipeline(yaml)
    assert (cfg.maintenance.schedule, cfg.maintenance.vacuum_retention_hours) == ("@weekly", 24)
    task = dags["order_lines__maintenance"].tasks[0]
    assert task.pipeline.file == yaml
    report = run_maintenance(cfg, pipelines=[cfg], dry_run=True)  # nothing written yet: absent
    assert report["failed"] == [] and {t["status"] for t in report["tables"].values()} == {"absent"}
    assert {Path(t["path"]).name for t in report["tables"].values()} >= {"order_lines",
                                                                          "revenue_by_category_day"}


@needs_enrich
@pytest.mark.parametrize("schedule,kind,detail", [
    ("{every: 30m}", "delta", timedelta(minutes=30)),
    ("\"15 * * * *\"", "cron", "15 * * * *"),
    ("{assets: [lake/shop/order_items], every: 30m}", "both-delta", timedelta(minutes=30)),
    ("{assets: [\"file:///elsewhere/t\"], cron: \"0 * * * *\"}", "both-cron", "0 * * * *"),
])
def test_enrich_dag_on_time_or_both(tmp_path, schedule, kind, detail):
    folder = _folder(tmp_path, schedule)
    check_pipeline_configs(folder)
    dag = build_dags(folder)["order_lines"]
    tt = dag.timetable
    if kind.startswith("both"):
        assert isinstance(tt, AssetOrTimeSchedule)
        inner = tt.timetable
        uris = {a.uri for a in tt.asset_condition.objects}
        assert uris == ({table_asset(folder / "lake/shop/order_items").uri} if kind == "both-delta"
                        else {"file:///elsewhere/t"})
        assert (inner.delta if kind.endswith("delta") else inner.expression) == detail
    else:
        assert dag.schedule == detail


def test_dimension_dag_daily_in_order_one_at_a_time(tmp_path):
    folder = _folder(tmp_path, enrich=False)
    check_pipeline_configs(folder)
    dag = build_dags(folder)["product_categories"]
    assert dag.schedule == "0 2 * * *"
    assert dag.max_active_runs == 1 and dag.catchup is False and dag.params == {} or not dict(dag.params)
    task = dag.task_dict["refresh"]
    assert task.depends_on_past is True, "a backfill applies dates in order, one after the other"
    assert task.application == str(REPO / "spark_jobs" / "dimension_refresh.py")
    rendered = task.render_template(task.application_args, {"ds": "2026-01-02", "run_id": "backfill__x"})
    assert rendered == ["--pipeline", str(folder / "product_categories.yaml"), "--date", "2026-01-02",
                        "--run-id", "backfill__x"]
    assert _uris(task.output_assets()) == {table_asset(folder / "lake/dims/product_categories").uri}


def test_dimension_schedule_on_assets_is_refused(tmp_path):
    folder = _folder(tmp_path, enrich=False)
    (folder / "product_categories.yaml").write_text(DIMENSION.replace(
        'schedule: {cron: "0 2 * * *"}', "schedule: {assets: [lake/shop/orders]}"))
    with pytest.raises(Exception) as e:
        check_pipeline_configs(folder)
    assert "product_categories.yaml: schedule:" in str(e.value) and "logical date" in str(e.value)


# --------------------------------------------------------------------------- exit codes

FAKE = f"""\
#!{sys.executable}
import json, os, sys
sys.path.insert(0, {str(REPO / 'src')!r})
from cdc_lake.config import load_pipeline
from cdc_lake.runids import run_summary_path, safe_run_id
argv = sys.argv[1:]
open(os.environ["FAKE_SPARK_LOG"], "a").write(json.dumps(argv) + "\\n")
app = argv[next(i for i, a in enumerate(argv) if a.endswith(".py")) + 1:]
code = int(os.environ.get("FAKE_SPARK_EXIT", "0"))
if code == 75:
    from datetime import datetime, timezone
    since = os.environ.get("FAKE_LOCK_SINCE") or datetime.now(timezone.utc).isoformat()
    print("[x] PIPELINE LOCKED: locked by another run ({{\\"pid\\": 4242, \\"run_id\\": \\"holder\\", "
          "\\"since\\": \\"%s\\"}})" % since)
elif code:
    print(f"[x] failing with {{code}}")
else:
    cfg = load_pipeline(app[app.index("--pipeline") + 1])
    run_id = app[app.index("--run-id") + 1]
    s = {{"pipeline": cfg.name, "run_id": safe_run_id(run_id), "status": "succeeded", "args": app,
         "tables": {{"table": {{"delta_version": 4, "inserted": 2}}}}}}
    outputs = getattr(cfg, "output_tables", None)
    if outputs is not None:  # enrich: commit to the tables in $FAKE_COMMIT; "tables" = versions after
        from pathlib import Path
        for entry in json.loads(os.environ.get("FAKE_COMMIT", "[]")):  # "name" or "name+rows"
            name, _, rows = entry.partition("+")
            log = Path(outputs[name]) / "_delta_log"
            log.mkdir(parents=True, exist_ok=True)
            action = {{"add": {{"path": "part-0.parquet", "dataChange": True}}}} if rows else {{"commitInfo": {{}}}}
            (log / f"{{len(list(log.glob('*.json'))):020d}}.json").write_text(json.dumps(action) + chr(10))
        versions = {{n: len(list((Path(p) / "_delta_log").glob("*.json"))) - 1 for n, p in outputs.items()}}
        s["tables"] = {{n: (v if v >= 0 else None) for n, v in versions.items()}}
    s.update(json.loads(os.environ.get("FAKE_SUMMARY", "{{}}")))  # a test's own counts
    p = run_summary_path(cfg.runs_path, cfg.name, run_id)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(s))
sys.exit(code)
"""


@pytest.fixture
def fake_spark(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "spark-submit").write_text(FAKE)
    (bin_dir / "spark-submit").chmod(0o755)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SPARK_LOG", str(log))
    for name in ("FAKE_SPARK_EXIT", "FAKE_SUMMARY", "FAKE_COMMIT"):
        monkeypatch.delenv(name, raising=False)
    return lambda: [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _run(op, **ctx):  # type: ignore[no-untyped-def]
    context = {"params": {}, "run_id": "scheduled__2026-01-02T02:00:00+00:00", "ds": "2026-01-02", **ctx}
    op.application_args = op.render_template(op.application_args, context)
    return op.execute(context)


@pytest.mark.parametrize("code,outcome", [
    (0, "ok"), (75, AirflowException), (2, AirflowFailException), (3, AirflowFailException),
    (66, AirflowException), (1, AirflowException)])
def test_dimension_exit_codes(tmp_path, monkeypatch, fake_spark, code, outcome):
    from cdc_lake.airflow.enrich_operator import DimensionRefreshOperator

    monkeypatch.setenv("FAKE_SPARK_EXIT", str(code))
    cfg = load_pipeline(_folder(tmp_path, enrich=False) / "product_categories.yaml")
    op = DimensionRefreshOperator(task_id="refresh", pipeline=cfg)
    if outcome == "ok":
        summary = _run(op)
        assert summary["status"] == "succeeded"
        assert summary["args"] == ["--pipeline", str(cfg.file), "--date", "2026-01-02", "--run-id",
                                   "scheduled__2026-01-02T02:00:00+00:00"]
        # a manual run without a logical date (tester: "'ds' is undefined", the task failed)
        from datetime import UTC, datetime
        from types import SimpleNamespace

        op = DimensionRefreshOperator(task_id="refresh", pipeline=cfg)
        run = SimpleNamespace(run_after=datetime(2026, 11, 27, 5, 30, tzinfo=UTC), conf={})
        args = op.render_template(op.application_args, {"run_id": "manual__x", "dag_run": run})
        assert args[args.index("--date") + 1] == "2026-11-27", args
        return
    with pytest.raises(outcome) as e:
        _run(op)
    # 75 must NOT skip (a skipped date would let later dates run and this one be lost)
    assert not isinstance(e.value, AirflowSkipException)
    assert type(e.value) is outcome, (code, type(e.value))
    if code == 75:
        assert "holder" in str(e.value) and "retries" in str(e.value)
    if code == 66:
        assert "not there yet" in str(e.value)


@needs_enrich
@pytest.mark.parametrize("code,outcome", [
    (75, AirflowSkipException), (2, AirflowFailException), (3, AirflowFailException), (1, AirflowException)])
def test_enrich_exit_codes(tmp_path, monkeypatch, fake_spark, code, outcome):
    from cdc_lake.airflow.enrich_operator import EnrichSparkSubmitOperator

    monkeypatch.setenv("FAKE_SPARK_EXIT", str(code))
    cfg = load_pipeline(_folder(tmp_path) / "order_lines.yaml")
    with pytest.raises(outcome) as e:
        _run(EnrichSparkSubmitOperator(task_id="enrich", pipeline=cfg))
    assert type(e.value) is outcome
    if code == 3:
        assert "--reprocess" in str(e.value)


@needs_enrich
def test_a_locked_run_retries_when_the_change_feed_moved_after_the_holders_lock(
        tmp_path, monkeypatch, fake_spark):
    """Tester, 2026-11-29 (the CDC kind's backfill): a run that met the lock was skipped while
    changes committed after the holder had started waited for a later run. A commit of the fact
    change feed newer than the holder's lock makes it a retryable failure instead."""
    from datetime import datetime, timedelta, timezone

    from cdc_lake.airflow.enrich_operator import EnrichSparkSubmitOperator

    monkeypatch.setenv("FAKE_SPARK_EXIT", "75")
    monkeypatch.setenv("FAKE_LOCK_SINCE", (datetime.now(timezone.utc) - timedelta(minutes=5)).isoformat())
    cfg = load_pipeline(_folder(tmp_path) / "order_lines.yaml")
    [feed] = cfg.change_feed_sources
    (feed / "_delta_log").mkdir(parents=True)
    (feed / "_delta_log" / "00000000000000000007.json").write_text("{}\n", encoding="utf-8")
    with pytest.raises(AirflowException) as e:
        _run(EnrichSparkSubmitOperator(task_id="enrich", pipeline=cfg))
    assert not isinstance(e.value, (AirflowSkipException, AirflowFailException)), e.value
    assert "00000000000000000007.json" in str(e.value) and "retries" in str(e.value), e.value


@needs_enrich
def test_a_locked_reprocess_run_fails_instead_of_skipping(tmp_path, monkeypatch, fake_spark):
    """Tester: exit 75 skipped the task and the DAG run was "success", so the requested
    rebuild was dropped silently (the CDC kind fails a locked full refresh)."""
    from cdc_lake.airflow.enrich_operator import EnrichSparkSubmitOperator

    monkeypatch.setenv("FAKE_SPARK_EXIT", "75")
    cfg = load_pipeline(_folder(tmp_path) / "order_lines.yaml")
    with pytest.raises(AirflowFailException) as e:
        _run(EnrichSparkSubmitOperator(task_id="enrich", pipeline=cfg), params={"reprocess": True})
    assert "--reprocess" in str(e.value) and "trigger it again" in str(e.value), e.value


@needs_enrich
def test_enrich_reprocess_param_and_unknown_conf(tmp_path, monkeypatch, fake_spark):
    from types import SimpleNamespace

    from cdc_lake.airflow.enrich_operator import EnrichSparkSubmitOperator

    cfg = load_pipeline(_folder(tmp_path) / "order_lines.yaml")
    summary = _run(EnrichSparkSubmitOperator(task_id="enrich", pipeline=cfg), params={"reprocess": True},
                   dag_run=SimpleNamespace(conf={"reprocess": True}))
    assert summary["args"][-1] == "--reprocess"
    with pytest.raises(AirflowFailException) as e:
        _run(EnrichSparkSubmitOperator(task_id="enrich", pipeline=cfg),
             dag_run=SimpleNamespace(conf={"reproces": True}))
    assert "reproces" in str(e.value) and "reprocess" in str(e.value)
    assert len(fake_spark()) == 1, "the refused run never started spark-submit"


# --------------------------------------------------------------------------- plugin view


@needs_enrich
def test_plugin_view_shows_pending_size_oldest_parked_dim_versions_and_last_applied_date(tmp_path):
    """Real Delta tables written with delta-rs; truth = the rows the test wrote."""
    from datetime import datetime, timezone

    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    from cdc_lake.airflow.plugin_app import render_html
    from cdc_lake.airflow.status import collect_status

    folder = _folder(tmp_path)
    enrich, dim = load_pipeline(folder / "order_lines.yaml"), load_pipeline(folder / "product_categories.yaml")
    parked = [datetime(2026, 1, 2, 9, 30, tzinfo=timezone.utc), datetime(2026, 1, 1, 23, 5, tzinfo=timezone.utc),
              datetime(2026, 1, 3, 0, 0, tzinfo=timezone.utc)]
    for chunk in (parked[:2], parked[2:]):  # two commits, two files
        write_deltalake(str(enrich.outputs.pending), pa.table({
            "order_id": pa.array(range(len(chunk)), pa.int64()),
            "_parked_at": pa.array(chunk, pa.timestamp("us", tz="UTC")),
            "_missing": pa.array([["categories"]] * len(chunk), pa.list_(pa.string()))}), mode="append")
    runs = enrich.runs_path / enrich.name
    runs.mkdir(parents=True)
    (runs / "latest.json").write_text(json.dumps({
        "pipeline": enrich.name, "run_id": "r7", "status": "succeeded", "batches": 2, "batch_ids": [5, 6],
        "facts_read": 40, "quarantined": 0, "dimension_versions": {"orders": 12, "categories": 3},
        "tables": {"enriched": 9, "pending": 1}}))
    write_deltalake(str(dim.table), pa.table({"product_id": pa.array([1], pa.int64())}),
                    commit_properties=CommitProperties(app_transactions=[
                        Transaction(app_id="dimension-product_categories", version=20260102)]))

    data = collect_status(folder)
    assert data["config_errors"] == []
    by = {p["pipeline"]: p for p in data["pipelines"]}
    assert set(by) == {"shop", "order_lines", "product_categories"}
    en = by["order_lines"]["enrichment"]
    assert en["pending_rows"] == 3 and en["pending_error"] is None
    assert en["oldest_parked_at"] == min(parked).isoformat(timespec="seconds")
    assert en["dimension_versions"] == {"orders": 12, "categories": 3}
    assert {t["table"]: t["delta_version"] for t in by["order_lines"]["tables"]}["pending"] == 1
    assert by["order_lines"]["last_run"]["events_read"] == 40
    assert by["product_categories"]["dimension"]["last_applied_date"] == "2026-01-02"

    html = render_html(data)
    assert "data-testid='pending-rows-order_lines'>3<" in html
    assert f"data-testid='oldest-parked-order_lines'>{min(parked).isoformat(timespec='seconds')}<" in html
    assert "categories v3" in html and "orders v12" in html
    assert "data-testid='last-applied-product_categories'>2026-01-02<" in html
    assert "data-testid='pipeline-shop'" in html  # the CDC pipeline still renders


# --------------------------------------------------------------------------- Asset events
# dag.test() runs the task for real (Airflow records its events in the metadata DB); the
# stand-in spark-submit plays the job: FAKE_COMMIT = the enrich outputs it commits a version
# to, FAKE_SUMMARY = summary keys it sets.

ENRICH_OUTPUTS = {"enriched": "lake/gold/order_lines", "pending": "lake/gold/_pending/order_lines",
                  "quarantine": "lake/gold/_quarantine",
                  "aggregate:revenue_by_category_day": "lake/gold/revenue_by_category_day"}


def _dag(monkeypatch, folder: Path, dag_id: str):  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag
    from airflow_env import DAGS_FOLDER

    monkeypatch.setenv("CDC_PIPELINES_DIR", str(folder))
    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


def _asset_events(dr) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(select(AssetModel.uri, AssetEvent.extra).join(AssetEvent.asset).where(
            AssetEvent.source_dag_id == dr.dag_id, AssetEvent.source_run_id == dr.run_id)).all()
        return {uri: extra for uri, extra in rows}


def _state(dr) -> str:  # type: ignore[no-untyped-def]
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return str(session.scalar(select(TaskInstance.state).where(
            TaskInstance.dag_id == dr.dag_id, TaskInstance.run_id == dr.run_id)))


def _existing_tables(folder: Path, versions: int = 3) -> None:
    """Every enrich output at version ``versions - 1`` (written by earlier runs)."""
    for rel in ENRICH_OUTPUTS.values():
        log = folder / rel / "_delta_log"
        log.mkdir(parents=True)
        for v in range(versions):
            (log / f"{v:020d}.json").write_text("{}")


@needs_enrich
@pytest.mark.parametrize(("commit", "summary", "conf", "expected"), [
    # the run wrote the enriched table and the aggregate (and its manifest row): those two only
    (["enriched", "aggregate:revenue_by_category_day", "manifest"], {}, {},
     {"enriched", "aggregate:revenue_by_category_day"}),
    ([], {"batches": 0}, {}, set()),                                     # nothing new: no event
    (["quarantine", "manifest"], {"quarantined": 2}, {}, {"quarantine"}),  # only bad facts
    ([], {"reprocess": True}, {"reprocess": True}, set(ENRICH_OUTPUTS)),   # rebuilt: every output
    ([], {"replayed_batches": 1}, {}, set(ENRICH_OUTPUTS)),  # an interrupted attempt's commits, unannounced
    # a first run creates every output; only those it wrote rows to get an event (not the empty
    # pending / quarantine / aggregate tables), also when it is a first reprocess
    ([f"{n}+rows" if n == "enriched" else n for n in ENRICH_OUTPUTS], {}, {}, {"enriched"}),
    ([f"{n}+rows" if n == "enriched" else n for n in ENRICH_OUTPUTS], {"reprocess": True},
     {"reprocess": True}, {"enriched"}),
], ids=["changed", "noop", "quarantine-only", "reprocess", "replay", "first-run", "first-reprocess"])
def test_enrich_records_events_for_the_outputs_the_run_changed(tmp_path, monkeypatch, fake_spark, airflow_db,
                                                               commit, summary, conf, expected):
    from cdc_lake.airflow.assets import pipeline_alias
    from cdc_lake.runids import safe_run_id

    folder = _folder(tmp_path)
    if not (first := any(c.endswith("+rows") for c in commit)):
        _existing_tables(folder)
    monkeypatch.setenv("FAKE_COMMIT", json.dumps(commit))
    monkeypatch.setenv("FAKE_SUMMARY", json.dumps(summary))
    dag = _dag(monkeypatch, folder, "order_lines")
    assert dag.task_dict["enrich"].outlets == [pipeline_alias("order_lines")]

    dr = dag.test(run_conf=conf)
    assert _state(dr) == "success"
    events = _asset_events(dr)
    assert set(events) == {table_asset(folder / ENRICH_OUTPUTS[n]).uri for n in expected}
    for name in expected:
        version = (3 if name in commit else 2) if not first else 0
        assert events[table_asset(folder / ENRICH_OUTPUTS[name]).uri] == {
            "pipeline": "order_lines", "run_id": safe_run_id(dr.run_id), "delta_version": version}


@pytest.mark.parametrize(("summary", "changed"), [
    ({"inserted": 1, "updated": 2, "deleted": 0, "closed": 0}, True),
    ({"inserted": 0, "updated": 0, "deleted": 0, "closed": 1}, True),     # SCD2: a key's row closed
    ({"inserted": 0, "updated": 0, "deleted": 0, "widened": {"price": "double"}}, True),
    ({"inserted": 0, "updated": 0, "deleted": 0, "unchanged": 40}, False),  # the snapshot equals the table
    ({"status": "already_applied", "skipped_writes": 1}, False),            # the same date again
    ({"status": "skipped_older_date"}, False),                              # a backfill of an older date
], ids=["rows", "closed", "widened", "equal", "already-applied", "older-date"])
def test_dimension_records_an_event_only_when_the_table_changed(tmp_path, monkeypatch, fake_spark, airflow_db,
                                                                summary, changed):
    from cdc_lake.runids import safe_run_id

    folder = _folder(tmp_path, enrich=False)
    metrics = {"delta_version": 4, "inserted": summary.get("inserted", 0),
               "updated": summary.get("updated", 0), "deleted": summary.get("deleted", 0)}
    monkeypatch.setenv("FAKE_SUMMARY", json.dumps({**summary, "tables": {"table": metrics}}))
    dr = _dag(monkeypatch, folder, "product_categories").test()
    assert _state(dr) == "success"
    uri = table_asset(folder / "lake/dims/product_categories").uri
    assert _asset_events(dr) == ({uri: {"pipeline": "product_categories", "run_id": safe_run_id(dr.run_id),
                                        **metrics}} if changed else {})
