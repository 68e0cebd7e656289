"""The backlog a run will read (files the checkpoint has not taken), sized without Spark, and the
driver JIT the launcher picks from it: C1 only for short runs, the JVM's full JIT for big ones.

Truth: the sizes of the files this test wrote (``os.stat``), and which of them each run was
given; the driver's JIT is read back from the JVM's own input arguments in the run summary.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import airflow_env  # noqa: F401  (configures Airflow before it is imported)

import pytest
from airflow_env import DAGS_FOLDER, REPO, airflow_db  # noqa: F401

from cdc_lake.cdc.backlog import Backlog, backlog, nothing_new
from cdc_lake.cdc.job import run_pipeline
from cdc_lake import jvm_archive
from cdc_lake.config import ConfigError, load_pipeline
from cdc_lake.launch import C1_ONLY, DRIVER_JAVA_OPTIONS, INTERPRETED_CONF, codegen_conf, launch_conf


def _event(i: int) -> str:
    return json.dumps({"database": "shop", "table": "orders", "type": "insert", "ts": 1795000000 + i,
                       "xid": 100 + i, "xoffset": 0, "data": {"id": i, "note": "x" * (i % 50)}})


def _land(landing: Path, name: str, first: int, n: int) -> int:
    """Write ``n`` events atomically; return the file's size in bytes."""
    tmp = landing / f".{name}.tmp"
    tmp.write_text("".join(_event(i) + "\n" for i in range(first, first + n)), encoding="utf-8")
    os.replace(tmp, landing / name)
    return (landing / name).stat().st_size


def _pipeline(folder: Path, extra: str = "") -> Path:
    (folder / "landing").mkdir(parents=True, exist_ok=True)
    path = folder / "p.yaml"
    path.write_text(textwrap.dedent(f"""\
        pipeline: backlog_test
        source: {{format: maxwell, path: {folder / 'landing'}, database: shop, max_files_per_trigger: 1}}
        storage: {{root: {folder / 'lake'}}}
        engine: {{name: deltalake}}
        tables:
          orders: {{keys: [id]}}
        """) + extra, encoding="utf-8")
    return path


def test_backlog_is_what_the_next_run_reads(spark, tmp_path):
    cfg = load_pipeline(_pipeline(tmp_path))
    landing = cfg.landing_path
    sizes = {"a.json": _land(landing, "a.json", 0, 5), "b.json": _land(landing, "b.json", 5, 7)}
    (landing / ".c.json.tmp").write_text(_event(99) + "\n")  # hidden: Spark skips it, so do we
    (landing / "_SUCCESS").write_text("")
    assert backlog(cfg) == Backlog(2, sum(sizes.values()))  # no checkpoint yet: everything

    s1 = run_pipeline(cfg, spark=spark, run_id="r1")
    assert s1["events_read"] == 12 and s1["batches"] == 2  # one file per batch
    assert backlog(cfg) == Backlog(0, 0) and nothing_new(cfg)

    sizes["c.json"] = _land(landing, "c.json", 12, 3)
    sizes["d.json"] = _land(landing, "d.json", 15, 40)
    now = time.time()  # the file source takes files oldest first: make d.json the later batch
    os.utime(landing / "c.json", (now - 20, now - 20))
    os.utime(landing / "d.json", (now - 10, now - 10))
    assert backlog(cfg) == Backlog(2, sizes["c.json"] + sizes["d.json"])
    assert backlog(cfg, full_refresh=True) == Backlog(4, sum(sizes.values()))  # reads the history

    s2 = run_pipeline(cfg, spark=spark, run_id="r2")
    assert s2["events_read"] == 43 and s2["batches"] == 2
    assert backlog(cfg) == Backlog(0, 0)

    # The last batch planned but not committed (a run died in it): its file is read again.
    commits = cfg.checkpoint_path / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).rename(tmp_path / "commit-aside")
    assert backlog(cfg) == Backlog(1, sizes["d.json"])  # one file per batch, d.json the last
    assert not nothing_new(cfg)
    (tmp_path / "commit-aside").rename(commits / str(last))

    # Doubt is "unknown", never zero: a subfolder (Spark lists recursively), a damaged log.
    (landing / "sub").mkdir()
    assert backlog(cfg) is None
    (landing / "sub").rmdir()
    src = cfg.checkpoint_path / "sources" / "0"
    log = max((p for p in src.iterdir() if p.name.split(".")[0].isdigit()), key=lambda p: int(p.name.split(".")[0]))
    log.write_text("garbage")
    assert backlog(cfg) is None and not nothing_new(cfg)


def test_launch_conf_threshold_and_config(tmp_path):
    mib = 2**20
    assert launch_conf(None) == {DRIVER_JAVA_OPTIONS: C1_ONLY}  # unknown: the common small run
    assert launch_conf(48 * mib - 1) == {DRIVER_JAVA_OPTIONS: C1_ONLY}
    assert launch_conf(48 * mib) == {}
    assert launch_conf(0, full_jit_from_mb=0) == {}
    assert launch_conf(10 * mib, full_jit_from_mb=11) == {DRIVER_JAVA_OPTIONS: C1_ONLY}

    assert load_pipeline(_pipeline(tmp_path / "a")).full_jit_from_mb == 48
    assert load_pipeline(_pipeline(tmp_path / "b", "spark: {full_jit_from_mb: 0}\n")).full_jit_from_mb == 0
    with pytest.raises(ConfigError, match=r"spark\.full_jit_from_mb: expected an integer >= 0, got -1"):
        load_pipeline(_pipeline(tmp_path / "c", "spark: {full_jit_from_mb: -1}\n"))


def test_codegen_conf_threshold_and_config(tmp_path):
    """Interpreted expressions below ``spark.interpreted_below_mb`` (default 8 MiB) of backlog;
    generated code from there on, and for an unknown backlog (it cannot be ruled small)."""
    mib = 2**20
    assert codegen_conf(0) == codegen_conf(8 * mib - 1) == INTERPRETED_CONF
    assert codegen_conf(8 * mib) == codegen_conf(None) == {}
    assert codegen_conf(0, interpreted_below_mb=0) == {}
    assert codegen_conf(10 * mib, interpreted_below_mb=11) == INTERPRETED_CONF

    from cdc_lake.spark_session import session_conf
    a = load_pipeline(_pipeline(tmp_path / "a"))
    assert a.interpreted_below_mb == 8
    assert INTERPRETED_CONF.items() <= session_conf(a, backlog_bytes=mib).items()
    assert not set(INTERPRETED_CONF) & set(session_conf(a, backlog_bytes=64 * mib))
    mine = load_pipeline(_pipeline(tmp_path / "m", "spark: {conf: {spark.sql.codegen.wholeStage: 'true'}}\n"))
    assert session_conf(mine, backlog_bytes=mib)["spark.sql.codegen.wholeStage"] == "true"  # the pipeline's
    off = load_pipeline(_pipeline(tmp_path / "b", "spark: {interpreted_below_mb: 0}\n"))
    assert off.interpreted_below_mb == 0 and not set(INTERPRETED_CONF) & set(session_conf(off, backlog_bytes=1))
    with pytest.raises(ConfigError, match=r"spark\.interpreted_below_mb: expected an integer >= 0, got -1"):
        load_pipeline(_pipeline(tmp_path / "c", "spark: {interpreted_below_mb: -1}\n"))


def _operator(cfg_path: Path):  # type: ignore[no-untyped-def]
    from cdc_lake.airflow.operator import CdcSparkSubmitOperator

    return CdcSparkSubmitOperator(task_id="ingest", pipeline=load_pipeline(cfg_path))


def test_operator_picks_the_driver_jit_from_the_backlog(tmp_path):
    small = tmp_path / "small"
    op = _operator(_pipeline(small))
    _land(small / "landing", "a.json", 0, 10)
    op._choose_driver_jit()
    archive = jvm_archive.option()  # the JVM class archive rides along when make setup built it
    assert op.conf[DRIVER_JAVA_OPTIONS] == " ".join(filter(None, [C1_ONLY, archive]))

    big = tmp_path / "big"
    op = _operator(_pipeline(big))
    with open(big / "landing" / "huge.json", "wb") as f:  # sparse: 200 MiB on paper, no disk
        f.truncate(200 * 2**20)
    assert op.conf[DRIVER_JAVA_OPTIONS] == C1_ONLY  # the DAG's declared default ...
    op._choose_driver_jit()
    assert op.conf.get(DRIVER_JAVA_OPTIONS) == archive  # ... the run gets the JVM's full JIT
    assert op.conf["spark.sql.session.timeZone"] == "UTC"  # nothing else dropped

    mine = tmp_path / "mine"  # the pipeline's own setting wins either way
    op = _operator(_pipeline(mine, f"spark: {{conf: {{{DRIVER_JAVA_OPTIONS}: '-Xss4m'}}}}\n"))
    with open(mine / "landing" / "huge.json", "wb") as f:
        f.truncate(200 * 2**20)
    op._choose_driver_jit()
    assert op.conf[DRIVER_JAVA_OPTIONS] == "-Xss4m"


@pytest.mark.slow
def test_real_spark_submit_runs_the_jit_the_operator_chose(monkeypatch, tmp_path, airflow_db):
    """Through DAG -> operator -> real spark-submit: with ``full_jit_from_mb: 0`` any backlog is
    big, and the driver JVM must run without the C1-only flag (read from its input arguments);
    with ``interpreted_below_mb: 0`` the job's session generates code. The small defaults (C1,
    interpreted) are checked by test_airflow_live's triggered run. Slow tier (a speed setting,
    about 70 s of a slow machine's CI): the operator's choice of the option is checked in the
    default tier by the tests above."""
    from airflow.dag_processing.dagbag import DagBag

    from test_dag_e2e import task_result

    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    cfg_path = _pipeline(tmp_path, "spark: {full_jit_from_mb: 0, interpreted_below_mb: 0, "
                         "conf: {spark.ui.enabled: 'false'}}\n")
    cfg_path.rename(pipelines / "p.yaml")
    _land(tmp_path / "landing", "a.json", 0, 4)
    name = load_pipeline(pipelines / "p.yaml").name
    monkeypatch.setenv("CDC_PIPELINES_DIR", str(pipelines))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO / "src"),
                                                                   os.environ.get("PYTHONPATH")])))
    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    dr = bag.dags[name].test()
    state, _, summary = task_result(dr)
    assert state == "success", f"task {state}; see the spark-submit output above"
    assert summary["events_read"] == 4 and summary["driver_jit"] == "C1+C2", summary
    assert summary["codegen"] == "generated", summary  # interpreted_below_mb: 0


def test_an_offsets_file_of_another_kind_of_source_is_exit_3_naming_it(tmp_path):
    """Tester: the enrichment checkpoint's ``offsets/1`` copied over the CDC ``offsets/2`` passed
    the format check; the run failed with a bare ``KeyError: 'logOffset'`` (exit 1, retried)."""
    from cdc_lake.cdc.backlog import check_landed_files_unchanged
    from cdc_lake.checkpoint_log import PipelineStateError

    cfg = load_pipeline(_pipeline(tmp_path))
    cp = cfg.checkpoint_path
    (cp / "commits").mkdir(parents=True)
    (cp / "offsets").mkdir()
    (cp / "commits" / "2").write_text("v1\n{}\n")
    (cp / "offsets" / "2").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,'
                                     '"conf":{"spark.sql.shuffle.partitions":"2"}}\n{"version": 3}\n')
    with pytest.raises(PipelineStateError) as e:
        check_landed_files_unchanged(cfg)
    assert str(cp / "offsets" / "2") in str(e.value) and "logOffset" in str(e.value), str(e.value)
    assert "move the checkpoint aside" in str(e.value)
    assert backlog(cfg) is None and not nothing_new(cfg)  # a doubt, not "nothing new"


def test_the_printed_mtime_recovery_covers_every_changed_file():
    """Tester: with 12 restored files the printed `touch` commands covered the first 5 only;
    following them stopped the next run on the other 7, and again."""
    import re

    from cdc_lake.cdc.backlog import LandedFileChanged

    changed = [(f"/landing/f{i:02d}.json", 1795000000000 + i, 1795000009000) for i in range(12)]
    msg = str(LandedFileChanged(changed, "/landing"))
    [touch, _] = re.findall(r"`(touch -m -d @[^`]+)`", msg)
    assert sorted(re.findall(r"/landing/f\d\d\.json", touch)) == [p for p, _, _ in changed]
