"""A real Airflow 3.3 for tests: separate processes, tmp AIRFLOW_HOME, free ports, REST helpers.

Usage (module-scoped, one instance per test module)::

    from live_airflow import LiveAirflow, start_live_airflow, require_postgres

    @pytest.fixture(scope="module")
    def airflow(tmp_path_factory):
        with start_live_airflow(tmp_path_factory.mktemp("af"), db="sqlite") as af:
            yield af

What it does, in order:

1. writes ``<home>/passwords.json`` for SimpleAuthManager users ``admin:admin`` (+ ``viewer:viewer``,
   role viewer) — never ``SIMPLE_AUTH_MANAGER_ALL_ADMINS``;
2. picks free 127.0.0.1 ports for the API server and both log servers;
3. metadata DB: SQLite file in the home, or a fresh PostgreSQL database on 127.0.0.1:5432
   (user postgres, trust auth) that is dropped again at the end;
4. ``airflow db migrate``, then ``api-server``, ``scheduler``, ``dag-processor`` (+ ``triggerer`` if
   asked) each in its own process group, stdout+stderr to ``<home>/proc-logs/<component>.log``;
5. waits until ``/api/v2/monitor/health`` *JSON* says healthy (the endpoint answers 200 even
   when components are not);
6. at exit — normal, exception, or interpreter exit — SIGTERM, then SIGKILL, to every process
   group it started and to any descendant that left its group (e.g. spark-submit JVMs of tasks).

On any failure (start, wait, assertion helpers) the tails of all component logs and of the task
logs are put into the exception message; :func:`dump_logs` prints them on demand.

The environment is LocalExecutor, ``AIRFLOW__CORE__PARALLELISM`` 3, DAG folder refresh 3 s,
a random 86-char JWT secret, ``AIRFLOW__API__BASE_URL`` and ``AIRFLOW__CORE__EXECUTION_API_SERVER_URL``
pointing at the real port, ``PYTHONPATH=<repo>/src``, ``PATH`` starting with the venv's bin (so
tasks find ``spark-submit``), plus whatever the caller passes in ``extra_env`` (e.g.
``CDC_PIPELINES_DIR`` / ``CDC_DATA_DIR`` pointing at tmp copies).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
AIRFLOW_BIN = str(VENV_BIN / "airflow")
PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"
USERS = {"admin": ("admin", "admin"), "viewer": ("viewer", "viewer")}  # name -> (password, role)
TERMINAL_STATES = {"success", "failed"}


class LiveAirflowError(AssertionError):
    """Something about the live Airflow went wrong; the message carries the log tails."""


# ----------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 60) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(text.splitlines()[-lines:])


_KEY_LINE = re.compile(r"(Error|Exception|FAILED|Traceback|\[cdc\]|exit code)", re.IGNORECASE)


def render_task_log(text: str, key_lines: int = 40, last_lines: int = 25) -> str:
    """Airflow's JSON task log, readable: the error/``[cdc]`` lines first, then the tail."""
    rendered = []
    for raw in text.splitlines():
        try:
            e = json.loads(raw)
        except ValueError:
            rendered.append(("", raw))
            continue
        if not isinstance(e, dict):
            rendered.append(("", raw))
            continue
        ev = str(e.get("event", ""))
        for d in e.get("error_detail") or []:
            if isinstance(d, dict):
                ev += f" | {d.get('exc_type')}: {str(d.get('exc_value'))[:1500]}"
        rendered.append((str(e.get("level", "")), ev))
    keys, seen = [], set()
    for lvl, ev in rendered:
        if (lvl in ("error", "critical") or _KEY_LINE.search(ev)) and ev[:200] not in seen:
            seen.add(ev[:200])
            keys.append(f"{lvl.upper():5} {ev[:1600]}")
    tail_part = [f"{lvl.upper():5} {ev[:300]}" for lvl, ev in rendered[-last_lines:]]
    return ("  [key lines]\n" + "\n".join(keys[-key_lines:]) + "\n  [last lines]\n" + "\n".join(tail_part))


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children, grandchildren, ...), from /proc."""
    kids = _children_map()
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().decode("utf-8", "replace").rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return False


def postgres_available() -> tuple[bool, str]:
    """(reachable, reason) for the PostgreSQL leg: 127.0.0.1:5432, user postgres, trust auth."""
    try:
        import psycopg2
    except ImportError:
        return False, "psycopg2 is not installed (pip install psycopg2-binary)"
    try:
        import asyncpg  # noqa: F401  (Airflow 3 also builds an async engine)
    except ImportError:
        return False, "asyncpg is not installed (Airflow 3 needs it for PostgreSQL)"
    try:
        psycopg2.connect(PG_DSN).close()
    except Exception as e:  # noqa: BLE001
        return False, f"PostgreSQL not reachable at 127.0.0.1:5432 as user postgres: {e}".strip()
    return True, ""


@contextlib.contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """Create ``cdc_lake_test_<random>`` and yield its SQLAlchemy URL; drop it afterwards."""
    import psycopg2

    name = f"cdc_lake_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(PG_DSN)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        yield f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"
    finally:
        try:
            with conn.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            conn.close()


# ----------------------------------------------------------------------------- the instance


@dataclass
class LiveAirflow:
    home: Path
    port: int
    env: dict[str, str]
    db: str
    dags_folder: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _tokens: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def proc_logs(self) -> Path:
        return self.home / "proc-logs"

    # -- processes ----------------------------------------------------------

    def run_cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        log = self.proc_logs / f"cli-{args[0]}-{args[1] if len(args) > 1 else ''}.log"
        with open(log, "ab") as out:
            cp = subprocess.run([AIRFLOW_BIN, *args], env=self.env, cwd=self.home, stdout=out,
                                stderr=subprocess.STDOUT, timeout=timeout, start_new_session=True)
        if cp.returncode != 0:
            raise LiveAirflowError(f"`airflow {' '.join(args)}` exited {cp.returncode}\n"
                                   f"--- {log.name} ---\n{tail(log, 80)}")
        return cp

    def start(self, component: str, *args: str) -> None:
        log = open(self.proc_logs / f"{component}.log", "ab")  # noqa: SIM115 - owned by the child
        self.procs[component] = subprocess.Popen(
            [AIRFLOW_BIN, component, *args], env=self.env, cwd=self.home, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def stop(self) -> None:
        """Stop everything we started: process groups first, then stray descendants."""
        procs = [p for p in self.procs.values() if p.poll() is None]
        tree: set[int] = set()
        for p in procs:
            tree.update(descendants(p.pid))
        for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
            for p in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, sig)  # start_new_session: pgid == pid
            for pid in tree:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                for p in procs:
                    p.poll()
                if all(p.returncode is not None for p in procs) and not any(_alive(x) for x in tree):
                    break
                time.sleep(0.2)
            else:
                continue
            break
        for p in procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=1)
        self.procs.clear()

    def dead_components(self) -> list[str]:
        return [f"{n} (exit {p.returncode})" for n, p in self.procs.items() if p.poll() is not None]

    # -- logs ----------------------------------------------------------------

    def log_tails(self, lines: int = 40, task_logs: bool = True) -> str:
        parts = [f"AIRFLOW_HOME={self.home} db={self.db} url={self.base_url}"]
        dead = self.dead_components()
        if dead:
            parts.append(f"DEAD COMPONENTS: {', '.join(dead)}")
        for f in sorted(self.proc_logs.glob("*.log")):
            parts.append(f"--- {f.name} (last {lines} lines) ---\n{tail(f, lines)}")
        if task_logs:
            logs = sorted((self.home / "logs").glob("dag_id=*/**/*.log"), key=lambda p: p.stat().st_mtime)
            for f in logs[-2:]:
                parts.append(f"--- task log {f.relative_to(self.home)} ---\n"
                             f"{render_task_log(f.read_text(errors='replace'), 15, 10)}")
        return "\n".join(parts)

    def fail(self, message: str) -> LiveAirflowError:
        return LiveAirflowError(f"{message}\n{self.log_tails()}")

    def task_log(self, dag_id: str, run_id: str, rendered: bool = False) -> str:
        """All task log files of one run (raw JSON lines, or :func:`render_task_log` ed)."""
        out = []
        for f in sorted((self.home / "logs").glob(f"dag_id={dag_id}/run_id={run_id}/**/*.log")):
            text = f.read_text(errors="replace")
            out.append(f"--- {f.relative_to(self.home)} ---\n{render_task_log(text) if rendered else text}")
        return "\n".join(out)

    # -- HTTP ----------------------------------------------------------------

    def token(self, user: str = "admin") -> str:
        if user not in self._tokens:
            r = httpx.post(f"{self.base_url}/auth/token",
                           json={"username": user, "password": USERS[user][0]}, timeout=30)
            if r.status_code not in (200, 201):
                raise self.fail(f"POST /auth/token for {user}: HTTP {r.status_code} {r.text[:500]}")
            self._tokens[user] = r.json()["access_token"]
        return self._tokens[user]

    def request(self, method: str, path: str, *, user: str | None = "admin", **kw: Any) -> httpx.Response:
        headers = dict(kw.pop("headers", {}) or {})
        if user is not None:
            headers["Authorization"] = f"Bearer {self.token(user)}"
        return httpx.request(method, f"{self.base_url}{path}", headers=headers,
                             timeout=kw.pop("timeout", 30), **kw)

    def api(self, method: str, path: str, expect: tuple[int, ...] = (200,), **kw: Any) -> Any:
        r = self.request(method, path, **kw)
        if r.status_code not in expect:
            raise self.fail(f"{method} {path}: HTTP {r.status_code} (expected {expect}): {r.text[:2000]}")
        return r.json() if r.content else None

    def health(self) -> dict[str, Any]:
        return httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=10).json()

    def wait_healthy(self, timeout: float = 120, triggerer: bool = False) -> dict[str, Any]:
        want = ["metadatabase", "scheduler", "dag_processor"] + (["triggerer"] if triggerer else [])
        deadline, last = time.monotonic() + timeout, "no answer yet"
        while time.monotonic() < deadline:
            if self.dead_components():
                raise self.fail("an Airflow component died during start")
            try:
                h = self.health()
                if all((h.get(c) or {}).get("status") == "healthy" for c in want):
                    return h
                last = json.dumps(h)
            except (httpx.HTTPError, ValueError) as e:
                last = repr(e)
            time.sleep(1)
        raise self.fail(f"Airflow not healthy after {timeout:.0f}s; last health: {last}")

    # -- DAGs and runs -------------------------------------------------------

    def import_errors(self) -> list[dict[str, Any]]:
        return self.api("GET", "/api/v2/importErrors").get("import_errors", [])

    def wait_dag(self, dag_id: str, timeout: float = 120) -> dict[str, Any]:
        """Wait until the dag-processor has serialized ``dag_id``; import errors fail fast."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.request("GET", f"/api/v2/dags/{dag_id}")
            if r.status_code == 200:
                # the trigger endpoint needs the serialized DAG, not just the DAG row
                d = self.request("GET", f"/api/v2/dags/{dag_id}/details")
                if d.status_code == 200:
                    return d.json()
            errs = [e for e in self.import_errors()]
            if errs:
                raise self.fail(f"DAG {dag_id} not loaded; import errors: {json.dumps(errs)[:4000]}")
            time.sleep(1)
        raise self.fail(f"DAG {dag_id} not parsed within {timeout:.0f}s")

    def unpause(self, dag_id: str) -> None:
        self.api("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None, run_id: str | None = None,
                expect: tuple[int, ...] = (200,)) -> httpx.Response:
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        r = self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", json=body)
        if r.status_code not in expect:
            raise self.fail(f"trigger {dag_id}: HTTP {r.status_code} (expected {expect}): {r.text[:2000]}")
        return r

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": 100}).get("dag_runs", [])

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 240,
                 states: set[str] = TERMINAL_STATES) -> dict[str, Any]:
        deadline, state = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            run = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
            state = run["state"]
            if state in states:
                return run
            if self.dead_components():
                raise self.fail(f"component died while waiting for {dag_id}/{run_id}")
            time.sleep(1)
        raise self.fail(f"{dag_id}/{run_id} still {state} after {timeout:.0f}s\n"
                        f"{self.task_log(dag_id, run_id, rendered=True)[-8000:]}")

    def wait_success(self, dag_id: str, run_id: str, timeout: float = 240) -> dict[str, Any]:
        run = self.wait_run(dag_id, run_id, timeout)
        if run["state"] != "success":
            states = {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}
            raise LiveAirflowError(
                f"{dag_id}/{run_id} ended {run['state']}; task states {states}\n"
                f"{self.task_log(dag_id, run_id, rendered=True)[-12000:]}\n"
                f"(AIRFLOW_HOME {self.home}; component logs in {self.proc_logs})")
        return run

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances").get(
            "task_instances", [])

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value",
             map_index: int = -1) -> Any | None:
        r = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
                                f"/xcomEntries/{key}", params={"map_index": map_index, "deserialize": True})
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise self.fail(f"xcom {dag_id}/{run_id}/{task_id}/{key}: HTTP {r.status_code} {r.text[:500]}")
        value = r.json().get("value")
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        return value


def _write_users(home: Path) -> Path:
    f = home / "passwords.json"
    f.write_text(json.dumps({u: pw for u, (pw, _role) in USERS.items()}))
    f.chmod(0o600)
    return f


def airflow_env(home: Path, port: int, sql_conn: str, dags_folder: Path, plugins_folder: Path,
                extra_env: dict[str, str] | None = None) -> dict[str, str]:
    # Start from the caller's environment minus any AIRFLOW_* settings of the developer's own
    # Airflow, so a stray AIRFLOW__CORE__... cannot leak into the test instance.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins_folder),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "3",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, (_p, r) in USERS.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(_write_users(home)),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql_conn,
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(32),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),  # 86 chars
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "3",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "/usr/bin:/bin")]),
        "PYTHONUNBUFFERED": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    })
    env.update(extra_env or {})
    return env


_LIVE: list[LiveAirflow] = []


@atexit.register
def _stop_all_at_exit() -> None:  # e.g. pytest killed with Ctrl-C twice
    for af in list(_LIVE):
        with contextlib.suppress(Exception):
            af.stop()


@contextlib.contextmanager
def start_live_airflow(home: Path, *, db: str = "sqlite", dags_folder: Path | None = None,
                       plugins_folder: Path | None = None, extra_env: dict[str, str] | None = None,
                       triggerer: bool = False, start_timeout: float = 150) -> Iterator[LiveAirflow]:
    """Start a real Airflow (see module doc); yields a :class:`LiveAirflow`, always stops it."""
    home = Path(home)
    (home / "proc-logs").mkdir(parents=True, exist_ok=True)
    dags_folder = Path(dags_folder or REPO / "dags")
    plugins_folder = Path(plugins_folder or REPO / "plugins")
    with contextlib.ExitStack() as stack:
        if db == "sqlite":
            sql_conn = f"sqlite:///{home / 'airflow.db'}"
        elif db == "postgres":
            ok, why = postgres_available()
            if not ok:
                raise RuntimeError(why)
            sql_conn = stack.enter_context(fresh_postgres_database())
        else:
            raise ValueError(f"db must be 'sqlite' or 'postgres', got {db!r}")
        port = free_port()
        env = airflow_env(home, port, sql_conn, dags_folder, plugins_folder, extra_env)
        af = LiveAirflow(home=home, port=port, env=env, db=db, dags_folder=dags_folder)
        _LIVE.append(af)
        stack.callback(lambda: _LIVE.remove(af) if af in _LIVE else None)
        stack.callback(af.stop)  # runs before the database is dropped
        t0 = time.monotonic()
        af.run_cli("db", "migrate")
        af.start("api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1")
        af.start("scheduler")
        af.start("dag-processor")
        if triggerer:
            af.start("triggerer")
        af.wait_healthy(timeout=start_timeout, triggerer=triggerer)
        af.start_seconds = time.monotonic() - t0  # type: ignore[attr-defined]
        yield af


def save_logs(af: LiveAirflow, dest: Path) -> Path:
    """Copy component and task logs to ``dest`` (pytest's tmp dirs are rotated away quickly)."""
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(af.proc_logs, dest / "proc-logs", dirs_exist_ok=True)
    if (af.home / "logs").is_dir():
        shutil.copytree(af.home / "logs", dest / "task-logs", dirs_exist_ok=True)
    return dest


def dump_logs(af: LiveAirflow, lines: int = 25, save_to: Path | None = None) -> None:
    """Print component log tails to the real terminal (bypassing pytest's capture), and copy all
    logs to ``save_to`` if given."""
    if save_to is not None:
        with contextlib.suppress(OSError):
            sys.__stderr__.write(f"\nlive Airflow logs copied to {save_logs(af, save_to)}\n")
    sys.__stderr__.write(f"\n===== live Airflow component logs =====\n{af.log_tails(lines, task_logs=False)}\n")
    sys.__stderr__.flush()
