"""Quarantine threshold (issue 6 item 15): a run that quarantines more than ``quarantine:``
allows fails (exit 4) naming the top reasons with counts; what it wrote is kept; the summary says
``failed_quarantine_threshold`` and carries the counts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from deltalake import DeltaTable
from job_helpers import event, land, pipeline, rows

from cdc_lake.cdc.job import run_pipeline
from cdc_lake.config import ConfigError
from cdc_lake.quarantine_limits import QuarantineLimits, QuarantineThresholdExceeded
from cdc_lake.summary import SUMMARY_PREFIX

JOB = Path(__file__).resolve().parents[1] / "spark_jobs" / "cdc_ingest.py"


def _cli_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("cdc_ingest_under_test", JOB)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _bad(n: int) -> list[str]:
    """n unusable lines of three kinds: malformed JSON, a missing key, an unknown op."""
    kinds = ["{not json", json.dumps({"database": "shop", "table": "orders", "type": "insert",
                                      "ts": 1795000000, "xid": 1, "position": "mysql-bin.000001:5",
                                      "data": {"status": "no id"}}),
             event(999).replace('"insert"', '"frobnicate"')]
    return [kinds[i % len(kinds)] for i in range(n)]


def test_limits_arithmetic():
    lim = QuarantineLimits(max_fraction=0.5, max_rows=3)
    assert lim.exceeded(quarantined=3, events=6) == []           # at the limits: fine
    assert lim.exceeded(quarantined=4, events=100) == ["4 rows quarantined > max_rows 3"]
    assert lim.exceeded(quarantined=2, events=3) == [
        "2 of 3 events quarantined (66.7%) > max_fraction 0.5"]
    assert lim.exceeded(quarantined=0, events=0) == []
    assert not QuarantineLimits().active


@pytest.mark.parametrize("body, key, words", [
    ("quarantine: {max_fraction: 1.5}", "quarantine.max_fraction", "from 0 up to (not including) 1"),
    ("quarantine: {max_fraction: 'half'}", "quarantine.max_fraction", "got 'half'"),
    ("quarantine: {max_rows: -1}", "quarantine.max_rows", "expected an integer >= 0, got -1"),
    ("quarantine: {max_row: 5}", "quarantine.max_row", "unknown key 'max_row'; allowed: max_fraction, max_rows"),
])
def test_bad_limits_name_file_and_key(tmp_path, body, key, words):
    with pytest.raises(ConfigError) as e:
        pipeline(tmp_path, extra=body + "\n")
    assert f"p.yaml: {key}: " in str(e.value) and words in str(e.value), str(e.value)


def test_run_over_the_threshold_fails_keeps_its_data_and_says_why(spark, tmp_path, capsys):
    cfg = pipeline(tmp_path, extra="quarantine: {max_fraction: 0.5}\n")
    land(cfg.landing_path, "a.json", event(1), event(2), *_bad(6))  # 6 of 8 bad: 75 %
    cli = _cli_module()

    code = cli.main(["--pipeline", str(cfg.file), "--run-id", "bad_run"])

    out, err = capsys.readouterr()
    assert code == 4, err[-2000:]
    assert "QUARANTINE THRESHOLD EXCEEDED" in err and "6 of 8 events quarantined (75.0%) > max_fraction 0.5" in err
    assert "2x malformed JSON" in err or "2x " in err, err  # top reasons come with counts
    summary = json.loads(next(ln for ln in out.splitlines() if ln.startswith(SUMMARY_PREFIX))[len(SUMMARY_PREFIX):])
    assert summary["status"] == "failed_quarantine_threshold"
    assert summary["quarantined"] == 6 and summary["events_read"] == 8
    reasons = summary["quarantine_threshold"]["top_reasons"]
    assert sum(r["count"] for r in reasons) == 6 and len(reasons) == 3, reasons
    assert summary["quarantine_threshold"]["exceeded"] == ["6 of 8 events quarantined (75.0%) > max_fraction 0.5"]
    latest = json.loads((cfg.runs_path / cfg.name / "latest.json").read_text())
    assert latest["status"] == "failed_quarantine_threshold" and latest["run_id"] == "bad_run"
    # Nothing rolled back, nothing lost: good rows written, rejected rows in the quarantine table.
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2"}
    q = DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().to_pylist()
    assert len(q) == 6 and {r["run_id"] for r in q} == {"bad_run"}

    # A later run within the limits succeeds (the threshold is per run).
    land(cfg.landing_path, "b.json", event(3), *_bad(1))
    s = run_pipeline(cfg, spark=spark, run_id="ok_run")
    assert s["status"] == "succeeded" and s["quarantined"] == 1
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2", 3: "s3"}


@pytest.mark.slow  # default tier keeps the stop-and-say-why tests; this one is the follow-up
def test_max_rows_limit_in_process(spark, tmp_path):
    cfg = pipeline(tmp_path, extra="quarantine: {max_rows: 2}\n")
    land(cfg.landing_path, "a.json", *(event(i) for i in range(1, 20)), *_bad(3))
    with pytest.raises(QuarantineThresholdExceeded, match="3 rows quarantined > max_rows 2") as e:
        run_pipeline(cfg, spark=spark, run_id="r1")
    assert e.value.summary["status"] == "failed_quarantine_threshold"
    assert len(rows(cfg.tables["orders"].path)) == 19


def test_top_reasons_count_kinds_not_rows(tmp_path):
    """Each reason names its row's line size or value: identical errors were never grouped
    ("1x malformed JSON ... line of 8 bytes; 1x ... line of 7 bytes", tester). Counted by kind,
    with one recorded reason as the example. No Spark: a quarantine table written by delta-rs."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from cdc_lake.quarantine_limits import top_reasons

    reasons = ["malformed JSON; line of 8 bytes '{bad one'", "malformed JSON; line of 7 bytes '{bad 2'",
               "malformed JSON; line of 2 bytes '{x'", 'table t column id: value "x" is not a valid bigint',
               'table t column id: value "y" is not a valid bigint']
    write_deltalake(str(tmp_path / "q"), pa.table({"reason": reasons + ["other run"],
                                                   "run_id": ["r"] * 5 + ["s"]}))
    got = top_reasons(tmp_path / "q", "r")
    assert [(r["reason"], r["count"]) for r in got] == [
        ("malformed JSON; line of N bytes '…'", 3), ("table t column id: value '…' is not a valid bigint", 2)]
    assert got[0]["example"] == reasons[0]


def test_reason_kinds_keep_digits_inside_names() -> None:
    """Tester: "not in e1.yaml" was counted as "not in eN.yaml" in the top reasons."""
    from cdc_lake.quarantine_limits import reason_kind

    assert reason_kind("line of 8 bytes '{bad'") == reason_kind("line of 12 bytes '{x'") \
        == "line of N bytes '…'"
    assert reason_kind("unknown table shop.t2 (not in e1.yaml)") == "unknown table shop.t2 (not in e1.yaml)"
