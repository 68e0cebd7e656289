"""The DAG of a pipeline with a ``capture:`` section: ``capture >> ingest`` (no Airflow services).

The live run against MariaDB is tests/test_capture_dag_live.py; here the wiring and the command
line are checked: the password never appears in argv, every capture setting reaches the CLI, and
the CLI accepts what the operator builds (parsed by the capture module's own parser).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_lake.airflow.capture import PASSWORD_ENV, capture_command
from cdc_lake.airflow.dag_factory import build_dag
from cdc_lake.capture.mariadb_maxwell import build_parser
from cdc_lake.config import ConfigError, load_pipeline

YAML = """\
pipeline: cap_dag
source: {{format: {fmt}, path: {root}/landing, database: shop}}
storage: {{root: {root}/lake}}
capture: {capture}
tables:
  orders: {{keys: [id]}}
"""


def _cfg(tmp_path: Path, capture: str, fmt: str = "maxwell"):
    f = tmp_path / "p.yaml"
    f.write_text(YAML.format(root=tmp_path, capture=capture, fmt=fmt))
    return load_pipeline(f)


def test_capture_section_makes_a_two_task_dag(tmp_path):
    cfg = _cfg(tmp_path, "{conn_id: src_db, tables: [orders], server_id: 4242, start: 'mariadb-bin.000002:4'}")
    dag = build_dag(cfg)
    assert set(dag.task_dict) == {"capture", "ingest"}
    assert dag.task_dict["capture"].downstream_task_ids == {"ingest"}
    assert dag.task_dict["ingest"].trigger_rule == "all_success"
    assert "capture" in (dag.doc_md or "")


def test_without_capture_the_dag_is_ingest_only(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(YAML.format(root=tmp_path, capture="null", fmt="maxwell"))
    assert set(build_dag(load_pipeline(f)).task_dict) == {"ingest"}


def test_capture_command_is_accepted_by_the_capture_cli_and_carries_no_password(tmp_path):
    cfg = _cfg(tmp_path, "{conn_id: src_db, tables: [orders], server_id: 4242, start: 'mariadb-bin.000002:4',"
                         " state: " + str(tmp_path / "st.json") + "}")
    argv = capture_command(cfg, host="db.example", port=None, user="cdc")
    assert argv[1:3] == ["-m", "cdc_lake.capture.mariadb_maxwell"]
    args = build_parser().parse_args(argv[3:])
    assert (args.host, args.port, args.user, args.password_env) == ("db.example", 3306, "cdc", PASSWORD_ENV)
    assert args.until_now and args.out == tmp_path / "landing"
    assert (args.databases, args.tables, args.server_id) == ("shop", "orders", 4242)
    assert args.start == "mariadb-bin.000002:4" and args.state == tmp_path / "st.json"
    assert args.password is None


@pytest.mark.parametrize("capture, key", [
    ("{start: 'sometime'}", "capture.start"),
    ("{type: postgres}", "capture.type"),
    ("{tables: orders}", "capture.tables"),
    ("{conn: x}", "capture"),
])
def test_bad_capture_sections_name_the_key(tmp_path, capture, key):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, capture)
    assert e.value.key.startswith(key), e.value


def test_capture_needs_the_maxwell_format(tmp_path):
    with pytest.raises(ConfigError, match="source.format: maxwell"):
        _cfg(tmp_path, "{conn_id: x}", fmt="canal")

