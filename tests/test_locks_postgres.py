"""The PostgreSQL advisory-lock backend against a real PostgreSQL (127.0.0.1:5432, or
``CDC_TEST_PG_DSN``): one holder across processes, the loser names it, SIGKILL of the holder frees
the lock (the server drops the dead session), a lost session is noticed by ``verify()``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from cdc_lake.checkpoint import PipelineLocked
from cdc_lake.locks import LockBackendError, PostgresAdvisoryLock, _mask, advisory_key

DSN = os.environ.get("CDC_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_available() -> str | None:
    try:
        import psycopg2

        psycopg2.connect(DSN, connect_timeout=3).close()
        return None
    except Exception as e:  # noqa: BLE001
        return f"PostgreSQL not reachable at {_mask(DSN)}: {e}"


pytestmark = pytest.mark.skipif(_pg_available() is not None, reason=str(_pg_available()))

HOLD = textwrap.dedent("""
    import sys, time
    from cdc_lake.locks import PostgresAdvisoryLock
    lock = PostgresAdvisoryLock(sys.argv[1], name=sys.argv[2])
    lock.acquire(sys.argv[3])
    print("HELD", flush=True)
    time.sleep(600)
""")


def _holder(name: str, run_id: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLD, DSN, name, run_id], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()  # type: ignore[union-attr]
    assert line.strip() == "HELD", p.stderr.read()  # type: ignore[union-attr]
    return p


def test_key_is_stable_and_spread():
    assert advisory_key("a") == advisory_key("a")
    assert advisory_key("shop:/lake/_cp") != advisory_key("shop:/lake2/_cp")
    assert all(-2**31 <= k < 2**31 for k in advisory_key("x"))


def test_second_driver_is_refused_naming_the_holder_and_kill_frees_the_lock():
    name = f"test-{uuid.uuid4().hex}"
    holder = _holder(name, "run_holder_1")
    try:
        lock = PostgresAdvisoryLock(DSN, name=name)
        t0 = time.monotonic()
        with pytest.raises(PipelineLocked) as e:
            lock.acquire("run_loser")
        assert time.monotonic() - t0 < 5, "the loser must fail at once, not wait"
        msg = str(e.value)
        assert "run_id=run_holder_1" in msg and f"pid={holder.pid}" in msg, msg
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The server notices the dead session: the next run gets the lock (allow a moment).
    deadline = time.monotonic() + 10
    while True:
        lock = PostgresAdvisoryLock(DSN, name=name)
        try:
            lock.acquire("run_next")
            break
        except PipelineLocked:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    try:
        lock.verify()
    finally:
        lock.release()
    again = PostgresAdvisoryLock(DSN, name=name)
    again.acquire("run_after_release")
    again.release()


def test_lost_session_is_noticed_by_verify():
    import psycopg2

    name = f"test-{uuid.uuid4().hex}"
    lock = PostgresAdvisoryLock(DSN, name=name)
    lock.acquire("r1")
    try:
        backend = lock._conn.get_backend_pid()
        admin = psycopg2.connect(DSN)
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (backend,))
        admin.close()
        with pytest.raises(PipelineLocked, match="lost"):
            lock.verify()
    finally:
        try:
            lock.release()
        except Exception:  # noqa: BLE001 - the session is gone on purpose
            lock._conn = None


def test_unreachable_database_is_a_clear_error_without_the_password():
    lock = PostgresAdvisoryLock("postgresql://u:s3cret@127.0.0.1:1/db", name="x", connect_timeout=2)
    with pytest.raises(LockBackendError) as e:
        lock.acquire("r")
    assert "s3cret" not in str(e.value) and "cannot connect" in str(e.value)


# --------------------------------------------------------------------------- wired into the job

JOB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "spark_jobs",
                   "cdc_ingest.py")


FILES = 6


def _pg_pipeline(tmp_path, name: str):  # type: ignore[no-untyped-def]
    from job_helpers import event, land, pipeline

    cfg = pipeline(tmp_path, name=name, extra="lock: {backend: postgres, dsn: '${CDC_TEST_LOCK_DSN}'}\n")
    for f in range(FILES):  # one-file micro-batches after a Spark start: the holder is caught
        land(cfg.landing_path, f"f{f:03d}.json", *(event(f * 10 + i) for i in range(1, 3)))
    return cfg


def _holder_row(name: str, checkpoint) -> dict | None:  # type: ignore[no-untyped-def]
    import psycopg2

    from cdc_lake.locks import HOLDERS_TABLE

    conn = psycopg2.connect(DSN)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", (HOLDERS_TABLE,))
            if not cur.fetchone()[0]:
                return None
            cur.execute(f"SELECT h.holder FROM {HOLDERS_TABLE} h JOIN pg_locks l ON l.pid = h.backend_pid "
                        "AND l.locktype = 'advisory' AND l.granted WHERE h.name = %s",
                        (f"{name}:{checkpoint}",))
            row = cur.fetchone()
            return None if row is None else (row[0] if isinstance(row[0], dict) else json.loads(row[0]))
    finally:
        conn.close()


def test_two_job_processes_one_checkpoint_postgres_lock(spark, tmp_path, monkeypatch):
    """Issue 8: two real job processes on one checkpoint with ``lock: {backend: postgres}``: one
    proceeds, the other exits 75 at once naming the holder (run id, host, pid); after kill -9 of
    the holder the next run gets the lock and the tables converge."""
    import socket

    from job_helpers import rows

    from cdc_lake.cdc.job import run_pipeline

    monkeypatch.setenv("CDC_TEST_LOCK_DSN", DSN)
    name = f"pglock_{uuid.uuid4().hex[:8]}"
    cfg = _pg_pipeline(tmp_path, name)
    env = {**os.environ, "CDC_TEST_LOCK_DSN": DSN}
    holder = subprocess.Popen([sys.executable, JOB, "--pipeline", str(cfg.file), "--run-id", "run_holder",
                               "--max-files-per-trigger", "1"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while (row := _holder_row(name, cfg.checkpoint_path)) is None:
            assert holder.poll() is None, holder.stdout.read()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.1)
        assert row["run_id"] == "run_holder" and row["pid"] == holder.pid

        t0 = time.monotonic()
        loser = subprocess.run([sys.executable, JOB, "--pipeline", str(cfg.file), "--run-id", "run_loser"],
                               env=env, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - t0
        assert loser.returncode == 75, loser.stderr[-3000:]
        assert "PIPELINE LOCKED" in loser.stderr and "run_id=run_holder" in loser.stderr
        assert f"pid={holder.pid}" in loser.stderr and f"host={socket.gethostname()}" in loser.stderr
        assert "Spark" not in loser.stdout, "the loser must stop before starting Spark"
        assert holder.poll() is None, "the holder must still be running when the loser is refused"
        print(f"loser refused in {took:.1f} s (process start included)")
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)  # kill -9 the holder (driver and its JVM)
        holder.wait()
    # The server drops the dead session: the next run (here: in this process) gets the lock.
    deadline = time.monotonic() + 15
    while True:
        try:
            s = run_pipeline(cfg, spark=spark, run_id="run_next")
            break
        except PipelineLocked:
            assert time.monotonic() < deadline, "the lock of a SIGKILLed holder was never freed"
            time.sleep(0.3)
    assert s["status"] == "succeeded"
    assert rows(cfg.tables["orders"].path) == {f * 10 + i: f"s{f * 10 + i}" for f in range(FILES)
                                               for i in range(1, 3)}
    assert _holder_row(name, cfg.checkpoint_path) is None  # released at the end of the run


def test_postgres_backend_without_dsn_is_a_config_error_naming_the_key(tmp_path, monkeypatch):
    from job_helpers import pipeline

    monkeypatch.delenv("CDC_LOCK_DSN", raising=False)
    cfg = pipeline(tmp_path, extra="lock: {backend: postgres, conn_id: cdc_lock_db}\n")
    r = subprocess.run([sys.executable, JOB, "--pipeline", str(cfg.file)], capture_output=True,
                       text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                    if k not in ("CDC_LOCK_DSN", "AIRFLOW_CONN_CDC_LOCK_DB")})
    assert r.returncode == 2, r.stderr
    assert f"{cfg.file}: lock.dsn: lock backend 'postgres' needs a DSN" in r.stderr
    assert "CDC_LOCK_DSN" in r.stderr and "AIRFLOW_CONN_CDC_LOCK_DB" in r.stderr
    # The environment fallbacks, in order.
    from cdc_lake.locks import LockSettings, resolve_dsn

    monkeypatch.setenv("AIRFLOW_CONN_CDC_LOCK_DB", "postgresql://from-airflow-conn/db")
    assert resolve_dsn(LockSettings("postgres", conn_id="cdc_lock_db")) == "postgresql://from-airflow-conn/db"
    monkeypatch.setenv("CDC_LOCK_DSN", "postgresql://from-env/db")
    assert resolve_dsn(LockSettings("postgres", conn_id="cdc_lock_db")) == "postgresql://from-env/db"
    assert resolve_dsn(LockSettings("postgres", dsn="postgresql://yaml/db")) == "postgresql://yaml/db"


def test_maintenance_task_takes_the_postgres_lock_named_by_an_airflow_connection(monkeypatch, tmp_path):
    """Tester: ``lock: {backend: postgres, conn_id: X}`` with the connection stored in Airflow
    (not in the worker's environment) failed every maintenance run with exit 2 ("needs a DSN"),
    while the ingest task of the same pipeline exported it. The maintenance task now exports it
    too. The connection store is Airflow's (stood in here by its lookup returning the real
    PostgreSQL's DSN); the lock and the maintenance run are real."""
    from airflow.sdk import BaseHook, Connection
    from job_helpers import pipeline

    from cdc_lake.airflow.maintenance import CdcMaintenanceOperator

    for k in [k for k in os.environ if k.startswith("AIRFLOW_CONN_") or k == "CDC_LOCK_DSN"]:
        monkeypatch.delenv(k)
    looked_up = []

    def stored_connection(conn_id: str) -> Connection:
        looked_up.append(conn_id)
        return Connection.from_uri(DSN, conn_id=conn_id)

    monkeypatch.setattr(BaseHook, "get_connection", classmethod(lambda cls, c: stored_connection(c)))
    cfg = pipeline(tmp_path, name="pg_maint", extra="lock: {backend: postgres, conn_id: lake_locks_db}\n"
                   "maintenance: {schedule: null}\n")
    report = CdcMaintenanceOperator(task_id="maintain", pipeline=cfg, dry_run=True).execute({})  # type: ignore[arg-type]
    assert looked_up == ["lake_locks_db"]
    assert report and report["pipeline"] == "pg_maint" and report["dry_run"] is True
