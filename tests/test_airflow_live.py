"""A real Airflow 3.3 (api-server, scheduler, dag-processor; LocalExecutor) runs the pipeline DAGs.

The default tier uses the live Airflow this file shares with ``test_browser.py`` and
``test_capture_dag_live.py`` (``tests/live_stack.py``: PostgreSQL metadata DB when
127.0.0.1:5432 answers, else SQLite); the slow tier adds a leg on its own instance with the other
metadata DB (the PostgreSQL leg skips with the reason where there is none).

* the plugin view is refused to anonymous users and served to logged-in ones (bearer or cookie);
* a pipeline DAG triggered through the REST API with ``conf`` runs the Spark job, the Delta tables
  hold exactly the expected rows, and the run summary arrives in XCom;
* a bad param is refused with HTTP 400 and creates no run;
* two runs triggered at once process the new data exactly once (slow tier);
* a backfill runs its dates one after another, the data once; the same range again changes nothing.

Run: ``pytest -m airflow_live tests/test_airflow_live.py`` (≈2–3 min on 2 cores).
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from datetime import datetime, timezone

import httpx
import jwt
import pytest

from live_airflow import REPO, dump_logs, postgres_available
from live_pipelines import MaxwellScenario, find_summary, pick_pipeline, real_pipeline_parts
from live_stack import pipeline_airflow, shared_db

pytestmark = [pytest.mark.airflow_live]

LOCK_EXIT_CODE = 75

# Default tier: the shared instance. Slow tier: also an instance of the other metadata DB.
LEGS = ["shared", "other"] if os.environ.get("CDC_SLOW") == "1" else ["shared"]


@pytest.fixture(scope="module", params=LEGS)
def live(request, tmp_path_factory):
    """A running Airflow over tmp copies of the pipelines (``tests/live_stack.py``)."""
    ready, why = real_pipeline_parts()
    if not ready:
        pytest.skip(why)
    if request.param == "shared":
        yield request.getfixturevalue("shared_airflow")
        return
    db = "sqlite" if shared_db() == "postgres" else "postgres"
    if db == "postgres":
        ok, why = postgres_available()
        if not ok:
            pytest.skip(f"PostgreSQL leg skipped: {why}")
    with pipeline_airflow(tmp_path_factory.mktemp(f"airflow-{db}"), db) as af:
        yield af


@pytest.fixture(autouse=True)
def _logs_on_failure(request, live):
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        dump_logs(live, save_to=REPO / "test-artifacts" / f"airflow-logs-{request.node.name}")


@pytest.fixture(scope="module")
def pipeline(live):
    """The Maxwell pipeline under test: config, scenario, DAG parsed and unpaused."""
    cfg = pick_pipeline(live.pipelines_dir)
    if cfg is None:
        pytest.skip(f"no valid maxwell pipeline in {live.pipelines_dir} (pipelines/*.yaml)")
    live.wait_dag(cfg.name, timeout=180)
    live.unpause(cfg.name)
    return cfg, MaxwellScenario(cfg)


# ----------------------------------------------------------------------------- platform


def test_components_healthy(live):
    h = live.health()
    for component in ("metadatabase", "scheduler", "dag_processor"):
        assert h[component]["status"] == "healthy", h
    assert live.start_seconds < 150


def test_plugin_view_requires_login(live):
    base = live.base_url
    for path in ("/cdc/", "/cdc/api/status"):
        r = httpx.get(base + path, timeout=30)
        assert r.status_code in (401, 403), (path, r.status_code, r.text[:300])
        r = httpx.get(base + path, headers={"Authorization": "Bearer not-a-jwt"}, timeout=30)
        assert r.status_code in (401, 403), (path, r.status_code)
        forged = jwt.encode({"sub": "admin", "role": "ADMIN", "exp": int(time.time()) + 600},
                            "x" * 64, algorithm="HS512")
        r = httpx.get(base + path, headers={"Authorization": f"Bearer {forged}"}, timeout=30)
        assert r.status_code in (401, 403), (path, "forged token accepted", r.status_code)
        r = httpx.get(base + path, cookies={"_token": "garbage"}, timeout=30)
        assert r.status_code in (401, 403), (path, r.status_code)
        for user in ("admin", "viewer"):  # any logged-in user may look
            r = live.request("GET", path, user=user)
            assert r.status_code == 200, (path, user, r.status_code, r.text[:300])
        # the Airflow UI shows the view in an iframe: the browser sends the _token cookie
        r = httpx.get(base + path, cookies={"_token": live.token()}, timeout=30)
        assert r.status_code == 200, (path, "cookie", r.status_code)
    page = live.request("GET", "/cdc/")
    assert "text/html" in page.headers["content-type"] and "CDC pipelines" in page.text
    status = live.api("GET", "/cdc/api/status")
    assert status["pipelines_dir"] == str(live.pipelines_dir)


def test_plugin_registered_in_nav(live):
    plugins = {p["name"]: p for p in live.api("GET", "/api/v2/plugins")["plugins"]}
    assert "cdc_lake" in plugins, plugins.keys()
    views = plugins["cdc_lake"]["external_views"]
    assert [v["href"] for v in views] == ["/cdc/"]
    assert views[0]["destination"] == "nav" and views[0]["url_route"]
    assert [a["url_prefix"] for a in plugins["cdc_lake"]["fastapi_apps"]] == ["/cdc"]


# ----------------------------------------------------------------------------- pipelines


def test_trigger_with_conf_runs_job(live, pipeline):
    cfg, sc = pipeline
    files = sc.write_batch(0)
    r = live.trigger(cfg.name, {"max_files_per_trigger": 1})
    run = r.json()
    assert run["conf"]["max_files_per_trigger"] == 1
    live.wait_success(cfg.name, run["dag_run_id"], timeout=300)

    task_id, summary = find_summary(live, cfg.name, run["dag_run_id"])
    assert summary is not None, (
        f"no run summary in any task's XCom return_value: "
        f"{live.task_instances(cfg.name, run['dag_run_id'])}")
    assert summary["status"] == "succeeded" and summary["pipeline"] == cfg.name
    assert summary["events_read"] == sc.events_written
    assert summary["driver_jit"] == "C1", summary  # a small backlog: the operator chose C1 only
    assert summary["codegen"] == "interpreted", summary  # and the job interpreted expressions
    # max_files_per_trigger=1 reached the job: one micro-batch per landing file
    assert summary["batches"] == len(files), summary
    pending = sc.pending_table_events()
    for t in sc.scd1_tables():  # each change counted once (SCD2 counts versions, not events)
        m = summary["tables"][t]
        assert m["inserted"] + m["updated"] + m["deleted"] == pending[t], (t, m, pending[t])
    sc.mark_processed()
    sc.assert_lake_matches()

    # the plugin view reads the same state from the lake and the checkpoint
    from deltalake import DeltaTable

    (p,) = [p for p in live.api("GET", "/cdc/api/status")["pipelines"] if p["pipeline"] == cfg.name]
    assert p["checkpoint"]["last_batch_id"] == summary["last_batch_id"]
    assert p["checkpoint"]["pending_batch_id"] is None
    assert p["last_run"]["status"] == "succeeded"
    for t in p["tables"]:
        assert t["delta_version"] == DeltaTable(t["path"]).version(), t
        assert t["last_run"] is not None and t["last_run"]["inserted"] >= 1, t


def test_invalid_param_is_refused_without_a_run(live, pipeline):
    cfg, _sc = pipeline
    before = {r["dag_run_id"] for r in live.runs(cfg.name)}
    for conf in ({"max_files_per_trigger": 0}, {"max_files_per_trigger": "ten"},
                 {"tables": ["no_such_table"]}):
        r = live.trigger(cfg.name, conf, expect=(400,))
        assert "Invalid input for param" in r.text or "param" in r.text.lower(), r.text
    time.sleep(1)
    assert {r["dag_run_id"] for r in live.runs(cfg.name)} == before


@pytest.mark.slow  # CI budget; the lock is covered by test_dag_e2e, test_job_cli, test_locks_postgres
def test_two_runs_at_once_process_data_once(live, pipeline):
    cfg, sc = pipeline
    sc.write_batch(1)
    new_events = sc.events_written - sc.events_processed
    pending = sc.pending_table_events()
    if live.db == "sqlite":
        # SQLite has one writer at a time: two truly simultaneous POSTs can make the API server
        # answer 500 "database is locked" (observed). Back to back is still "at once" for a job
        # that runs for tens of seconds.
        run_ids = [live.trigger(cfg.name, {}).json()["dag_run_id"] for _ in range(2)]
    else:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(live.trigger, cfg.name, {}) for _ in range(2)]
            run_ids = [f.result().json()["dag_run_id"] for f in futures]
    assert len(set(run_ids)) == 2
    runs = [live.wait_run(cfg.name, rid, timeout=420) for rid in run_ids]

    processed, outcomes = 0, []
    changes = {t: 0 for t in sc.scd1_tables()}
    for run in runs:
        rid = run["dag_run_id"]
        _task, summary = find_summary(live, cfg.name, rid)
        if run["state"] == "success" and summary is not None:
            assert summary["status"] == "succeeded", summary
            processed += summary["events_read"]
            for t in changes:
                m = summary["tables"].get(t) or {}
                changes[t] += sum(m.get(k) or 0 for k in ("inserted", "updated", "deleted"))
            outcomes.append(("processed" if summary["events_read"] else "nothing new",
                             summary["events_read"]))
        else:
            # the only other acceptable outcome is the job's lock (exit code 75): the operator
            # skips the task (run success), or fails it; either way nothing was written
            states = {ti["task_id"]: ti["state"] for ti in live.task_instances(cfg.name, rid)}
            log = live.task_log(cfg.name, rid)
            assert f"exit code {LOCK_EXIT_CODE}" in log and "lock" in log.lower(), (
                f"run {rid} ended {run['state']} (tasks {states}) without a summary and not by the "
                f"pipeline lock:\n{live.task_log(cfg.name, rid, rendered=True)[-6000:]}")
            assert set(states.values()) <= {"skipped", "failed", "success"}, states
            outcomes.append(("locked out", 0))
    assert processed == new_events, (outcomes, new_events)
    assert sorted(o[0] for o in outcomes).count("processed") == 1, outcomes
    assert changes == {t: pending[t] for t in changes}, (changes, pending)
    sc.mark_processed()
    sc.assert_lake_matches()


# ----------------------------------------------------------------------------- backfill


def _backfill_runs(live, dag_id: str, known: set[str]) -> list[dict]:
    return [r for r in live.runs(dag_id) if r["dag_run_id"] not in known and r["run_type"] == "backfill"]


def _wait_backfill(live, dag_id: str, known: set[str], expected_runs: int, timeout: float = 900) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = _backfill_runs(live, dag_id, known)
        if len(runs) == expected_runs and all(r["state"] in ("success", "failed") for r in runs):
            return runs
        time.sleep(2)
    raise live.fail(f"backfill of {dag_id} not finished: {[(r['dag_run_id'], r['state']) for r in _backfill_runs(live, dag_id, known)]}")


def _wait_rerun(live, dag_id: str, run_ids: set[str], since: datetime, timeout: float = 600) -> list[dict]:
    """The runs ``run_ids`` once each has ended again after ``since`` (cleared and re-run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [r for r in live.runs(dag_id) if r["dag_run_id"] in run_ids]
        if len(runs) == len(run_ids) and all(
                r["state"] in ("success", "failed") and r.get("end_date")
                and datetime.fromisoformat(r["end_date"].replace("Z", "+00:00")) > since for r in runs):
            return runs
        time.sleep(2)
    raise live.fail(f"runs {sorted(run_ids)} of {dag_id} not re-run since {since:%H:%M:%S}: "
                    f"{[(r['dag_run_id'], r['state'], r.get('end_date')) for r in live.runs(dag_id) if r['dag_run_id'] in run_ids]}")


def _wait_backfills_completed(live, dag_id: str, timeout: float = 600) -> None:
    """The scheduler marks a backfill completed once its runs are done; only then may another start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        backfills = live.api("GET", "/api/v2/backfills", params={"dag_id": dag_id})["backfills"]
        if backfills and all(b.get("completed_at") for b in backfills):
            return
        time.sleep(2)
    raise live.fail(f"backfills of {dag_id} not completed after {timeout:.0f}s")


def test_backfill_is_sequential_and_idempotent(live):
    """Backfill over 2 days (CI budget; a third adds nothing the second does not show): each
    run processes what is new since the checkpoint (the job is not date-partitioned), so the
    first processes everything and the others nothing; running the same range again (reprocess,
    backfill default concurrency) changes nothing."""
    if live.db != "sqlite" and len(LEGS) > 1:
        pytest.skip("backfill semantics do not depend on the metadata DB; covered by the SQLite leg")
    from cdc_lake.config import load_pipeline

    # shop_backfill: the Maxwell pipeline, @daily from 2026-11-01, its own landing and lake,
    # written before Airflow started (tests/live_stack.py)
    cfg = load_pipeline(live.pipelines_dir / "shop_backfill.yaml")
    sc = MaxwellScenario(cfg)
    sc.write_batch(0)
    live.wait_dag(cfg.name, timeout=240)

    known = {r["dag_run_id"] for r in live.runs(cfg.name)}
    live.api("POST", "/api/v2/backfills", json={
        "dag_id": cfg.name, "from_date": "2026-11-02T00:00:00Z", "to_date": "2026-11-03T00:00:00Z",
        "max_active_runs": 1, "reprocess_behavior": "none", "run_backwards": False, "dag_run_conf": {}})
    # Backfill runs of a paused DAG stay queued; unpausing also starts the latest scheduled run
    # (catchup=False), which competes with the backfill exactly as in production.
    live.unpause(cfg.name)
    runs = _wait_backfill(live, cfg.name, known, expected_runs=2)
    assert all(r["state"] == "success" for r in runs), runs
    others = [r for r in live.runs(cfg.name) if r["dag_run_id"] not in known and r["run_type"] != "backfill"]
    for r in others:
        live.wait_run(cfg.name, r["dag_run_id"], timeout=300)
    summaries = [find_summary(live, cfg.name, r["dag_run_id"])[1] for r in runs + others]
    read = sorted(s["events_read"] for s in summaries if s)
    assert read[-1] == sc.events_written and sum(read) == sc.events_written, read  # once, by one run
    # Asset events (through the pipeline's alias) only from the run that changed the tables: the
    # backfill's no-op runs trigger no downstream DAG
    events = _asset_events(live, cfg.name)
    changed_by = {s["run_id"] for s in summaries if s and s["events_read"]}
    assert {e["extra"]["run_id"] for e in events} == changed_by, events
    # (every table got rows, none was quarantined: no event for the quarantine table)
    assert sorted(e["uri"] for e in events) == sorted(c.path.resolve().as_uri() for c in cfg.tables.values()), events
    known |= {r["dag_run_id"] for r in others}
    sc.mark_processed()
    sc.assert_lake_matches()
    from deltalake import DeltaTable

    versions = {t: DeltaTable(str(c.path)).version() for t, c in cfg.tables.items()}

    # Same range again, reprocessing completed runs, backfill's default concurrency (10): runs
    # overlap, the job's lock turns the losers into skipped tasks, and nothing changes.
    _wait_backfills_completed(live, cfg.name)
    known |= {r["dag_run_id"] for r in runs}
    posted = datetime.now(timezone.utc)
    live.api("POST", "/api/v2/backfills", json={
        "dag_id": cfg.name, "from_date": "2026-11-02T00:00:00Z", "to_date": "2026-11-03T00:00:00Z",
        "reprocess_behavior": "completed", "run_backwards": False, "dag_run_conf": {}})
    # The backfill clears the two completed runs (same run ids) when it is created; wait for
    # both to end again (not for the scheduler's completed mark: a 30 s timer, nothing to check)
    again = _wait_rerun(live, cfg.name, {r["dag_run_id"] for r in runs}, posted)
    assert all(r["state"] == "success" for r in again), again
    sc.assert_lake_matches()
    assert {t: DeltaTable(str(c.path)).version() for t, c in cfg.tables.items()} == versions
    assert len(_asset_events(live, cfg.name)) == len(events), "the repeated range changed nothing"


def _asset_events(live, dag_id: str) -> list[dict]:
    """Every Asset event a DAG's runs recorded (REST API)."""
    return live.api("GET", "/api/v2/assets/events", params={"source_dag_id": dag_id, "limit": 100})["asset_events"]
