"""A private, in-process Airflow for tests: AIRFLOW_HOME in a temp dir, SQLite metadata DB.

Import this module **before anything imports airflow** (Airflow reads its configuration once, at
import)::

    import airflow_env                      # noqa: F401  (first)
    from airflow_env import airflow_db      # session fixture: migrated metadata DB

What importing does: drops the developer's own ``AIRFLOW*`` variables (no stray
``AIRFLOW_CONN_SPARK_DEFAULT`` or DB URL can leak in), points ``AIRFLOW_HOME`` at a fresh temp
dir (removed at exit) with ``dags_folder = <repo>/dags``, no examples, SQLite DB; puts
``<repo>/src`` on ``sys.path`` and the venv's ``bin`` first on ``PATH`` (tasks find
``spark-submit``).

The ``airflow_db`` fixture runs ``airflow db migrate`` once per Airflow version and machine and
keeps a copy of the fresh DB in the temp folder; later sessions copy it (≈0.1 s instead of ≈5 s).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DAGS_FOLDER = REPO / "dags"
VENV_BIN = Path(sys.executable).parent


def _configure() -> Path:
    existing = os.environ.get("CDC_TEST_AIRFLOW_HOME")
    if existing:  # imported twice (e.g. under two module names): keep the first setup
        return Path(existing)
    if "airflow" in sys.modules:
        raise RuntimeError("airflow was imported before tests/airflow_env.py configured it; "
                           "import airflow_env first in every test module that uses Airflow")
    home = Path(tempfile.mkdtemp(prefix="cdc-airflow-home-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    for key in [k for k in os.environ if k.startswith("AIRFLOW")]:
        del os.environ[key]
    os.environ.update({
        "CDC_TEST_AIRFLOW_HOME": str(home),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    if str(REPO / "src") not in sys.path:
        sys.path.insert(0, str(REPO / "src"))
    return home


AIRFLOW_HOME = _configure()
_DB = AIRFLOW_HOME / "airflow.db"


def migrate_db() -> Path:
    """Create the metadata DB (idempotent within a session); return its path."""
    if (AIRFLOW_HOME / ".migrated").exists():
        return _DB
    cache = Path(tempfile.gettempdir()) / f"cdc-lake-airflow-{version('apache-airflow')}-migrated.sqlite"
    if cache.is_file() and not _DB.exists():
        shutil.copyfile(cache, _DB)
    else:
        cp = subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env=os.environ.copy(),
                            capture_output=True, text=True, timeout=600)
        if cp.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed ({cp.returncode}):\n{cp.stdout[-3000:]}\n"
                               f"{cp.stderr[-3000:]}")
        staging = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        shutil.copyfile(_DB, staging)
        os.replace(staging, cache)
    (AIRFLOW_HOME / ".migrated").touch()
    return _DB


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated SQLite metadata DB in the private AIRFLOW_HOME."""
    return migrate_db()
