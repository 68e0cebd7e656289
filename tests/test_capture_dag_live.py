"""``capture >> ingest`` in a real Airflow against a private MariaDB with a ROW binlog (issue 8).

A pipeline YAML with a ``capture:`` section becomes a two-task DAG. Here a real Airflow 3.3
(LocalExecutor; the instance shared with ``test_airflow_live.py`` and ``test_browser.py``,
``tests/live_stack.py``, which writes both pipelines before it starts) runs it twice with DML
in MariaDB between runs — inserts, updates, deletes, a primary-key change, a multi-row
statement, a rolled-back transaction — and after each DAG run every Delta table equals ``SELECT *`` of its source table
(the source database is the oracle; values compared typed). The connections are created
through Airflow's REST API, as a user would in the UI. A second pipeline points at a port
where nothing listens: its capture fails, and its ingest never runs (``upstream_failed``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
from pathlib import Path
from typing import Any

import pytest

from live_airflow import REPO, dump_logs, free_port
from live_stack import CAPTURE_DB as DB
from mariadb_server import MariaDBServer, mariadb_server  # noqa: F401

pytestmark = [pytest.mark.airflow_live, pytest.mark.mariadb,
              pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning")]

SEED = random.randrange(1 << 30)
TABLES = {
    "accounts": ("CREATE TABLE accounts (id INT NOT NULL PRIMARY KEY, name VARCHAR(40) NOT NULL, "
                 "balance DECIMAL(10,2) NULL, opened DATE NULL) ENGINE=InnoDB", ("id",)),
    "moves": ("CREATE TABLE moves (account_id INT NOT NULL, seq INT NOT NULL, amount DECIMAL(10,2) "
              "NOT NULL, at DATETIME NULL, memo VARCHAR(60) NULL, PRIMARY KEY (account_id, seq)) "
              "ENGINE=InnoDB", ("account_id", "seq")),
}


def _dml(srv: MariaDBServer, rng: random.Random, round_no: int) -> None:
    """A random round of changes; deterministic per seed."""
    conn = srv.connect(DB)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM accounts")
            ids = sorted(r[0] for r in cur.fetchall())
            base = 100 * round_no
            new = [base + i for i in range(rng.randint(3, 6))]
            cur.executemany("INSERT INTO accounts VALUES (%s, %s, %s, %s)",
                            [(i, f"acct-{i}-{rng.choice(['ä', 'x', '中'])}",
                              decimal.Decimal(rng.randint(-5000, 5000)) / 100,
                              dt.date(2026, 1, 1) + dt.timedelta(days=rng.randint(0, 300))) for i in new])
            for i in new:
                cur.execute("INSERT INTO moves VALUES (%s, 1, %s, %s, NULL), (%s, 2, %s, NULL, 'two')",
                            (i, decimal.Decimal(rng.randint(1, 900)) / 10,
                             dt.datetime(2026, 2, 1, rng.randint(0, 23), rng.randint(0, 59)),
                             i, decimal.Decimal("-1.50")))
            conn.commit()
            if ids:
                victim = rng.choice(ids)
                cur.execute("UPDATE accounts SET balance = balance + 1, name = CONCAT(name, '+') "
                            "WHERE id = %s", (victim,))
                cur.execute("DELETE FROM moves WHERE account_id = %s AND seq = 2", (victim,))
                gone = rng.choice(ids)
                cur.execute("DELETE FROM moves WHERE account_id = %s", (gone,))
                cur.execute("DELETE FROM accounts WHERE id = %s", (gone,))
                conn.commit()
                keep = [i for i in ids if i != gone]
                if keep:  # primary-key change: the old key must disappear from Delta
                    old = rng.choice(keep)
                    cur.execute("UPDATE moves SET seq = seq + 10 WHERE account_id = %s AND seq = 1", (old,))
                    conn.commit()
            cur.execute("INSERT INTO accounts VALUES (%s, 'rolled back', 0, NULL)", (base + 99,))
            conn.rollback()
    finally:
        conn.close()


def _source(srv: MariaDBServer, table: str) -> dict[tuple, dict[str, Any]]:
    keys = TABLES[table][1]
    with srv.connect(DB) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM `{table}`")
        cols = [d[0] for d in cur.description]
        rows = [dict(zip(cols, r)) for r in cur.fetchall()]
    return {tuple(r[k] for k in keys): r for r in rows}


def _lake(path: Path, table: str, columns: list[str]) -> dict[tuple, dict[str, Any]]:
    from deltalake import DeltaTable

    keys = TABLES[table][1]
    out: dict[tuple, dict[str, Any]] = {}
    for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist():
        key = tuple(r[k] for k in keys)
        assert key not in out, f"{table}: duplicate key {key} in Delta"
        out[key] = {c: (r.get(c).astimezone(dt.timezone.utc).replace(tzinfo=None)
                        if isinstance(r.get(c), dt.datetime) and r.get(c).tzinfo else r.get(c))
                    for c in columns}
    return out


def _assert_lake_equals_source(srv: MariaDBServer, lake: Path, context: str) -> int:
    compared = 0
    for table in TABLES:
        expected = _source(srv, table)
        columns = list(next(iter(expected.values())).keys()) if expected else []
        actual = _lake(lake / table, table, columns)
        assert set(actual) == set(expected), (
            f"[seed {SEED}] {context}: {table}: missing {sorted(set(expected) - set(actual))[:5]}, "
            f"extra {sorted(set(actual) - set(expected))[:5]}")
        diffs = [(k, c, expected[k][c], actual[k][c]) for k in expected for c in columns
                 if expected[k][c] != actual[k][c]]
        assert not diffs, f"[seed {SEED}] {context}: {table}: (key, col, source, delta) {diffs[:5]}"
        compared += len(expected)
    return compared


def _connection(conn_id: str, port: int, user: str, password: str) -> dict[str, Any]:
    return {"connection_id": conn_id, "conn_type": "mysql", "host": "127.0.0.1", "port": port,
            "login": user, "password": password}


@pytest.fixture(scope="module")
def setup(mariadb_server, shared_airflow):  # noqa: F811
    srv, af = mariadb_server, shared_airflow
    srv.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
    srv.execute(*(sql for sql, _ in TABLES.values()), database=DB)
    user, pw = srv.create_capture_user((DB,))
    for conn_id, port in (("cdc_mariadb", srv.port), ("dead_mariadb", free_port())):
        af.api("POST", "/api/v2/connections", expect=(200, 201),
               json=_connection(conn_id, port, user, pw))
    yield srv, af, af.data_dir


def test_capture_then_ingest_equals_select_star_after_every_dag_run(setup):
    srv, af, root = setup
    rng = random.Random(SEED)
    try:
        af.wait_dag("live_capture")
        tasks = {t["task_id"]: t for t in af.api("GET", "/api/v2/dags/live_capture/tasks")["tasks"]}
        assert set(tasks) == {"capture", "ingest"}
        assert tasks["capture"]["downstream_task_ids"] == ["ingest"]
        af.unpause("live_capture")
        for n in (1, 2):  # the first run starts from nothing, the second is incremental
            _dml(srv, rng, n)
            run_id = f"cap_{n}"
            af.trigger("live_capture", run_id=run_id)
            af.wait_success("live_capture", run_id, timeout=300)
            cap = af.xcom("live_capture", run_id, "capture")
            ingest = af.xcom("live_capture", run_id, "ingest")
            assert cap and cap.get("files"), f"run {n}: capture landed nothing: {cap}"
            assert ingest and ingest["status"] == "succeeded", ingest
            assert _assert_lake_equals_source(srv, root / "lake" / "live_capture", f"after DAG run {n}") > 0
    except Exception:
        dump_logs(af, save_to=REPO / "test-artifacts" / "capture-dag-live")
        raise


def test_failed_capture_never_runs_the_ingest(setup):
    _, af, root = setup
    af.wait_dag("dead_capture")
    af.unpause("dead_capture")
    af.trigger("dead_capture", run_id="dead_1")
    run = af.wait_run("dead_capture", "dead_1", timeout=180)
    states = {t["task_id"]: t["state"] for t in af.task_instances("dead_capture", "dead_1")}
    assert run["state"] == "failed", run
    assert states == {"capture": "failed", "ingest": "upstream_failed"}, states
    assert "127.0.0.1" in af.task_log("dead_capture", "dead_1")
    dead_lake = root / "lake" / "dead_capture"
    assert not dead_lake.exists() or not any(dead_lake.iterdir())
