"""The DAG folder loads in a real DagBag: one complete DAG per pipeline YAML, broken YAML isolated.

Also pins the Airflow behaviour the two-DAG-file design relies on: an import error of a DAG file
marks every DAG of that file broken in the metadata DB (not scheduled, not triggerable).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import airflow_env  # noqa: F401  (configures Airflow before it is imported)

import pytest
from airflow.dag_processing.dagbag import BundleDagBag, DagBag, sync_bag_to_db
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, AssetAlias
from airflow_env import DAGS_FOLDER, REPO, airflow_db  # noqa: F401

from cdc_lake.launch import C1_ONLY
from cdc_lake.airflow.dag_factory import MAX_RETRY_DELAY, RETRY_BACKOFF, RETRY_DELAY, TASK_ID
from cdc_lake.airflow.hook import CdcSparkSubmitHook
from cdc_lake.airflow.operator import JOB_SCRIPT, CdcSparkSubmitOperator
from cdc_lake.config import load_all

CHECK_FILE = str(DAGS_FOLDER / "cdc_pipelines_config_check.py")
REPO_ALL = {cfg.name: cfg for cfg in load_all(REPO / "pipelines")[0]}
# the CDC pipelines; the enrich/dimension kinds are checked in tests/test_enrich_dags.py
REPO_CONFIGS = {n: c for n, c in REPO_ALL.items() if c.kind == "cdc"}


def write_pipeline(folder: Path, name: str, extra: str = "", tables: str = "orders: {keys: [id]}",
                   file: str | None = None) -> Path:
    """A small valid pipeline YAML (plus ``extra`` top-level YAML) in ``folder``."""
    path = folder / (file or f"{name}.yaml")
    path.write_text(textwrap.dedent(f"""\
        pipeline: {name}
        source: {{format: maxwell, path: landing/{name}}}
        storage: {{root: lake/{name}}}
        tables:
          {tables}
        """) + textwrap.dedent(extra))
    return path


def load_bag(monkeypatch, pipelines: Path | None) -> DagBag:
    if pipelines is None:
        monkeypatch.delenv("CDC_PIPELINES_DIR", raising=False)
    else:
        monkeypatch.setenv("CDC_PIPELINES_DIR", str(pipelines))
    return DagBag(dag_folder=str(DAGS_FOLDER))


# --------------------------------------------------------------------------- the repo's pipelines


def test_repo_pipelines_load_without_import_errors(monkeypatch):
    bag = load_bag(monkeypatch, None)
    assert bag.import_errors == {}
    assert set(REPO_CONFIGS) == {"shop_debezium", "shop_maxwell", "shop_canal"}
    assert set(bag.dag_ids) == set(REPO_ALL) == set(REPO_CONFIGS) | {"product_categories", "shop_order_lines"}


def test_repo_pipelines_cover_each_format_and_scd2():
    assert {cfg.source_format for cfg in REPO_CONFIGS.values()} == {"debezium", "maxwell", "canal"}
    for cfg in REPO_CONFIGS.values():
        assert set(cfg.tables) == {"customers", "products", "orders", "order_items"}
        assert cfg.tables["order_items"].keys == ("order_id", "line_no")
        assert any(t.scd == 2 for t in cfg.tables.values())


@pytest.mark.parametrize("name", sorted(REPO_CONFIGS))
def test_every_dag_is_complete(monkeypatch, name):
    cfg = REPO_CONFIGS[name]
    dag = load_bag(monkeypatch, None).dags[name]

    assert dag.max_active_runs == 1
    assert dag.catchup is False
    assert dag.start_date is not None and dag.start_date.utcoffset() == timedelta(0)
    assert {"cdc-lake", cfg.source_format, *cfg.tags} <= set(dag.tags)
    assert dag.schedule == {"cron": cfg.schedule.cron, "interval": cfg.schedule.interval}.get(cfg.schedule.kind)
    for table in cfg.tables.values():
        assert f"`{table.name}`" in dag.doc_md and table.path.as_uri() in dag.doc_md
        assert all(f"`{k}`" in dag.doc_md for k in table.keys)
    assert "SCD2" in dag.doc_md and str(cfg.landing_path) in dag.doc_md and cfg.source_format.capitalize() in dag.doc_md
    assert set(dag.params.keys()) == {"tables", "max_files_per_trigger", "full_refresh"}

    [task] = dag.tasks
    assert task.task_id == TASK_ID
    assert isinstance(task, SparkSubmitOperator) and isinstance(task, CdcSparkSubmitOperator)
    assert task.application == str(JOB_SCRIPT)
    assert task.application_args == ["--pipeline", str(cfg.file), "--run-id", "{{ run_id }}"]
    assert task.conf["spark.sql.session.timeZone"] == "UTC"
    assert task.conf["spark.pyspark.python"] == sys.executable
    for key, value in cfg.spark_conf.items():
        if key != "spark.sql.session.timeZone":
            assert task.conf[key] == value
    assert task._conn_id == "spark_default"
    assert task.owner == cfg.owner
    assert task.retries == cfg.retries > 0
    assert task.retry_delay == RETRY_DELAY
    assert task.retry_exponential_backoff == RETRY_BACKOFF
    assert task.max_retry_delay == MAX_RETRY_DELAY

    # outlet: the pipeline's alias; a run adds events through it for the tables it changed
    assert task.outlets == [AssetAlias(f"cdc_lake:{cfg.name}")]
    expected = [Asset(t.path.as_uri()) for t in cfg.tables.values()] + [Asset(cfg.quarantine_path.as_uri())]
    assert task.output_assets() == expected
    assert all(isinstance(a, Asset) and a.uri.startswith("file:///") for a in task.output_assets())


# --------------------------------------------------------------------------- broken configs


BROKEN = {
    # what is wrong -> (YAML to add to a good file, text the error must contain)
    "wrong type": ("", "tables.orders.keys"),
    "unknown key": ("colour: blue\n", "colour"),
    "bad cron": ("schedule: '99 * * * *'\n", "schedule: '99 * * * *' is not a valid cron expression"),
    "bad start_date": ("start_date: yesterday\n", "start_date: 'yesterday' is not a date"),
    "reserved asset scheme": ("schedule: {assets: ['airflow://x']}\n", "schedule.assets[0]"),
    "zero interval": ("schedule: {every: 0m}\n", "schedule.every: must be a positive duration"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_config_is_an_import_error_naming_file_and_key(monkeypatch, tmp_path, case):
    extra, expected = BROKEN[case]
    write_pipeline(tmp_path, "good_one")
    tables = "orders: {keys: id}" if case == "wrong type" else "orders: {keys: [id]}"
    broken = write_pipeline(tmp_path, "broken_one", extra=extra, tables=tables)

    bag = load_bag(monkeypatch, tmp_path)

    assert bag.dag_ids == ["good_one"]
    assert list(bag.import_errors) == [CHECK_FILE]
    message = bag.import_errors[CHECK_FILE]
    assert f"{broken}: " in message
    assert expected in message
    assert "PipelineConfigErrors: 1 pipeline config file(s)" in message


def test_every_broken_file_is_listed_and_duplicates_are_caught(monkeypatch, tmp_path):
    g = write_pipeline(tmp_path, "good_one")
    write_pipeline(tmp_path, "other")
    a = write_pipeline(tmp_path, "bad_a", extra="retries: -1\n")
    # a copy left with the original's name, sorting first: it must not take over the DAG
    b = write_pipeline(tmp_path, "good_one", file="a_copy_of_good.yaml")

    bag = load_bag(monkeypatch, tmp_path)

    assert bag.dag_ids == ["other"]  # neither of the two files named good_one is loaded
    message = bag.import_errors[CHECK_FILE]
    assert f"{a}: retries: expected an integer >= 0, got -1" in message
    assert f"{b}: pipeline: duplicate pipeline name 'good_one' (also in {g})" in message
    assert f"{g}: pipeline: duplicate pipeline name 'good_one' (also in {b})" in message


def test_hidden_yaml_files_are_not_pipelines(monkeypatch, tmp_path):
    """Tester M: a hidden copy (``.orders.yaml``, as an editor or a staged file leaves it) and an
    editor's lock symlink ``.#orders.yaml`` unloaded the real DAG as a duplicate name."""
    write_pipeline(tmp_path, "orders")
    write_pipeline(tmp_path, "orders", file=".orders.yaml")
    (tmp_path / ".#orders.yaml").symlink_to("root@host.1234:1700000000")
    bag = load_bag(monkeypatch, tmp_path)
    assert bag.dag_ids == ["orders"] and CHECK_FILE not in bag.import_errors, bag.import_errors


def test_missing_pipelines_folder_is_an_import_error(monkeypatch, tmp_path):
    bag = load_bag(monkeypatch, tmp_path / "nope")
    assert bag.dag_ids == []
    assert f"{tmp_path / 'nope'}: pipelines folder not found" in bag.import_errors[CHECK_FILE]


def test_broken_config_leaves_other_dags_schedulable_in_the_db(monkeypatch, tmp_path, airflow_db):
    """What the DAG processor writes: the import error sits on the check file, not on the DAGs."""
    from airflow.models.dag import DagModel
    from airflow.models.errors import ParseImportError
    from airflow.utils.session import create_session
    from sqlalchemy import select

    write_pipeline(tmp_path, "db_good")
    broken = write_pipeline(tmp_path, "db_broken", tables="orders: {keys: id}")
    monkeypatch.setenv("CDC_PIPELINES_DIR", str(tmp_path))
    bag = BundleDagBag(dag_folder=str(DAGS_FOLDER), bundle_path=DAGS_FOLDER, bundle_name="dags-folder")
    _sync_bundles()
    sync_bag_to_db(bag, "dags-folder", None)

    with create_session() as session:
        dm = session.scalar(select(DagModel).where(DagModel.dag_id == "db_good"))
        assert dm is not None and dm.has_import_errors is False and dm.is_stale is False
        assert session.scalar(select(DagModel).where(DagModel.dag_id == "db_broken")) is None
        err = session.scalar(select(ParseImportError).where(ParseImportError.bundle_name == "dags-folder"))
        assert err.filename == "cdc_pipelines_config_check.py"
        assert f"{broken}: tables.orders.keys" in err.stacktrace


def test_airflow_marks_every_dag_of_a_file_with_an_import_error(tmp_path, airflow_db):
    """Why broken YAML is reported from a separate file (Airflow 3.3 behaviour, pinned)."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    (tmp_path / "one_file.py").write_text(textwrap.dedent("""\
        import pendulum
        from airflow.sdk import DAG
        from airflow.providers.standard.operators.empty import EmptyOperator
        start = pendulum.datetime(2026, 1, 1, tz="UTC")
        healthy = DAG("probe_healthy", schedule=None, start_date=start)
        EmptyOperator(task_id="t", dag=healthy)
        broken = DAG("probe_broken", schedule="99 * * * *", start_date=start)  # fails validation
        EmptyOperator(task_id="t", dag=broken)
        """))
    bag = BundleDagBag(dag_folder=str(tmp_path), bundle_path=tmp_path, bundle_name="dags-folder")
    assert bag.dag_ids == ["probe_healthy"] and list(bag.import_errors) == ["one_file.py"]
    _sync_bundles()
    sync_bag_to_db(bag, "dags-folder", None)
    with create_session() as session:
        dm = session.scalar(select(DagModel).where(DagModel.dag_id == "probe_healthy"))
        assert dm.has_import_errors is True and dm.is_stale is True  # healthy, yet not schedulable


def _sync_bundles() -> None:
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    DagBundlesManager().sync_bundles_to_db()


# --------------------------------------------------------------------------- schedules, engines


def test_schedule_kinds(monkeypatch, tmp_path):
    upstream = Asset((tmp_path / "lake/up/orders").as_uri())
    write_pipeline(tmp_path, "up", extra="schedule: {every: 30m}\n")
    write_pipeline(tmp_path, "cron", extra="schedule: '*/5 * * * *'\n")
    write_pipeline(tmp_path, "preset", extra="schedule: '@daily'\n")
    write_pipeline(tmp_path, "down", extra=f"schedule: {{assets: ['{upstream.uri}']}}\n")
    write_pipeline(tmp_path, "manual")
    # tester: a list of Assets was Airflow's AND (the DAG waited for both tables), and a path
    # relative to the YAML became the literal URI "lake/up/orders" that no writer emits
    other = Asset((tmp_path / "lake/other/orders").as_uri())
    write_pipeline(tmp_path, "any", extra=f"schedule: {{assets: [lake/up/orders, '{other.uri}']}}\n")
    write_pipeline(tmp_path, "anyt", extra="schedule: {assets: [lake/up/orders], every: 1d}\n")

    bag = load_bag(monkeypatch, tmp_path)

    assert bag.import_errors == {}
    assert bag.dags["up"].schedule == timedelta(minutes=30)
    assert bag.dags["cron"].schedule == "*/5 * * * *"
    assert bag.dags["preset"].schedule == "@daily"
    assert bag.dags["manual"].schedule is None
    # the downstream pipeline runs when the upstream pipeline's orders table is updated
    assert upstream in bag.dags["up"].tasks[0].output_assets()
    assert list(bag.dags["down"].timetable.asset_condition.objects) == [upstream]
    cond = bag.dags["any"].timetable.asset_condition
    assert type(cond).__name__ == "AssetAny" and list(cond.objects) == [upstream, other], cond
    cond = bag.dags["anyt"].timetable.asset_condition
    assert type(cond).__name__ == "AssetAny" and list(cond.objects) == [upstream], cond


def test_delta_spark_engine_gets_packages_or_jars(monkeypatch, tmp_path):
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "delta-spark_2.13-4.4.1.jar").touch()
    (jars / "delta-storage-4.4.1.jar").touch()
    write_pipeline(tmp_path, "with_packages", extra="""\
        engine: {name: delta-spark, delta_spark: {packages: 'io.delta:delta-spark_2.13:4.4.1',
                                                  repositories: 'https://repo.example/maven'}}
        spark: {conf: {spark.pyspark.python: /opt/py/bin/python,
                       spark.driver.defaultJavaOptions: ''}}
        """)
    write_pipeline(tmp_path, "with_jars", extra=f"engine: {{name: delta-spark, delta_spark: {{jars_dir: {jars}}}}}\n")
    write_pipeline(tmp_path, "embedded", extra="engine: {name: deltalake}\n")

    bag = load_bag(monkeypatch, tmp_path)

    pk = bag.dags["with_packages"].tasks[0]
    assert (pk.packages, pk._repositories, pk.jars) == ("io.delta:delta-spark_2.13:4.4.1",
                                                        "https://repo.example/maven", None)
    assert pk.conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert pk.conf["spark.sql.session.timeZone"] == "UTC"  # the tables' timestamps are UTC by contract
    assert pk.conf["spark.pyspark.python"] == "/opt/py/bin/python"  # configured wins over sys.executable
    assert pk.conf["spark.driver.defaultJavaOptions"] == ""  # configured wins over the C1-only default
    jr = bag.dags["with_jars"].tasks[0]
    assert jr.conf["spark.driver.defaultJavaOptions"] == C1_ONLY
    assert jr.jars == f"{jars / 'delta-spark_2.13-4.4.1.jar'},{jars / 'delta-storage-4.4.1.jar'}"
    assert jr.packages is None
    em = bag.dags["embedded"].tasks[0]
    assert (em.packages, em.jars) == (None, None) and "spark.sql.extensions" not in em.conf


def test_operator_passes_every_hook_argument(tmp_path, monkeypatch):
    """Guards the hand-written hook kwargs in CdcSparkSubmitOperator._get_hook against provider drift."""
    import inspect

    from cdc_lake.config import load_pipeline

    captured: dict = {}
    monkeypatch.setattr(CdcSparkSubmitHook, "__init__", lambda self, **kw: captured.update(kw))
    op = CdcSparkSubmitOperator(task_id="t", pipeline=load_pipeline(write_pipeline(tmp_path, "p")))
    op._get_hook()
    expected = set(inspect.signature(SparkSubmitHook.__init__).parameters) - {"self"}
    assert set(captured) == expected


# --------------------------------------------------------------------------- parse-time cost


def test_dag_parsing_does_not_import_pyspark():
    """Parsing both DAG files in a fresh interpreter loads no Spark/Delta module (so no JVM)."""
    code = textwrap.dedent(f"""\
        import json, runpy, sys, time
        t = time.monotonic()
        dags = runpy.run_path("{DAGS_FOLDER / 'cdc_pipelines.py'}")
        runpy.run_path("{DAGS_FOLDER / 'cdc_pipelines_config_check.py'}")
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j", "delta", "deltalake"))
        print(json.dumps({{"heavy": heavy, "dags": sorted(k for k, v in dags.items() if type(v).__name__ == "DAG"),
                          "seconds": time.monotonic() - t}}))
        """)
    env = {k: v for k, v in os.environ.items() if k != "CDC_PIPELINES_DIR"}
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert cp.returncode == 0, cp.stderr[-3000:]
    result = json.loads(cp.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []
    assert result["dags"] == sorted(REPO_ALL)
    # parse time is reported, never asserted (timings depend on the machine's load)
    print(f"DAG file parse: {result['seconds']:.2f} s")


def test_import_error_counts_files_and_lists_each_error_once(tmp_path):
    """A file whose pipeline DAG and maintenance DAG both failed was counted twice and listed
    twice (tester: "3 pipeline config file(s)" for two files)."""
    from cdc_lake.airflow.dag_factory import PipelineConfigErrors
    from cdc_lake.config import ConfigError

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    e = PipelineConfigErrors(tmp_path, [ConfigError(a, "start_date", "bad"), ConfigError(b, "start_date", "bad"),
                                        ConfigError(b, "start_date", "bad")])
    assert str(e).startswith(f"2 pipeline config file(s) in {tmp_path} are broken")
    assert str(e).count(f"{b}: start_date: bad") == 1
