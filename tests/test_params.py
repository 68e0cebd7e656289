"""Run parameters are validated twice: by the Params' JSON schema and again in Python.

Hostile or sloppy values must be refused at both levels, with a message naming the parameter
and showing the value, and never reach spark-submit.
"""

from __future__ import annotations

import os
from pathlib import Path

import airflow_env  # noqa: F401  (configures Airflow before it is imported)
from airflow_env import airflow_db  # noqa: F401  (fixture)

import pytest
from airflow.sdk.exceptions import AirflowFailException, ParamValidationError

from cdc_lake.airflow.params import (
    MAX_FILES_PER_TRIGGER_LIMIT,
    InvalidRunParam,
    RunParams,
    build_params,
    validate_run_params,
)

TABLES = ["customers", "order_items", "orders", "products"]

HOSTILE_TABLES = [
    ["orders; rm -rf /"],
    ["../../etc"],
    ["orders", "$(reboot)"],
    ["orders`id`"],
    ["orders,customers"],  # would smuggle a second table into --tables
    ["-x"],
    ["unknown_table"],
    ["Orders"],  # case matters
    [""],
    [1],
    [None],
    ["orders", "orders"],
    "orders",  # a string is not a list
    {"orders": True},
]
HOSTILE_MAX_FILES = [-1, 0, MAX_FILES_PER_TRIGGER_LIMIT + 1, "10", "10; ls", True, 1.5, [5], {"n": 5}]
HOSTILE_FULL_REFRESH = ["true", "false", 1, 0, "--full-refresh", [True]]


@pytest.fixture
def params():
    return build_params(TABLES)  # fresh per test: Param.resolve(value) stores the value


# --------------------------------------------------------------------------- JSON schema level


@pytest.mark.parametrize("value", HOSTILE_TABLES, ids=repr)
def test_schema_rejects_bad_tables(params, value):
    with pytest.raises(ParamValidationError):
        params["tables"].resolve(value)


@pytest.mark.parametrize("value", HOSTILE_MAX_FILES, ids=repr)
def test_schema_rejects_bad_max_files(params, value):
    with pytest.raises(ParamValidationError):
        params["max_files_per_trigger"].resolve(value)


@pytest.mark.parametrize("value", HOSTILE_FULL_REFRESH, ids=repr)
def test_schema_rejects_bad_full_refresh(params, value):
    with pytest.raises(ParamValidationError):
        params["full_refresh"].resolve(value)


def test_schema_accepts_good_values_and_defaults(params):
    defaults = {k: p.resolve() for k, p in params.items()}
    # defaults are valid, so scheduled runs (no conf) pass the schema
    assert defaults == {"tables": [], "max_files_per_trigger": None, "full_refresh": False}
    assert params["tables"].resolve([]) == []
    assert params["tables"].resolve(["orders", "customers"]) == ["orders", "customers"]
    assert params["max_files_per_trigger"].resolve(None) is None
    assert params["max_files_per_trigger"].resolve(1) == 1
    assert params["max_files_per_trigger"].resolve(MAX_FILES_PER_TRIGGER_LIMIT) == MAX_FILES_PER_TRIGGER_LIMIT
    assert params["full_refresh"].resolve(True) is True


def test_schema_offers_the_configured_tables_in_the_form(params):
    schema = params["tables"].schema
    assert schema["type"] == "array"
    assert schema["items"]["enum"] == sorted(TABLES)
    assert schema["examples"] == sorted(TABLES)  # rendered as a multi-select
    assert schema["uniqueItems"] is True
    assert params["max_files_per_trigger"].schema["minimum"] == 1
    assert params["max_files_per_trigger"].schema["maximum"] == MAX_FILES_PER_TRIGGER_LIMIT


# --------------------------------------------------------------------------- Python level


@pytest.mark.parametrize("value", HOSTILE_TABLES, ids=repr)
def test_python_rejects_bad_tables(value):
    with pytest.raises(InvalidRunParam, match=r"Invalid run parameter 'tables': ") as exc:
        validate_run_params({"tables": value}, table_names=TABLES)
    assert exc.value.name == "tables"
    assert repr(exc.value.value) in str(exc.value)


@pytest.mark.parametrize("value", HOSTILE_MAX_FILES, ids=repr)
def test_python_rejects_bad_max_files(value):
    with pytest.raises(InvalidRunParam, match=r"Invalid run parameter 'max_files_per_trigger': "):
        validate_run_params({"max_files_per_trigger": value}, table_names=TABLES)


@pytest.mark.parametrize("value", HOSTILE_FULL_REFRESH + [None], ids=repr)
def test_python_rejects_bad_full_refresh(value):
    with pytest.raises(InvalidRunParam, match=r"Invalid run parameter 'full_refresh': "):
        validate_run_params({"full_refresh": value}, table_names=TABLES)


def test_python_rejects_unknown_params():
    """conf keys the DAG does not declare are not schema-checked by Airflow at all."""
    with pytest.raises(InvalidRunParam, match=r"'max_file_per_trigger': 5 is not a run parameter"):
        validate_run_params({"max_file_per_trigger": 5}, table_names=TABLES)


def test_integral_float_passes_like_the_param_schema_and_a_fraction_does_not():
    """Airflow's Param check (JSON Schema "integer") accepts 5.0; refusing it only here made a
    run that then failed."""
    from jsonschema import validate

    schema = {"type": ["null", "integer"], "minimum": 1}
    validate(5.0, schema)
    assert validate_run_params({"max_files_per_trigger": 5.0}, table_names=TABLES).max_files_per_trigger == 5
    with pytest.raises(InvalidRunParam, match="must be an integer"):
        validate_run_params({"max_files_per_trigger": 2.5}, table_names=TABLES)


def test_error_messages_are_exact():
    cases = {
        "tables": (["orders; rm -rf /"],
                   "Invalid run parameter 'tables': 'orders; rm -rf /' is not a table name "
                   "(must match ^[A-Za-z_][A-Za-z0-9_]*$)"),
        "max_files_per_trigger": ("10", "Invalid run parameter 'max_files_per_trigger': '10' must be an "
                                        "integer (not a string or float)"),
    }
    for name, (value, message) in cases.items():
        with pytest.raises(InvalidRunParam) as exc:
            validate_run_params({name: value}, table_names=TABLES)
        assert str(exc.value) == message
    with pytest.raises(InvalidRunParam) as exc:
        validate_run_params({"tables": ["nope"]}, table_names=TABLES)
    assert str(exc.value) == ("Invalid run parameter 'tables': 'nope' is not a configured table of this "
                              "pipeline; expected one of: customers, order_items, orders, products")


def test_invalid_param_fails_the_task_without_retry():
    assert issubclass(InvalidRunParam, AirflowFailException)


@pytest.mark.parametrize(("raw", "args"), [
    ({}, []),
    ({"tables": [], "max_files_per_trigger": None, "full_refresh": False}, []),
    ({"tables": ["orders"], "full_refresh": True}, ["--tables", "orders", "--full-refresh"]),
    ({"tables": ["orders", "customers"], "max_files_per_trigger": 7, "full_refresh": True},
     ["--tables", "orders,customers", "--max-files-per-trigger", "7", "--full-refresh"]),
    ({"tables": sorted(TABLES)}, ["--tables", ",".join(sorted(TABLES))]),  # all tables: no subset
    ({"max_files_per_trigger": MAX_FILES_PER_TRIGGER_LIMIT}, ["--max-files-per-trigger", "100000"]),
])
def test_valid_params_become_cli_args(raw, args):
    run = validate_run_params(raw, table_names=TABLES)
    assert isinstance(run, RunParams)
    assert run.to_cli_args() == args


def test_table_subset_needs_full_refresh():
    """The job refuses a subset on incremental runs (shared checkpoint); say so before spark-submit."""
    with pytest.raises(InvalidRunParam) as exc:
        validate_run_params({"tables": ["orders"]}, table_names=TABLES)
    assert str(exc.value) == (
        "Invalid run parameter 'tables': ['orders'] selects a subset of tables, which only applies with "
        "full_refresh=true (incremental runs share one checkpoint and always process every table)")


# --------------------------------------------------------------------------- in the operator


def _operator_with_marker_spark_submit(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """A CDC operator on a tiny pipeline, with a ``spark-submit`` on PATH that only leaves a
    marker file: the tests check that validation stops a run before it would start."""
    from cdc_lake.airflow.operator import CdcSparkSubmitOperator
    from cdc_lake.config import load_pipeline

    marker = tmp_path / "spark-submit-ran"
    fake = tmp_path / "bin" / "spark-submit"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    cfg_file = tmp_path / "p.yaml"
    cfg_file.write_text("pipeline: p\nsource: {format: maxwell, path: landing}\nstorage: {root: lake}\n"
                        "tables: {orders: {keys: [id]}}\n")
    op = CdcSparkSubmitOperator(task_id="ingest", pipeline=load_pipeline(cfg_file))
    return op, marker


def test_operator_refuses_hostile_params_before_spark_submit(tmp_path, monkeypatch):
    """Python-level validation runs first in execute(): spark-submit is never started."""
    op, marker = _operator_with_marker_spark_submit(tmp_path, monkeypatch)
    for params in ({"tables": ["orders; rm -rf /"]}, {"max_files_per_trigger": "10"},
                   {"full_refresh": "yes"}, {"tables": ["../../etc"]}):
        with pytest.raises(InvalidRunParam):
            op.execute({"params": params, "run_id": "manual__2026-11-21T12:00:00+00:00"})
    assert not marker.exists()


def test_python_rejects_unknown_keys_of_the_run_conf_too():
    """With [core] dag_run_conf_overrides_params = False the conf never reaches ``params``."""
    with pytest.raises(InvalidRunParam, match=r"'max_file_per_trigger': 5 is not a run parameter.*"
                                              r"allowed: tables, max_files_per_trigger, full_refresh"):
        validate_run_params({"tables": [], "full_refresh": False}, table_names=TABLES,
                            conf={"max_file_per_trigger": 5})
    assert validate_run_params({}, table_names=TABLES, conf={"full_refresh": False}) == RunParams()


def test_unknown_conf_of_a_dag_without_parameters_says_so():
    """Tester J: a dimension DAG (no run parameters) answered "Valid keys: " with an empty list."""
    from cdc_lake.airflow.params import unknown_conf_message

    msg = unknown_conf_message({"full_refresh": True}, set(), dag_id="product_categories")
    assert msg == ("Unknown run parameter(s) for DAG 'product_categories': 'full_refresh'. "
                   "This DAG takes no run parameters: trigger it without conf")


# --------------------------------------------------------------------------- REST / UI trigger: 400


def test_rest_trigger_with_unknown_conf_key_is_http_400_naming_the_valid_keys(tmp_path, monkeypatch,
                                                                               airflow_db):
    """The real Airflow API app (in process, metadata DB with our DAG) behind the plugin's root
    middleware: a typo in ``conf`` is refused before a run exists; good conf still triggers."""
    import importlib.util

    from airflow.api_fastapi.app import create_app
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow_env import DAGS_FOLDER, REPO
    from fastapi.testclient import TestClient
    from sqlalchemy import func, select

    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True")
    (tmp_path / "guard.yaml").write_text("pipeline: conf_guard_p\nsource: {format: maxwell, path: landing}\n"
                                         "storage: {root: lake}\ntables: {orders: {keys: [id]}}\n")
    monkeypatch.setenv("CDC_PIPELINES_DIR", str(tmp_path))
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(BundleDagBag(dag_folder=str(DAGS_FOLDER), bundle_path=DAGS_FOLDER,
                                bundle_name="dags-folder"), "dags-folder", None)
    spec = importlib.util.spec_from_file_location("cdc_lake_plugin", REPO / "plugins" / "cdc_lake_plugin.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)  # type: ignore[union-attr]
    app = create_app("core")
    for entry in plugin.CdcLakePlugin.fastapi_root_middlewares:  # as Airflow's create_app does
        app.add_middleware(entry["middleware"], *entry["args"], **entry["kwargs"])
    client = TestClient(app)

    def runs() -> int:
        with create_session() as s:
            return s.scalar(select(func.count()).select_from(DagRun).where(DagRun.dag_id == "conf_guard_p"))

    url = "/api/v2/dags/conf_guard_p/dagRuns"
    r = client.post(url, json={"logical_date": None, "conf": {"max_file_per_trigger": 5}})
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == ("Unknown run parameter(s) for DAG 'conf_guard_p': 'max_file_per_trigger'. "
                                  "Valid keys: full_refresh, max_files_per_trigger, tables")
    r = client.post("/api/v2/backfills", json={"dag_id": "conf_guard_p", "from_date": "2026-01-01T00:00:00Z",
                                               "to_date": "2026-01-02T00:00:00Z",
                                               "dag_run_conf": {"fullrefresh": True}})
    assert r.status_code == 400 and "'fullrefresh'" in r.json()["detail"], r.text
    assert runs() == 0
    r = client.post(url, json={"logical_date": None, "conf": {"max_files_per_trigger": 5}})
    assert r.status_code == 200, r.text  # the body reached Airflow intact
    assert r.json()["conf"] == {"max_files_per_trigger": 5}
    assert runs() == 1
    r = client.post(url, json={"logical_date": None, "conf": {"max_files_per_trigger": "x"}})
    assert r.status_code == 400 and "max_files_per_trigger" in r.json()["detail"]  # schema, as before


def test_full_refresh_and_reprocess_are_refused_in_backfill_runs(tmp_path, monkeypatch):
    """Tester (2026-11-28): a backfill with ``dag_run_conf: {"full_refresh": true}`` rebuilt
    every table once per date, and made the enrichment stop for a reprocess each time. Both
    rebuild parameters now fail the backfill's task before spark-submit, naming the fix; a
    manual run with them goes on."""
    from types import SimpleNamespace

    from airflow.utils.types import DagRunType

    from cdc_lake.airflow.enrich_operator import EnrichSparkSubmitOperator
    from cdc_lake.airflow.params import run_type_of
    from cdc_lake.config import load_pipeline

    op, marker = _operator_with_marker_spark_submit(tmp_path, monkeypatch)
    backfill = SimpleNamespace(run_type=DagRunType.BACKFILL_JOB, conf={"full_refresh": True})
    assert run_type_of(backfill) == "backfill"
    with pytest.raises(InvalidRunParam, match="refused in a backfill run.*manual run with full_refresh=true"):
        op.execute({"params": {"full_refresh": True}, "run_id": "backfill__2026-11-21T00:00:00+00:00",
                    "dag_run": backfill})
    assert not marker.exists()
    manual = SimpleNamespace(run_type=DagRunType.MANUAL, conf={"full_refresh": True})
    assert validate_run_params({"full_refresh": True}, table_names=["orders"],
                               run_type=run_type_of(manual)).full_refresh
    # the enrichment's reprocess likewise
    repo = Path(__file__).resolve().parents[1]
    eop = EnrichSparkSubmitOperator(task_id="enrich",
                                    pipeline=load_pipeline(repo / "pipelines" / "shop_order_lines.yaml"))
    with pytest.raises(InvalidRunParam, match="reprocess.*refused in a backfill run"):
        eop._extra_args({"params": {"reprocess": True},
                         "dag_run": SimpleNamespace(run_type=DagRunType.BACKFILL_JOB, conf={"reprocess": True})})
    assert eop._extra_args({"params": {"reprocess": True},
                            "dag_run": SimpleNamespace(run_type=DagRunType.MANUAL, conf={})}) == ["--reprocess"]
