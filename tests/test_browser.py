"""The Airflow UI in headless Chromium: log in, trigger a pipeline with a param, see it succeed,
and see the new Delta version in the "CDC pipelines" plugin view.

Needs Debian's ``chromium`` at /usr/bin/chromium (``scripts/install_browser.sh``); the Python
``playwright`` package drives it through ``executable_path`` (``playwright install`` is never
used). Without the browser the test skips with the reason, unless ``CDC_REQUIRE_BROWSER=1``, which
turns the skip into a failure (CI machines that must run it).

Screenshots go to ``test-artifacts/`` (login.png, dags-list.png, trigger-form.png,
run-success.png, plugin-view.png). The live Airflow is the one shared with
``test_airflow_live.py`` and ``test_capture_dag_live.py`` (``tests/live_stack.py``).
Run: ``pytest -m browser tests/test_browser.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from live_airflow import REPO, dump_logs
from live_pipelines import MaxwellScenario, find_summary, real_pipeline_parts

pytestmark = [pytest.mark.browser, pytest.mark.airflow_live]

CHROMIUM = Path(os.environ.get("CDC_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = REPO / "test-artifacts"
UI_TIMEOUT_MS = 30_000


def _need(condition: bool, reason: str) -> None:
    """Skip with ``reason``, or fail when CDC_REQUIRE_BROWSER=1 says the browser tier must run."""
    if condition:
        return
    if os.environ.get("CDC_REQUIRE_BROWSER") == "1":
        pytest.fail(f"CDC_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    _need(CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK),
          f"{CHROMIUM} not found: run scripts/install_browser.sh (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need(False, "python package playwright is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def live(browser, shared_airflow):
    """The live Airflow shared with test_airflow_live / test_capture_dag_live (tests/live_stack.py)."""
    ready, why = real_pipeline_parts()
    if not ready:
        pytest.skip(why)
    return shared_airflow


@pytest.fixture
def page(browser, live, request):
    ARTIFACTS.mkdir(exist_ok=True)
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(UI_TIMEOUT_MS)
    failed_before = request.session.testsfailed
    yield pg
    if request.session.testsfailed > failed_before:
        try:
            pg.screenshot(path=str(ARTIFACTS / f"failure-{request.node.name}.png"), full_page=True)
        except Exception:  # noqa: BLE001 - best effort
            pass
        dump_logs(live, save_to=REPO / "test-artifacts" / f"airflow-logs-{request.node.name}")
    ctx.close()


def shot(pg, name: str) -> None:
    pg.screenshot(path=str(ARTIFACTS / name), full_page=False)


def test_trigger_from_ui_and_see_delta_version_in_plugin(page, live):
    from deltalake import DeltaTable
    from playwright.sync_api import expect

    from cdc_lake.config import load_pipeline

    # assertions wait as long as page actions (their own default is 5 s: a loaded CI machine
    # listed the DAGs later than that once)
    expect.set_options(timeout=UI_TIMEOUT_MS)

    # shop_browser: the Maxwell pipeline with its own landing and lake (tests/live_stack.py)
    cfg = load_pipeline(live.pipelines_dir / "shop_browser.yaml")
    scenario = MaxwellScenario(cfg)
    files = scenario.write_batch(0)
    live.wait_dag(cfg.name, timeout=180)
    live.unpause(cfg.name)

    # -- log in (SimpleAuthManager form)
    page.goto(f"{live.base_url}/")
    page.locator("input[name=username]").fill("admin")
    page.locator("input[name=password]").fill("admin")
    shot(page, "login.png")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/login" not in url)

    # -- the pipeline DAGs are listed
    page.goto(f"{live.base_url}/dags")
    expect(page.locator("[data-testid=dag-id]", has_text=cfg.name).first).to_be_visible()
    shot(page, "dags-list.png")

    # -- open the trigger form, set a param, trigger
    page.goto(f"{live.base_url}/dags/{cfg.name}")
    before = {r["dag_run_id"] for r in live.runs(cfg.name)}
    page.locator("[data-testid=trigger-dag-button]").first.click()
    dialog = page.locator("[role=dialog][data-state=open]")
    expect(dialog).to_be_visible()
    field = dialog.locator("input[name=element_max_files_per_trigger]")
    if not field.is_visible():  # params may sit in a collapsed "Run parameters" section
        dialog.get_by_text("Run Parameters", exact=False).first.click()
    field.fill("1")
    expect(field).to_have_value("1")
    shot(page, "trigger-form.png")
    dialog.locator("[data-testid=trigger-dag-submit]").click()

    # -- the new run carries the param and succeeds
    deadline, new = time.monotonic() + 30, []
    while time.monotonic() < deadline and not new:
        new = [r for r in live.runs(cfg.name) if r["dag_run_id"] not in before]
        time.sleep(0.5)
    assert len(new) == 1, f"expected one new run from the trigger form, got {new}"
    run = new[0]
    assert run["conf"].get("max_files_per_trigger") == 1, run["conf"]
    live.wait_success(cfg.name, run["dag_run_id"], timeout=360)
    _task, summary = find_summary(live, cfg.name, run["dag_run_id"])
    assert summary and summary["batches"] == len(files), summary
    scenario.mark_processed()
    scenario.assert_lake_matches()

    page.goto(f"{live.base_url}/dags/{cfg.name}/runs/{run['dag_run_id']}")
    expect(page.get_by_text("success", exact=False).first).to_be_visible()
    shot(page, "run-success.png")

    # -- the plugin view: nav Browse -> "CDC pipelines" -> iframe with the Delta versions
    page.goto(f"{live.base_url}/")
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="CDC pipelines").click()
    page.wait_for_url("**/plugin/cdc-pipelines")
    frame = page.frame_locator("iframe").first
    expect(frame.locator(f"[data-testid=pipeline-{cfg.name}]")).to_be_visible()
    for name, t in cfg.tables.items():
        version = DeltaTable(str(t.path)).version()
        expect(frame.locator(f"[data-testid=delta-version-{cfg.name}-{name}]")).to_have_text(str(version))
    expect(frame.locator(f"[data-testid=run-status-{cfg.name}]")).to_have_text("succeeded")
    expect(frame.locator(f"[data-testid=last-batch-{cfg.name}]")).to_have_text(
        str(summary["last_batch_id"]))
    shot(page, "plugin-view.png")


def test_plugin_view_needs_login_in_browser(browser, live):
    """A fresh browser (no ``_token`` cookie) gets 401 from the plugin app, not the page."""
    ctx = browser.new_context()
    try:
        resp = ctx.new_page().goto(f"{live.base_url}/cdc/")
        assert resp is not None and resp.status in (401, 403), resp and resp.status
    finally:
        ctx.close()
