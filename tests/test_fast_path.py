"""A run with nothing new skips Spark entirely; a late file with an old mtime is still picked up."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import cdc_lake.cdc.job as job
from cdc_lake.config import load_pipeline
from cdc_lake.cdc.job import nothing_new, run_pipeline

YAML = """pipeline: fast_path
source: {{format: maxwell, path: landing, database: shop{glob}}}
storage: {{root: lake}}
engine: {{name: deltalake}}
tables:
  orders: {{keys: [id]}}
"""


def _event(i: int, typ: str = "insert") -> str:
    return json.dumps({"database": "shop", "table": "orders", "type": typ, "ts": 1795000000 + i,
                       "xid": 100 + i, "xoffset": 0, "position": f"mysql-bin.000001:{1000 + i}",
                       "data": {"id": i, "status": f"s{i}"}})


def _land(landing: Path, name: str, *lines: str, mtime: float | None = None) -> Path:
    tmp = landing / f".{name}.tmp"
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    final = landing / name
    os.replace(tmp, final)
    if mtime is not None:
        os.utime(final, (mtime, mtime))
    return final


def _pipeline(tmp_path: Path, glob: str | None = None):  # type: ignore[no-untyped-def]
    (tmp_path / "landing").mkdir()
    p = tmp_path / "p.yaml"
    p.write_text(YAML.format(glob=f", glob: '{glob}'" if glob else ""), encoding="utf-8")
    return load_pipeline(p)


def _no_spark(*a, **k):  # type: ignore[no-untyped-def]
    raise AssertionError("Spark was started for a run with nothing new")


def _rows(path: Path) -> dict[int, str]:
    from deltalake import DeltaTable

    t = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {r["id"]: r["status"] for r in t}


def test_nothing_new_skips_spark_and_new_files_do_not(spark, tmp_path, monkeypatch):
    cfg = _pipeline(tmp_path)
    landing = cfg.landing_path
    assert not nothing_new(cfg)  # no checkpoint yet
    _land(landing, "a-000.json", _event(1), _event(2))
    s1 = run_pipeline(cfg, spark=spark, run_id="r1")
    assert s1["batches"] == 1 and s1["events_read"] == 2
    assert nothing_new(cfg)

    # Nothing new: no Spark at all (not even with spark=None), same summary shape, no commits.
    versions = {"orders": s1["tables"]["orders"]["delta_version"]}
    monkeypatch.setattr(job, "build_session", _no_spark)
    s2 = run_pipeline(cfg, spark=None, run_id="r2")
    assert s2["status"] == "succeeded" and s2["batches"] == 0 and s2["events_read"] == 0
    assert s2["tables"]["orders"]["delta_version"] == versions["orders"]
    assert s2["last_batch_id"] is None and s2["batch_ids"] == []
    latest = json.loads((cfg.runs_path / cfg.name / "latest.json").read_text())
    assert latest["run_id"] == "r2" and latest["batches"] == 0
    monkeypatch.undo()

    # Hidden / temporary names are ignored by Spark, so they do not defeat the fast path.
    (landing / ".b-000.json.tmp").write_text(_event(3) + "\n", encoding="utf-8")
    (landing / "_SUCCESS").write_text("", encoding="utf-8")
    assert nothing_new(cfg)

    # A new file: Spark runs.
    _land(landing, "b-000.json", _event(3))
    assert not nothing_new(cfg)
    s3 = run_pipeline(cfg, spark=spark, run_id="r3")
    assert s3["batches"] == 1 and s3["events_read"] == 1
    assert _rows(cfg.table_path("orders")) == {1: "s1", 2: "s2", 3: "s3"}
    assert nothing_new(cfg)


def test_doubt_means_spark(spark, tmp_path):
    cfg = _pipeline(tmp_path)
    _land(cfg.landing_path, "a-000.json", _event(1))
    run_pipeline(cfg, spark=spark, run_id="r1")
    assert nothing_new(cfg)
    # An offset logged but not committed (a run died mid-batch): Spark must replay it.
    offsets, commits = cfg.checkpoint_path / "offsets", cfg.checkpoint_path / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (offsets / str(last + 1)).write_text((offsets / str(last)).read_text())
    assert not nothing_new(cfg)
    (offsets / str(last + 1)).unlink()
    assert nothing_new(cfg)
    # A subfolder: Spark's listing is recursive, ours is not.
    (cfg.landing_path / "sub").mkdir()
    assert not nothing_new(cfg)
    (cfg.landing_path / "sub").rmdir()
    # A file-source log entry newer than the committed offset does not count as seen.
    src = cfg.checkpoint_path / "sources" / "0"
    log_ids = sorted(int(p.name) for p in src.iterdir() if p.name.isdigit())
    _land(cfg.landing_path, "b-000.json", _event(2))
    entry = {"path": (cfg.landing_path / "b-000.json").resolve().as_uri(),
             "timestamp": int(time.time() * 1000), "batchId": log_ids[-1] + 1}
    (src / str(log_ids[-1] + 1)).write_text("v1\n" + json.dumps(entry) + "\n")
    assert not nothing_new(cfg)
    # An unreadable log: doubt.
    (src / str(log_ids[-1] + 1)).unlink()
    (src / str(log_ids[-1])).write_text("garbage")
    assert not nothing_new(cfg)


def test_glob_is_honoured(spark, tmp_path):
    cfg = _pipeline(tmp_path, glob="*.json")
    _land(cfg.landing_path, "a-000.json", _event(1))
    run_pipeline(cfg, spark=spark, run_id="r1")
    _land(cfg.landing_path, "notes.txt", "not a binlog line")
    assert nothing_new(cfg)  # Spark would not pick the .txt either
    _land(cfg.landing_path, "b-000.json", _event(2))
    assert not nothing_new(cfg)


@pytest.mark.parametrize("glob", ["{a,b}-*.json", "[^x]*.json", "a\\*.json"])
def test_globs_fnmatch_cannot_mirror_run_spark(spark, tmp_path, glob):
    cfg = _pipeline(tmp_path, glob=glob)
    _land(cfg.landing_path, "a-000.json", _event(1))
    run_pipeline(cfg, spark=spark, run_id="r1")
    assert not nothing_new(cfg)


@pytest.mark.parametrize("age", ["month", "epoch"])
def test_late_file_with_old_mtime_is_picked_up(spark, tmp_path, age):
    """Spark's default maxFileAge (7 days, relative to the newest file seen) would skip it; so
    would any bound shorter than the file's age (an archive unpacked without timestamps: 1970)."""
    cfg = _pipeline(tmp_path)
    _land(cfg.landing_path, "a-000.json", _event(1))
    run_pipeline(cfg, spark=spark, run_id="r1")
    old = time.time() - 30 * 86400 if age == "month" else 0
    _land(cfg.landing_path, "old-000.json", _event(2, "insert"), mtime=old)
    assert not nothing_new(cfg)
    s = run_pipeline(cfg, spark=spark, run_id="r2")
    assert s["events_read"] == 1 and s["batches"] == 1
    assert _rows(cfg.table_path("orders")) == {1: "s1", 2: "s2"}
    assert nothing_new(cfg)


def test_auto_engine_no_op_run_starts_no_spark(spark, tmp_path, monkeypatch):
    """The shipped pipelines use engine auto: their no-op runs must skip Spark too."""
    (tmp_path / "landing").mkdir()
    p = tmp_path / "p.yaml"
    p.write_text(YAML.format(glob="").replace("name: deltalake", "name: auto"), encoding="utf-8")
    cfg = load_pipeline(p)
    _land(tmp_path / "landing", "m-000001.json", _event(1))
    run_pipeline(cfg, spark=spark, run_id="first")
    monkeypatch.setattr(job, "build_session", _no_spark)
    summary = run_pipeline(cfg, run_id="noop")  # no session passed, as under spark-submit
    assert summary["batches"] == 0 and summary["engine"] == "auto (not started: nothing new)"
    assert summary["tables"]["orders"]["delta_version"] is not None


_FIRST = {  # one insert of orders id 1 per format
    "maxwell": _event(1),
    "debezium": json.dumps({"before": None, "after": {"id": 1, "status": "s1"}, "op": "c",
                            "ts_ms": 1795000000000,
                            "source": {"connector": "mysql", "ts_ms": 1795000000000,
                                       "snapshot": "false", "db": "shop", "table": "orders",
                                       "file": "mysql-bin.000001", "pos": 1001, "row": 0}}),
    "canal": json.dumps({"data": [{"id": "1", "status": "s1"}], "database": "shop",
                         "table": "orders", "type": "INSERT", "es": 1795000000000,
                         "ts": 1795000000001, "id": 1, "isDdl": False, "pkNames": ["id"],
                         "mysqlType": {"id": "int", "status": "varchar(10)"}, "old": None}),
}


@pytest.mark.parametrize("fmt", sorted(_FIRST))
def test_whitespace_only_lines_are_skipped_like_empty_lines(spark, tmp_path, fmt):
    """A line of JSON whitespace (tabs, a CR before the LF) or form feeds / vertical tabs is a
    blank line: skipped, not quarantined as malformed JSON (the filter used to strip spaces
    only). A line with anything else in it still goes to the quarantine."""
    (tmp_path / "landing").mkdir()
    p = tmp_path / "p.yaml"
    p.write_text(YAML.format(glob="").replace("format: maxwell", f"format: {fmt}"), encoding="utf-8")
    cfg = load_pipeline(p)
    blanks = ["", "   ", "\t", "  \t ", "\f", "\x0b", " \t\f\x0b ", "\t\r"]  # "\t\r" + "\n": CRLF
    (cfg.landing_path / "a-000.json").write_bytes(
        "\n".join([*blanks, _FIRST[fmt], *blanks, "\t{bad", "\u00a0", *blanks]).encode() + b"\n")
    s = run_pipeline(cfg, spark=spark, run_id="r1")
    assert _rows(cfg.table_path("orders")) == {1: "s1"}
    from deltalake import DeltaTable

    raw = sorted(DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().column("raw_line").to_pylist())
    assert raw == ["\t{bad", "\u00a0"], raw  # a non-breaking space is not JSON whitespace
    assert s["quarantined"] == 2, s
