"""A private, throw-away MariaDB server with a row binlog, for tests.

Started from the machine's MariaDB binaries (``mariadb-install-db`` + ``mariadbd``) in a temporary
datadir, on a free port bound to 127.0.0.1, with its own socket and pid file — never the
MariaDB on port 3306. Skips (``pytest.skip``) with the reason when the binaries are missing.

Use the ``mariadb_server`` fixture (module scope) from a test module::

    from mariadb_server import mariadb_server  # noqa: F401  (pytest fixture)

    def test_x(mariadb_server):
        with mariadb_server.connect("shop") as conn: ...

Server settings follow docs/field-notes.md: ``--binlog-format=ROW --binlog-row-image=FULL
--binlog-row-metadata=FULL``; with ``--no-defaults`` the server charset would be latin1, so the
server is started with utf8mb4 and clients connect with utf8mb4.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

_SRC = Path(__file__).resolve().parents[1] / "src"
if str(_SRC) not in sys.path:  # make `cdc_lake` importable without an install
    sys.path.insert(0, str(_SRC))

CAPTURE_USER = "cdc_capture"
CAPTURE_PASSWORD = "capture-pw"


def _find(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name) or next(
            (str(p) for d in ("/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/mysql/bin")
             if (p := Path(d) / name).is_file() and os.access(p, os.X_OK)), None)
        if path:
            return path
    return None


def find_binaries() -> tuple[str, str] | None:
    """(server, install-db) paths, or None when this machine has no MariaDB."""
    server = _find("mariadbd", "mysqld")
    install = _find("mariadb-install-db", "mysql_install_db")
    if not server or not install:
        return None
    try:
        out = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if "mariadb" not in (out.stdout + out.stderr).lower():
        return None  # Oracle MySQL's mysqld takes other options; not supported by this fixture
    return server, install


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class MariaDBServer:
    """A running private server; ``stop()`` ends it and removes its files."""

    base: Path
    port: int
    proc: subprocess.Popen[bytes]
    host: str = "127.0.0.1"
    user: str = "root"
    password: str = ""
    _stopped: bool = field(default=False, repr=False)

    @property
    def datadir(self) -> Path:
        return self.base / "data"

    @property
    def error_log(self) -> Path:
        return self.base / "error.log"

    def connect(self, database: str | None = None, **kw: Any) -> Any:
        import pymysql

        return pymysql.connect(host=self.host, port=self.port, user=kw.pop("user", self.user),
                               password=kw.pop("password", self.password), database=database,
                               charset="utf8mb4", autocommit=kw.pop("autocommit", True), **kw)

    def execute(self, *statements: str, database: str | None = None) -> None:
        with self.connect(database) as conn, conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)

    def create_capture_user(self, databases: tuple[str, ...] = ()) -> tuple[str, str]:
        """A least-privilege capture account: REPLICATION SLAVE + BINLOG MONITOR (+ SELECT)."""
        stmts = [f"CREATE USER IF NOT EXISTS '{CAPTURE_USER}'@'127.0.0.1' "
                 f"IDENTIFIED BY '{CAPTURE_PASSWORD}'",
                 f"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{CAPTURE_USER}'@'127.0.0.1'"]
        stmts += [f"GRANT SELECT ON `{db}`.* TO '{CAPTURE_USER}'@'127.0.0.1'" for db in databases]
        self.execute(*stmts)
        return CAPTURE_USER, CAPTURE_PASSWORD

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.proc.poll() is None:
            self.proc.terminate()  # only the process this fixture started
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if not os.environ.get("CDC_KEEP_MARIADB"):
            shutil.rmtree(self.base, ignore_errors=True)


def start_server(extra_args: tuple[str, ...] = (), startup_timeout: float = 60.0) -> MariaDBServer:
    """Initialise a datadir and start a private server; raises RuntimeError if it cannot."""
    bins = find_binaries()
    if bins is None:
        raise RuntimeError("MariaDB server binaries (mariadbd, mariadb-install-db) not found")
    server_bin, install_bin = bins
    # short path: the unix socket path must stay under ~107 bytes
    base = Path(tempfile.mkdtemp(prefix="cdc-mdb-"))
    data = base / "data"
    run_as = ["--user=root"] if os.geteuid() == 0 else []
    init = subprocess.run(
        [install_bin, "--no-defaults", f"--datadir={data}", "--auth-root-authentication-method=normal",
         "--skip-test-db", "--skip-name-resolve", *run_as],
        capture_output=True, text=True, timeout=300)
    if init.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"mariadb-install-db failed ({init.returncode}): "
                           f"{(init.stdout + init.stderr)[-2000:]}")
    last_err = ""
    for _attempt in range(3):  # the free port can be taken between probe and bind
        port = _free_port()
        args = [
            server_bin, "--no-defaults", f"--datadir={data}", f"--socket={base / 'mysqld.sock'}",
            f"--port={port}", "--bind-address=127.0.0.1", f"--pid-file={base / 'mysqld.pid'}",
            f"--log-error={base / 'error.log'}", *run_as,
            f"--log-bin={data / 'mariadb-bin'}", "--binlog-format=ROW", "--binlog-row-image=FULL",
            "--binlog-row-metadata=FULL", "--server-id=1",
            "--skip-name-resolve", "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_unicode_ci", "--performance-schema=OFF",
            "--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=2",
            "--sync-binlog=0", "--max-connections=40", *extra_args,
        ]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        srv = MariaDBServer(base=base, port=port, proc=proc)
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                with srv.connect() as conn, conn.cursor() as cur:
                    cur.execute("SELECT 1")
                return srv
            except Exception as e:  # noqa: BLE001 - still starting
                last_err = str(e)
                time.sleep(0.1)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        try:
            last_err = (base / "error.log").read_text(errors="replace")[-2000:] or last_err
        except OSError:
            pass
    shutil.rmtree(base, ignore_errors=True)
    raise RuntimeError(f"private MariaDB did not start: {last_err}")


@pytest.fixture(scope="module")
def mariadb_server() -> Iterator[MariaDBServer]:
    """A private MariaDB with a ROW binlog for this test module (skips without binaries)."""
    if find_binaries() is None:
        pytest.skip("MariaDB server binaries (mariadbd + mariadb-install-db) are not installed "
                    "on this machine; install the Debian package mariadb-server to run this test")
    srv = start_server()  # binaries present but no server: a real failure, not a skip
    try:
        yield srv
    finally:
        srv.stop()
