"""docker-compose.yml checked without a Docker engine (none runs on this project's machines).

What can be checked statically is checked against the code it must agree with: every host path it
mounts exists, the DAG and plugin folders land where Airflow looks, the environment names are the
ones the code and the pipeline YAMLs read, the Spark connection points at the master service's
host/port, the capture command's flags exist in the capture CLI, the runtime image installs the
versions CI tests (constraints.txt), and no secret or anonymous admin is shipped. Whether the
images build and the stack starts stays unverified here (README says so).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from cdc_lake.airflow import PIPELINES_DIR_ENV
from cdc_lake.capture.mariadb_maxwell import build_parser
from cdc_lake.config import load_all

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
AIRFLOW_HOME = "/opt/airflow"  # the apache/airflow image's AIRFLOW_HOME


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))  # PyYAML resolves anchors and <<


def _binds(service: dict) -> list[tuple[str, str]]:
    out = []
    for v in service.get("volumes", []):
        host, _, rest = v.partition(":")
        out.append((host, rest.split(":")[0]))
    return out


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line.strip())
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def test_every_bind_mount_exists_and_named_volumes_are_declared(compose):
    declared = set(compose.get("volumes") or {})
    for name, svc in compose["services"].items():
        for host, target in _binds(svc):
            if host.startswith((".", "/")):
                assert (REPO / host).exists(), f"services.{name}.volumes: {host} does not exist in the repo"
            else:
                assert host in declared, f"services.{name}.volumes: named volume {host!r} not declared"
            assert target.startswith("/"), f"services.{name}.volumes: target {target!r} is not absolute"


def test_airflow_finds_dags_plugins_and_the_package(compose):
    for name, svc in compose["services"].items():
        if not name.startswith("airflow-"):
            continue
        binds = dict((t, h) for h, t in _binds(svc))
        assert binds.get(f"{AIRFLOW_HOME}/dags") == "./dags", f"{name}: dags not mounted at {AIRFLOW_HOME}/dags"
        assert binds.get(f"{AIRFLOW_HOME}/plugins") == "./plugins", f"{name}: plugins not mounted"
        env = svc["environment"]
        src = env["PYTHONPATH"]
        assert binds.get(src) == "./src", f"{name}: PYTHONPATH {src} is not the mounted ./src"
        # cdc_lake.airflow.pipelines_dir() reads this variable; it must be the mounted pipelines/
        assert binds.get(env[PIPELINES_DIR_ENV]) == "./pipelines", f"{name}: {PIPELINES_DIR_ENV}"
        # spark-submit runs spark_jobs/<job>.py relative to the repo root (= parent of src/)
        root = str(Path(src).parent)
        assert binds.get(f"{root}/spark_jobs") == "./spark_jobs", f"{name}: spark_jobs not next to src"


def test_env_names_match_what_the_pipelines_read(compose):
    used = set()
    for p in sorted((REPO / "pipelines").glob("*.yaml")):
        used |= set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", p.read_text(encoding="utf-8")))
    assert used, "pipelines/*.yaml use no ${VAR}: the check below would prove nothing"
    for name in ("airflow-scheduler", "spark-worker", "capture"):
        env = compose["services"][name]["environment"]
        missing = sorted(v for v in used if v not in env)
        assert not missing, f"services.{name}: pipelines read {missing} but compose does not set them"
    # Executors and the driver must see the data at the same path.
    data = compose["services"]["airflow-scheduler"]["environment"]["CDC_DATA_DIR"]
    for name in ("airflow-scheduler", "spark-worker", "capture"):
        assert ("cdc-data", data) in _binds(compose["services"][name]), f"{name}: {data} not on cdc-data"


def test_spark_connection_matches_the_master_service(compose):
    cfgs, errors = load_all(REPO / "pipelines")
    assert not errors
    conn_ids = {c.spark_conn_id for c in cfgs}
    env = compose["services"]["airflow-scheduler"]["environment"]
    for cid in conn_ids:
        var = f"AIRFLOW_CONN_{cid.upper()}"
        assert var in env, f"pipelines use spark conn_id {cid!r} but compose sets no {var}"
        conn = json.loads(env[var])
        master = compose["services"]["spark-master"]
        ep = master["entrypoint"]
        host, port = ep[ep.index("--host") + 1], int(ep[ep.index("--port") + 1])
        assert conn["conn_type"] == "spark"
        assert conn["host"] == f"spark://{host}" and int(conn["port"]) == port, (conn, host, port)
        assert master["hostname"] == host
        worker_ep = compose["services"]["spark-worker"]["entrypoint"]
        assert f"spark://{host}:{port}" in worker_ep


def test_capture_command_flags_exist_in_the_capture_cli(compose):
    cap = compose["services"]["capture"]
    assert cap["entrypoint"][-1] == "cdc_lake.capture.mariadb_maxwell"
    args = build_parser().parse_args(cap["command"])  # exits (SystemExit) on an unknown flag
    assert str(args.out).startswith(compose["services"]["airflow-scheduler"]["environment"]["CDC_DATA_DIR"])
    assert args.password is None, "the capture password must come from the environment"
    assert args.password_env in cap["environment"]


def test_runtime_image_installs_the_tested_versions(compose):
    pins = _pins()
    dockerfile = compose["services"]["spark-master"]["build"]["dockerfile_inline"]
    base = re.search(r"FROM apache/airflow:(\S+)-python(\d+\.\d+)", dockerfile)
    assert base and base.group(1) == pins["apache-airflow"] and base.group(2) == "3.11", dockerfile[:200]
    assert "-c /opt/cdc/constraints.txt" in dockerfile
    for pkg in ("apache-airflow", "pyspark"):
        m = re.search(rf'"{pkg}==([^"]+)"', dockerfile)
        assert m and m.group(1) == pins[pkg], f"{pkg} pinned {m and m.group(1)} in compose, {pins[pkg]} tested"
    # one image for the driver (scheduler) and the cluster: same Spark and Python everywhere
    images = {compose["services"][s]["image"] for s in ("airflow-scheduler", "spark-master", "spark-worker")}
    assert len(images) == 1


def test_no_secret_or_anonymous_admin_is_shipped(compose):
    text = COMPOSE.read_text(encoding="utf-8")
    assert not re.search(r"^\s*[A-Z_]*ALL_ADMINS\s*:", text, re.M), "anonymous admin enabled"
    for name, svc in compose["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            if re.search(r"PASSWORD|SECRET|TOKEN", key) and not key.endswith(("_FILE", "_ENV")):
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", str(value)), \
                    f"services.{name}.environment.{key} must come from the host environment, got {value!r}"
        conn = (svc.get("environment") or {}).get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
        if conn:
            assert "${POSTGRES_PASSWORD:?" in conn, "metadata DB password must not be literal"
    for port in compose["services"]["mariadb"].get("ports", []):
        assert str(port).startswith("127.0.0.1:"), "MariaDB must not listen on every interface"
