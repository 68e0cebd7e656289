"""One writer per pipeline: lock backends.

* ``file`` (default, embedded): an exclusive ``flock`` on ``<checkpoint>/cdc.lock``
  (:class:`cdc_lake.checkpoint.CheckpointLock`) — one host, or hosts sharing a POSIX filesystem
  with working ``flock``.
* ``postgres``: a PostgreSQL **session-level advisory lock** (``pg_try_advisory_lock``) — holds
  across hosts. It lives as long as the driver's database session: if the driver dies (even
  SIGKILL), the server drops the session and with it the lock. The holder (run id, host, pid,
  since) is recorded in a small table so the loser's message names it.

Example::

    lock = PostgresAdvisoryLock("postgresql://airflow@db/airflow", name="shop_maxwell:/lake/_cp")
    lock.acquire("manual_1")          # raises PipelineLocked naming the holder
    try:
        ...                           # the run; lock.verify() before committing, if you like
    finally:
        lock.release()

Every job kind takes its lock through one entry point, chosen by the pipeline YAML's ``lock:``
section (``backend: file`` is the default; see :func:`pipeline_lock`)::

    with pipeline_lock(cfg) as lock:  # or pipeline_lock(checkpoint_path, LockSettings(...))
        lock.acquire(run_id)          # PipelineLocked: exit 75, message names the holder
        ...
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from cdc_lake.checkpoint import CheckpointLock, PipelineLocked, lock_for

__all__ = ["LOCK_BACKENDS", "LockBackendError", "LockSettings", "PipelineLock", "PipelineLocked",
           "PostgresAdvisoryLock", "advisory_key", "pipeline_lock", "resolve_dsn"]
LOCK_BACKENDS = ("file", "postgres")

HOLDERS_TABLE = "cdc_lake_lock_holders"


def advisory_key(name: str) -> tuple[int, int]:
    """Two signed 32-bit ints (PostgreSQL's two-key advisory lock space) from a lock name."""
    digest = hashlib.sha256(f"cdc-lake:{name}".encode()).digest()
    return (int.from_bytes(digest[:4], "big", signed=True),
            int.from_bytes(digest[4:8], "big", signed=True))


class LockBackendError(RuntimeError):
    """The lock backend itself is unusable (driver missing, database unreachable)."""


class PostgresAdvisoryLock:
    """Cross-host pipeline lock on a PostgreSQL advisory lock (see the module docstring)."""

    def __init__(self, dsn: str, *, name: str, connect_timeout: int = 10) -> None:
        self.dsn, self.name, self.connect_timeout = dsn, name, connect_timeout
        self.key = advisory_key(name)
        # pg_locks shows the two keys as (unsigned) oids
        self._oids = tuple(k & 0xFFFFFFFF for k in self.key)
        self._conn: Any = None

    def _connect(self) -> Any:
        try:
            import psycopg2
        except ImportError as e:  # pragma: no cover - psycopg2-binary is a pinned dependency
            raise LockBackendError("lock backend 'postgres' needs psycopg2 "
                                   "(pip install psycopg2-binary)") from e
        try:
            conn = psycopg2.connect(self.dsn, connect_timeout=self.connect_timeout,
                                    application_name=f"cdc-lake lock {self.name}"[:63])
        except psycopg2.Error as e:
            raise LockBackendError(f"lock backend 'postgres': cannot connect "
                                   f"({_mask(self.dsn)}): {str(e).strip()}") from e
        conn.autocommit = True
        return conn

    def acquire(self, run_id: str) -> None:
        """Take the lock or raise :class:`PipelineLocked` at once, naming the holder."""
        conn = self._connect()
        with conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s, %s)", self.key)
            got = cur.fetchone()[0]
            if not got:
                holder = self._holder(cur)
                conn.close()
                raise PipelineLocked(
                    f"pipeline lock {self.name!r} (PostgreSQL advisory lock {self.key}) is held by "
                    f"another run ({holder}); this run stops without touching the checkpoint. "
                    "Wait for that run to finish.")
            me = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
                  "since": datetime.now(timezone.utc).isoformat(timespec="microseconds")}
            cur.execute(f"CREATE TABLE IF NOT EXISTS {HOLDERS_TABLE} (k1 int NOT NULL, "
                        "k2 int NOT NULL, name text, holder jsonb, backend_pid int, "
                        "PRIMARY KEY (k1, k2))")
            cur.execute(f"INSERT INTO {HOLDERS_TABLE} VALUES (%s, %s, %s, %s, pg_backend_pid()) "
                        "ON CONFLICT (k1, k2) DO UPDATE SET name = EXCLUDED.name, "
                        "holder = EXCLUDED.holder, backend_pid = EXCLUDED.backend_pid",
                        (*self.key, self.name, json.dumps(me)))
        self._conn = conn

    def _holder(self, cur: Any) -> str:
        """Who holds it: the holders row whose backend really owns the advisory lock now."""
        where = ("l.locktype = 'advisory' AND l.granted AND l.classid = %s::oid "
                 "AND l.objid = %s::oid AND l.objsubid = 2")
        if _table_exists(cur):
            cur.execute(f"SELECT h.holder, l.pid FROM pg_locks l LEFT JOIN {HOLDERS_TABLE} h "
                        f"ON h.k1 = %s AND h.k2 = %s AND h.backend_pid = l.pid WHERE {where}",
                        (*self.key, *self._oids))
        else:
            cur.execute(f"SELECT NULL, l.pid FROM pg_locks l WHERE {where}", self._oids)
        row = cur.fetchone()
        if row is None:
            return "holder unknown: it released the lock just now; retry"
        holder, pid = row
        if holder:
            h = holder if isinstance(holder, dict) else json.loads(holder)
            return (f"run_id={h.get('run_id')} host={h.get('host')} pid={h.get('pid')} "
                    f"since={h.get('since')}")
        return f"unknown run, database backend pid {pid}"

    def verify(self) -> None:
        """Raise if the lock was lost (database session gone): stop before committing more."""
        if self._conn is None:
            raise PipelineLocked(f"pipeline lock {self.name!r} is not held")
        try:
            with self._conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                            "AND pid = pg_backend_pid() AND classid = %s::oid "
                            "AND objid = %s::oid AND objsubid = 2", self._oids)
                held = cur.fetchone()[0] == 1
        except Exception as e:  # noqa: BLE001 - any database error means: not provably held
            raise PipelineLocked(f"pipeline lock {self.name!r} lost: {e}") from e
        if not held:
            raise PipelineLocked(f"pipeline lock {self.name!r} lost (database session reset)")

    def release(self) -> None:
        if self._conn is None:
            return
        try:
            with self._conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s, %s)", self.key)
        finally:
            self._conn.close()  # closing the session releases it in any case
            self._conn = None

    def __enter__(self) -> PostgresAdvisoryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _table_exists(cur: Any) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (HOLDERS_TABLE,))
    return bool(cur.fetchone()[0])


def _mask(dsn: str) -> str:
    """The DSN without its password (URI or key=value form)."""
    import re

    dsn = re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", dsn)
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", dsn)


@dataclass(frozen=True)
class LockSettings:
    """The pipeline YAML's ``lock:`` section.

    ``backend``: ``file`` (default; ``flock`` on ``<checkpoint>/cdc.lock``) or ``postgres``.
    ``dsn`` (postgres): a libpq DSN/URI, ``${ENV}`` expanded by the config loader; else the
    environment variable ``CDC_LOCK_DSN``; else, with ``conn_id``, Airflow's own
    ``AIRFLOW_CONN_<CONN_ID>`` URI (what the Airflow operator exports for the job).
    """

    backend: str = "file"
    dsn: str | None = None
    conn_id: str | None = None
    file: str | None = None  # the YAML file, for error messages


class PipelineLock(Protocol):
    def acquire(self, run_id: str) -> None: ...
    def release(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> None: ...


def resolve_dsn(settings: LockSettings) -> str:
    """The PostgreSQL DSN for ``backend: postgres`` (see :class:`LockSettings` for the order).

    Raises:
        ConfigError: no DSN anywhere; the message names ``lock.dsn`` and the ways to set it.
    """
    if settings.dsn:
        return settings.dsn
    if os.environ.get("CDC_LOCK_DSN"):
        return os.environ["CDC_LOCK_DSN"]
    if settings.conn_id:
        env = "AIRFLOW_CONN_" + settings.conn_id.upper()
        if os.environ.get(env):
            return os.environ[env]
    from cdc_lake.config import ConfigError

    hint = f", or {('AIRFLOW_CONN_' + settings.conn_id.upper())}" if settings.conn_id else ""
    raise ConfigError(settings.file or "<pipeline>", "lock.dsn",
                      "lock backend 'postgres' needs a DSN: set lock.dsn (e.g. "
                      "'${CDC_LOCK_DSN}' or postgresql://user@host:5432/db), or the environment "
                      f"variable CDC_LOCK_DSN{hint}")


def pipeline_lock(cfg_or_checkpoint: Any, settings: LockSettings | None = None) -> PipelineLock:
    """The lock that keeps one writer per pipeline, for any job kind.

    Args:
        cfg_or_checkpoint: a pipeline config (anything with ``checkpoint_path``, optionally
            ``name`` and ``lock``) or a checkpoint folder.
        settings: the lock settings; default: ``cfg.lock`` if present, else the file backend.

    The returned object has ``acquire(run_id)`` (raises :class:`PipelineLocked` naming the
    holder's run id, host and pid), ``release()``, and is a context manager that releases.
    The postgres lock's name is ``<pipeline>:<checkpoint>``, so two pipelines never collide
    and every host that mounts the same checkpoint path agrees on it.
    """
    checkpoint = Path(getattr(cfg_or_checkpoint, "checkpoint_path", cfg_or_checkpoint))
    settings = settings or getattr(cfg_or_checkpoint, "lock", None) or LockSettings()
    if settings.backend == "file":
        lock: CheckpointLock = lock_for(checkpoint)
        return lock
    if settings.backend == "postgres":
        name = getattr(cfg_or_checkpoint, "name", None)
        return PostgresAdvisoryLock(resolve_dsn(settings),
                                    name=f"{name}:{checkpoint}" if name else str(checkpoint))
    from cdc_lake.config import ConfigError

    raise ConfigError(settings.file or "<pipeline>", "lock.backend",
                      f"unknown value {settings.backend!r}; expected one of: "
                      f"{', '.join(LOCK_BACKENDS)}")


def parse_lock_settings(r: Any) -> LockSettings:
    """``lock:`` of a pipeline YAML, read with a :class:`cdc_lake.config.Reader`."""
    if r.raw.get("lock") is None:
        return LockSettings(file=str(r.file))
    sec = r.section("lock")
    sec.check_known({"backend", "dsn", "conn_id"})
    backend = sec.choice("backend", LOCK_BACKENDS, default="file")
    dsn, conn_id = sec.str("dsn"), sec.str("conn_id")
    if backend == "file" and (dsn or conn_id):
        raise sec.fail("dsn" if dsn else "conn_id", "only applies to backend: postgres")
    return LockSettings(backend=backend, dsn=dsn, conn_id=conn_id, file=str(r.file))
