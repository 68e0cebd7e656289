"""The PostgreSQL advisory-lock backend against a real PostgreSQL (127.0.0.1:5432, or
``CDC_TEST_PG_DSN``): one holder across processes, the loser names it, SIGKILL of the holder frees
the lock (the server drops the dead session), a lost session is noticed by ``verify()``.
"""

from __future__ import annotations

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
