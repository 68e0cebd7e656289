"""One live Airflow shared by the test files that need one.

``test_airflow_live.py``, ``test_browser.py`` and ``test_capture_dag_live.py`` each used to start
their own Airflow (``db migrate``, api-server, scheduler, dag-processor: 20-35 s of a CI worker)
and wrote some pipelines only after it ran (the dag-processor re-reads a DAG file at most every
60 s, ``MIN_FILE_PROCESS_INTERVAL``: a test waited ~30 s for its new DAG). Now:

* :func:`write_pipelines` writes every pipeline any of them runs before Airflow starts: the repo's
  pipelines (no schedule, no retries), ``shop_browser`` (a copy of the Maxwell pipeline with its
  own landing and lake, so the browser test and the REST test do not share data),
  ``shop_backfill`` (the same, ``@daily`` from 2026-11-01) and the two capture pipelines
  (``live_capture``, ``dead_capture``; their Airflow connections are created by that test);
* :func:`shared_airflow` (a module-scoped fixture) starts the instance on first use: PostgreSQL
  metadata DB when 127.0.0.1:5432 answers, else SQLite;
* the files form one xdist scope (one worker, back to back: :func:`make_scheduler`), and without
  xdist the collection puts them next to each other (:func:`group_together`);
* the instance stops after the last test of the group (:func:`after_teardown`), so it does not
  burn CPU for the rest of the session; a later use would start a fresh one.

While it runs, ``CDC_PIPELINES_DIR`` and ``CDC_DATA_DIR`` of the test process point at the same
folders as Airflow's, so ``load_pipeline`` resolves the same paths.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from live_airflow import REPO, LiveAirflow, postgres_available, start_live_airflow
from live_pipelines import copy_pipelines_for_test, pick_pipeline

GROUP = frozenset({"tests/test_airflow_live.py", "tests/test_browser.py",
                   "tests/test_capture_dag_live.py"})
XDIST_SCOPE = "live-airflow: " + " + ".join(sorted(GROUP))

CAPTURE_DB = "livecap"
CAPTURE_PIPELINE = """\
pipeline: {name}
schedule: null
source: {{format: maxwell, path: "${{CDC_DATA_DIR}}/landing/{name}", database: {db}, max_files_per_trigger: 50}}
storage: {{root: "${{CDC_DATA_DIR}}/lake/{name}"}}
engine: {{name: deltalake}}
retries: 0
capture: {{conn_id: {conn_id}, databases: [{db}]}}
tables:
  accounts: {{keys: [id], types: {{balance: "decimal(10,2)"}}}}
  moves: {{keys: [account_id, seq], types: {{amount: "decimal(10,2)"}}}}
"""
CAPTURE_PIPELINES = {"live_capture": "cdc_mariadb", "dead_capture": "dead_mariadb"}  # name -> conn id


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def variant_pipeline(src: Path, dst_dir: Path, name: str, **overrides: Any) -> Path:
    """A copy of pipeline YAML ``src`` named ``name`` with its own landing folder and lake."""
    import yaml

    raw = yaml.safe_load(src.read_text(encoding="utf-8"))
    raw.update(pipeline=name, **overrides)
    raw["source"]["path"] = "${CDC_DATA_DIR}/landing/" + name
    raw["storage"]["root"] = "${CDC_DATA_DIR}/lake/" + name
    path = dst_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def write_pipelines(pipelines: Path) -> None:
    """Every pipeline the group's tests run (see the module doc), into ``pipelines``."""
    copy_pipelines_for_test(REPO / "pipelines", pipelines)  # no schedule, retries 0
    maxwell = pick_pipeline(pipelines)
    if maxwell is not None:
        variant_pipeline(maxwell.file, pipelines, "shop_browser")
        variant_pipeline(maxwell.file, pipelines, "shop_backfill", schedule="@daily",
                         start_date="2026-11-01", retries=0)
    for name, conn_id in CAPTURE_PIPELINES.items():
        (pipelines / f"{name}.yaml").write_text(
            CAPTURE_PIPELINE.format(name=name, db=CAPTURE_DB, conn_id=conn_id), encoding="utf-8")


@contextlib.contextmanager
def pipeline_airflow(work: Path, db: str) -> Iterator[LiveAirflow]:
    """A live Airflow over the repo's DAGs and :func:`write_pipelines` in ``work``; the test
    process's ``CDC_PIPELINES_DIR`` / ``CDC_DATA_DIR`` point at the same folders meanwhile."""
    pipelines, data = work / "pipelines", work / "data"
    write_pipelines(pipelines)
    data.mkdir(parents=True, exist_ok=True)
    env = {"CDC_PIPELINES_DIR": str(pipelines), "CDC_DATA_DIR": str(data)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        with start_live_airflow(work / "home", db=db, dags_folder=REPO / "dags", extra_env=env) as af:
            af.pipelines_dir = pipelines  # type: ignore[attr-defined]
            af.data_dir = data  # type: ignore[attr-defined]
            yield af


class _Shared:
    stack: contextlib.ExitStack | None = None
    airflow: LiveAirflow | None = None


def shared_db() -> str:
    """The shared instance's metadata DB: PostgreSQL (what production runs) when reachable."""
    return "postgres" if postgres_available()[0] else "sqlite"


@pytest.fixture(scope="module")
def shared_airflow(tmp_path_factory) -> LiveAirflow:  # type: ignore[no-untyped-def]
    """The group's live Airflow, started on first use (see the module doc)."""
    if _Shared.airflow is None:
        stack = contextlib.ExitStack()
        try:
            _Shared.airflow = stack.enter_context(
                pipeline_airflow(tmp_path_factory.mktemp("airflow-shared"), shared_db()))
        except BaseException:
            stack.close()
            raise
        _Shared.stack = stack
    return _Shared.airflow


def stop_shared() -> None:
    stack, _Shared.stack, _Shared.airflow = _Shared.stack, None, None
    if stack is not None:
        stack.close()


# ----------------------------------------------------------------------------- pytest hooks
# (called from tests/conftest.py)


def group_together(items: list) -> None:
    """Put the group's tests right after the first of them, keeping every other order."""
    group = [i for i in items if _file(i.nodeid) in GROUP]
    if not group:
        return
    first = items.index(group[0])
    rest = [i for i in items if _file(i.nodeid) not in GROUP]
    items[:] = rest[:first] + group + rest[first:]


def after_teardown(item, nextitem) -> None:  # type: ignore[no-untyped-def]
    """Stop the shared Airflow once the group's last test (and its module fixtures) are done."""
    if _file(item.nodeid) in GROUP and (nextitem is None or _file(nextitem.nodeid) not in GROUP):
        stop_shared()


def make_scheduler(config, log):  # type: ignore[no-untyped-def]
    """``--dist loadfile`` with the group's files as one scope (so one worker runs them all)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class _LoadFileSharingAirflow(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return XDIST_SCOPE if scope in GROUP else scope

    return _LoadFileSharingAirflow(config, log)
