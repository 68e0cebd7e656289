"""A real Spark standalone cluster on 127.0.0.1 for tests: one master, N workers, from the pyspark
distribution itself (``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``).

Example::

    with StandaloneCluster(tmp_path, workers=2) as cluster:
        subprocess.run([spark_submit, "--master", cluster.master_url, job, ...])
        cluster.kill_worker(0)          # SIGKILL one worker (and its executor) mid-run

Free ports, temp work dirs, logs under ``<tmp>/cluster/``; everything is stopped on exit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cluster_env() -> dict[str, str]:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_NO_DAEMONIZE": "1"}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


class StandaloneCluster:
    def __init__(self, root: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.root = root / "cluster"
        self.n_workers, self.cores, self.memory = workers, cores, memory
        self.port, self.ui_port = free_port(), free_port()
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - owned by the process
        return subprocess.Popen([str(SPARK_CLASS), *args], env=cluster_env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
        except (OSError, ValueError):  # not up yet; a UI still starting answered /json/ with HTML
            return 0

    def __enter__(self) -> StandaloneCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.master = self._spawn("master", ["org.apache.spark.deploy.master.Master",
                                             "--host", "127.0.0.1", "--port", str(self.port),
                                             "--webui-port", str(self.ui_port)])
        for i in range(self.n_workers):
            work = self.root / f"worker{i}"
            work.mkdir(exist_ok=True)
            self.workers.append(self._spawn(f"worker{i}", [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--webui-port", str(free_port()), "--cores", str(self.cores),
                "--memory", self.memory, "--work-dir", str(work), self.master_url]))
        deadline = time.monotonic() + 90
        while self.alive_workers() < self.n_workers:
            if time.monotonic() > deadline or self.master.poll() is not None:
                self.__exit__(None, None, None)
                logs = "\n".join(p.read_text(errors="replace")[-1500:] for p in self.root.glob("*.log"))
                raise RuntimeError(f"standalone cluster did not come up with {self.n_workers} "
                                   f"workers in 90 s:\n{logs}")
            time.sleep(0.5)
        return self

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` and everything it started (its executor JVM and Python workers)."""
        os.killpg(self.workers[i].pid, signal.SIGKILL)
        self.workers[i].wait()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for p in [*self.workers, self.master]:
            if p is not None and p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for p in [*self.workers, self.master]:
            if p is None:
                continue
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def python_without_package(folder: Path, package: str = "cdc_lake") -> Path:
    """An executor Python that has this venv's libraries (pyspark, pyarrow, deltalake) but NOT
    ``package``: the interpreter runs with ``-S`` (no ``.pth`` files, so the editable install's
    path entry is gone) and gets site-packages through ``PYTHONPATH`` instead. Anything that
    imports ``package`` on an executor must get it from the submission (``--py-files``).
    """
    import site

    site_dirs = ":".join(p for p in site.getsitepackages() if Path(p).is_dir())
    wrapper = folder / "python-without-package"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"# executor Python without {package} (tests/spark_cluster.py)\n"
        f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site_dirs}" exec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    probe = subprocess.run([str(wrapper), "-c", f"import {package}"], capture_output=True, text=True,
                           cwd=folder, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if probe.returncode == 0:
        raise RuntimeError(f"{wrapper} can still import {package}; the test would prove nothing")
    return wrapper
