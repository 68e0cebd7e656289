"""FastAPI app behind the "CDC pipelines" view, mounted into the Airflow API server by the plugin.

Routes (relative to the plugin's ``url_prefix``, ``/cdc``):

* ``GET /``            HTML page: one section per pipeline, one row per table.
* ``GET /api/status``  the same data as JSON (:func:`cdc_lake.airflow.status.collect_status`).

Every route requires a logged-in Airflow user: ``requires_authenticated()`` from
``airflow.api_fastapi.core_api.security`` resolves the user from the ``Authorization: Bearer``
token or, in the browser (the view is shown in an iframe of the Airflow UI), from the ``_token``
cookie; anonymous requests get 401, a bad token 401/403. A plugin app mounted by Airflow is *not*
authenticated by default, so the dependency is set on the app itself, not per route.

This module imports the Airflow API server's security code (≈3 s), so the plugin only imports
it lazily, on the first request inside the API server (see ``plugins/cdc_lake_plugin.py``).
"""

from __future__ import annotations

from html import escape
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse, JSONResponse

from cdc_lake.airflow import status as status_mod

URL_PREFIX = "/cdc"


def _e(v: Any) -> str:
    """HTML-escape any value; ``None`` shows as an em dash."""
    return "\u2014" if v is None else escape(str(v), quote=True)


def _num(v: Any) -> str:
    return _e(v) if v is not None else '<span class="muted">\u2014</span>'


_CSS = """
:root { color-scheme: light dark; --muted:#6b7280; --border:#d1d5db; --ok:#15803d; --bad:#b91c1c;
        --warn:#b45309; --head:#f3f4f6; }
@media (prefers-color-scheme: dark) { :root { --border:#374151; --head:#1f2937; --muted:#9ca3af; } }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1rem 1.25rem;
       font-size: 14px; }
h1 { font-size: 1.3rem; margin: 0 0 .25rem; }
h2 { font-size: 1.1rem; margin: 1.5rem 0 .25rem; }
.muted { color: var(--muted); }
.meta { margin: .15rem 0; }
table { border-collapse: collapse; margin-top: .5rem; min-width: 60%; }
th, td { border: 1px solid var(--border); padding: .3rem .6rem; text-align: left; }
th { background: var(--head); font-weight: 600; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.status-succeeded, .ok { color: var(--ok); font-weight: 600; }
.status-failed, .err { color: var(--bad); font-weight: 600; }
.pending { color: var(--warn); font-weight: 600; }
code { font-size: 12px; }
"""


def render_html(data: dict[str, Any]) -> str:
    """The status page; every value from files or configs goes through :func:`_e`."""
    out: list[str] = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        "<title>CDC pipelines</title><style>", _CSS, "</style></head><body>",
        "<h1>CDC pipelines</h1>",
        f"<p class='muted'>Read from Delta logs, Spark checkpoints and run summaries at "
        f"{_e(data.get('generated_at'))} &middot; pipelines folder <code>{_e(data.get('pipelines_dir'))}"
        f"</code> &middot; <a href='./'>refresh</a> &middot; <a href='api/status'>JSON</a></p>",
    ]
    errors = data.get("config_errors") or []
    if errors:
        out.append("<h2 class='err'>Configuration errors</h2><ul data-testid='config-errors'>")
        out += [f"<li><code>{_e(err)}</code></li>" for err in errors]
        out.append("</ul>")
    if not data.get("pipelines"):
        out.append("<p data-testid='no-pipelines'>No pipelines configured.</p>")
    for p in data.get("pipelines", []):
        name = p["pipeline"]
        out.append(f"<section data-testid='pipeline-{_e(name)}' data-pipeline='{_e(name)}'>")
        out.append(f"<h2><a href='../dags/{_e(name)}' target='_top'>{_e(name)}</a> "
                   f"<span class='muted'>({_e(p.get('format'))})</span></h2>")
        if p.get("description"):
            out.append(f"<p class='meta'>{_e(p['description'])}</p>")
        if p.get("kind") in ("enrich", "dimension"):
            from cdc_lake.airflow.kind_status import render_kind_block

            out.append(render_kind_block(p, _e, _num))
        ck = p["checkpoint"]
        if p.get("kind") == "dimension":
            pass  # a batch job: no streaming checkpoint; the kind block shows the last applied date
        elif not ck["exists"]:
            ck_text = "<span class='muted'>no checkpoint yet</span>"
        elif ck.get("error"):
            ck_text = f"<span class='err'>{_e(ck['error'])}</span>"
        else:
            ck_text = (f"last batch id <b data-testid='last-batch-{_e(name)}'>"
                       f"{_num(ck['last_batch_id'])}</b>")
            if ck.get("pending_batch_id") is not None:
                ck_text += (f" &middot; <span class='pending' data-testid='pending-batch-{_e(name)}'>"
                            f"batch {_e(ck['pending_batch_id'])} planned, not committed</span>")
        if p.get("kind") != "dimension":
            out.append(f"<p class='meta'>Checkpoint: {ck_text} <code class='muted'>{_e(ck['path'])}</code></p>")
        run = p.get("last_run")
        if p.get("last_run_error"):
            out.append(f"<p class='meta err'>Last run: {_e(p['last_run_error'])}</p>")
        elif run is None:
            out.append("<p class='meta muted'>Last run: none yet</p>")
        else:
            st = str(run.get("status") or "unknown")
            # an enrichment run reads facts; its --reprocess snapshot batch is reported apart
            # (tester: a reprocess that rebuilt 210 facts showed "0 events read")
            read, what = run.get("events_read"), str(run.get("read_label") or "events read")
            snap = run.get("reprocess_snapshot")
            snap_text = (f" &middot; reprocess snapshot: <span data-testid='reprocess-{_e(name)}'>"
                         f"{_num(snap.get('facts_read'))} facts read, {_num(snap.get('enriched_upserted'))}"
                         f" enriched, {_num(snap.get('parked'))} parked</span>"
                         if isinstance(snap, dict) else "")
            out.append(
                f"<p class='meta'>Last run <code>{_e(run.get('run_id'))}</code>: "
                f"<span class='status-{_e(st)}' data-testid='run-status-{_e(name)}'>{_e(st)}</span>"
                f" &middot; finished {_e(run.get('finished_at'))} &middot; {_num(run.get('batches'))} "
                f"batch(es) &middot; {_num(read)} {what}{snap_text} &middot; quarantined "
                f"<b data-testid='quarantined-{_e(name)}'>{_num(run.get('quarantined'))}</b></p>")
        q = p.get("quarantine") or {}
        if q.get("exists"):
            out.append(f"<p class='meta muted'>Quarantine table version {_num(q.get('delta_version'))}"
                       f" <code>{_e(q.get('path'))}</code></p>")
        out.append("<table><thead><tr><th>Table</th><th>Source</th><th>Delta version</th>"
                   "<th>Inserted</th><th>Updated</th><th>Deleted</th><th>Path</th></tr></thead><tbody>")
        for t in p["tables"]:
            tid = f"{_e(name)}-{_e(t['table'])}"
            if t.get("delta_error"):
                ver = f"<span class='err'>{_e(t['delta_error'])}</span>"
            elif not t["exists"]:
                ver = "<span class='muted'>not created</span>"
            else:
                ver = _e(t["delta_version"])
            lr = t.get("last_run") or {}
            out.append(
                f"<tr data-testid='table-{tid}'><td>{_e(t['table'])}"
                f"{' <span class=muted>(SCD2)</span>' if t.get('scd') == 2 else ''}</td>"
                f"<td>{_e(t.get('source'))}</td>"
                f"<td class='n' data-testid='delta-version-{tid}'>{ver}</td>"
                f"<td class='n'>{_num(lr.get('inserted'))}</td><td class='n'>{_num(lr.get('updated'))}</td>"
                f"<td class='n'>{_num(lr.get('deleted'))}</td><td><code class='muted'>{_e(t['path'])}"
                f"</code></td></tr>")
        out.append("</tbody></table></section>")
    out.append("</body></html>")
    return "".join(out)


def create_app(*, authenticate: bool = True) -> FastAPI:
    """Build the app. ``authenticate=False`` is for unit tests of the rendering only."""
    dependencies = []
    if authenticate:
        from airflow.api_fastapi.core_api.security import requires_authenticated

        dependencies.append(Depends(requires_authenticated()))
    app = FastAPI(title="CDC pipelines", dependencies=dependencies, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.get("/", response_class=HTMLResponse)
    def page() -> HTMLResponse:
        return HTMLResponse(render_html(status_mod.collect_status()),
                            headers={"Cache-Control": "no-store"})

    @app.get("/api/status")
    def api_status() -> JSONResponse:
        return JSONResponse(status_mod.collect_status(), headers={"Cache-Control": "no-store"})

    return app
