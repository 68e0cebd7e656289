"""Airflow plugin: the "CDC pipelines" status view (logic in ``cdc_lake.airflow.plugin_app``).

* ``fastapi_apps``: a FastAPI app mounted by the API server at ``/cdc`` (HTML at ``/cdc/``,
  JSON at ``/cdc/api/status``); every route requires a logged-in Airflow user.
* ``external_views``: a nav entry "CDC pipelines" (Browse menu) that shows ``/cdc/`` in an iframe.

Airflow imports plugins in every component, including each task process (for macros), so this
file stays cheap: the FastAPI app (and the API server's security module it needs) is only built
on the first request, inside the API server. Never import pyspark here.
Plugin changes need an API server restart.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from airflow.plugins_manager import AirflowPlugin

_SRC = Path(__file__).resolve().parents[1] / "src"
if _SRC.is_dir() and str(_SRC) not in sys.path:  # repo checkout without `pip install -e .`
    sys.path.append(str(_SRC))

URL_PREFIX = "/cdc"


class _LazyStatusApp:
    """ASGI app that builds ``cdc_lake.airflow.plugin_app.create_app()`` on first use."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self._app is None:
            from cdc_lake.airflow.plugin_app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class _LazyConfGuard:
    """Root ASGI middleware ``cdc_lake.airflow.conf_guard.UnknownConfGuard`` (imported on first
    use): unknown trigger ``conf`` keys of cdc-lake DAGs get HTTP 400 naming the valid keys."""

    def __init__(self, app: Any) -> None:
        self.app, self._guard = app, None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self._guard is None:
            from cdc_lake.airflow.conf_guard import UnknownConfGuard

            self._guard = UnknownConfGuard(self.app)
        await self._guard(scope, receive, send)


class CdcLakePlugin(AirflowPlugin):
    name = "cdc_lake"
    fastapi_root_middlewares = [
        {"middleware": _LazyConfGuard, "args": [], "kwargs": {},
         "name": "cdc-lake: refuse unknown trigger conf keys"},
    ]
    fastapi_apps = [
        {"app": _LazyStatusApp(), "url_prefix": URL_PREFIX, "name": "CDC pipelines status"},
    ]
    external_views = [
        {
            "name": "CDC pipelines",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "category": "browse",
            "url_route": "cdc-pipelines",
        },
    ]
