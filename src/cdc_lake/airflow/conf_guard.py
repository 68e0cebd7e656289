"""Refuse unknown trigger ``conf`` keys with HTTP 400, before a run is created.

Airflow validates each *declared* param against its JSON schema, but a ``conf`` key the DAG does
not declare becomes a new, schema-less param: ``{"max_file_per_trigger": 5}`` (a typo) would be
accepted and the run would use the defaults. This ASGI middleware, registered by the plugin as a
``fastapi_root_middlewares`` entry, looks at every

* ``POST /api/v2/dags/<dag_id>/dagRuns`` (REST and the UI's trigger form; body ``conf``) and
* ``POST /api/v2/backfills`` (body ``dag_id`` + ``dag_run_conf``)

for DAGs tagged ``cdc-lake`` and answers ``400 {"detail": "..."}`` naming the unknown keys and
the valid ones (the DAG's declared params). Everything else passes through untouched; any doubt
(unparsable body, DAG not found) passes through too and Airflow answers as usual. The task
checks again in Python (:func:`cdc_lake.airflow.params.validate_run_params`) and the job's
command line refuses unknown options, so nothing relies on this layer alone.

Registration (``plugins/cdc_lake_plugin.py``)::

    fastapi_root_middlewares = [{"middleware": UnknownConfGuard, "args": [], "kwargs": {},
                                 "name": "cdc-lake unknown conf keys"}]
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import anyio

from cdc_lake.airflow.params import unknown_conf_message

CDC_TAG = "cdc-lake"
# Matched at the end of the path, so an API server under a base-URL prefix is covered too.
_TRIGGER = re.compile(r"/api/v2/dags/(?P<dag>[^/]+)/dagRuns/?$")
_BACKFILL = re.compile(r"/api/v2/backfills/?$")
MAX_BODY = 1 << 20  # conf bodies are small; a bigger body is passed through unread

# dag_id -> the DAG's declared param names, or None when it is not a cdc-lake DAG / unknown
ParamsOf = Callable[[str], "set[str] | None"]


def params_from_metadata_db(dag_id: str) -> set[str] | None:
    """Declared params of the latest serialized version of a ``cdc-lake``-tagged DAG."""
    from airflow.models.dagbag import DBDagBag
    from airflow.utils.session import create_session

    with create_session() as session:
        dag = DBDagBag().get_latest_version_of_dag(dag_id, session=session)
    if dag is None or CDC_TAG not in set(getattr(dag, "tags", None) or ()):
        return None
    return {str(k) for k in dag.params}


class UnknownConfGuard:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: Any, params_of: ParamsOf | None = None) -> None:
        self.app = app
        self.params_of = params_of or params_from_metadata_db

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        trigger, backfill = _TRIGGER.search(path), _BACKFILL.search(path)
        if not trigger and not backfill:
            await self.app(scope, receive, send)
            return
        messages, body = [], b""
        while True:  # buffer the body, then replay it to the app unchanged
            msg = await receive()
            messages.append(msg)
            if msg["type"] != "http.request":
                break
            body += msg.get("body", b"")
            if not msg.get("more_body") or len(body) > MAX_BODY:
                break
        problem = await self._problem(trigger.group("dag") if trigger else None, body)
        if problem is not None:
            await _respond_400(send, problem)
            return

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _problem(self, dag_id: str | None, body: bytes) -> str | None:
        try:
            data = json.loads(body or b"{}")
            if dag_id is None:  # backfill
                dag_id, conf = data.get("dag_id"), data.get("dag_run_conf")
            else:
                conf = data.get("conf")
            if not isinstance(conf, dict) or not conf or not isinstance(dag_id, str):
                return None
            allowed = await anyio.to_thread.run_sync(self.params_of, dag_id)  # DB: off the loop
        except Exception:  # noqa: BLE001 - any doubt: let Airflow answer as usual
            return None
        if allowed is None:
            return None
        return unknown_conf_message(conf, allowed, dag_id=dag_id)


async def _respond_400(send: Any, detail: str) -> None:
    payload = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
