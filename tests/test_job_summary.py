"""Run summaries (cdc_lake.summary): latest.json is never replaced by an older run, and the job
records its summary while it still holds the pipeline lock (issue 6 item 10)."""

from __future__ import annotations

import fcntl
import json

from job_helpers import event, land, pipeline

import cdc_lake.cdc.job as job
from cdc_lake.summary import SUMMARY_PREFIX, print_summary, record_summary


def _s(run_id: str, started: str, finished: str, status: str = "succeeded") -> dict:
    return {"pipeline": "p", "run_id": run_id, "status": status,
            "started_at": f"2026-11-23T{started}+00:00", "finished_at": f"2026-11-23T{finished}+00:00"}


def test_latest_json_is_never_replaced_by_an_older_run(tmp_path):
    runs = tmp_path / "_runs"
    newer = _s("run_new", "10:00:05", "10:00:06")
    older = _s("run_old", "10:00:00", "10:00:09", status="failed")  # finished last, started first
    record_summary(runs, "p", newer)
    path = record_summary(runs, "p", older)
    assert json.loads(path.read_text())["run_id"] == "run_old"  # its own file is always written
    latest = json.loads((runs / "p" / "latest.json").read_text())
    assert latest["run_id"] == "run_new", latest
    # A later run replaces it; so does the same run recording again.
    record_summary(runs, "p", _s("run_later", "10:01:00", "10:01:01"))
    assert json.loads((runs / "p" / "latest.json").read_text())["run_id"] == "run_later"
    # An unreadable latest.json is replaced, never a reason to fail the run.
    (runs / "p" / "latest.json").write_text("{half")
    record_summary(runs, "p", _s("run_x", "09:00:00", "09:00:01"))
    assert json.loads((runs / "p" / "latest.json").read_text())["run_id"] == "run_x"
    assert not [f for f in (runs / "p").iterdir() if f.name.endswith(".tmp")]
    # A latest.json from the future (a host with a fast clock) is not a newer run (tester: it
    # stayed the latest for good).
    record_summary(runs, "p", {**_s("skewed", "10:00:00", "10:00:01"),
                               "started_at": "2099-01-01T00:00:00+00:00", "finished_at": "2099-01-01T00:00:01+00:00"})
    record_summary(runs, "p", _s("run_y", "11:00:00", "11:00:01"))
    assert json.loads((runs / "p" / "latest.json").read_text())["run_id"] == "run_y"


def test_a_failed_runs_summary_that_cannot_be_written_does_not_hide_the_runs_error(tmp_path, capsys):
    """Tester: an unwritable runs folder made the failure path's summary write raise, which
    replaced the run's own error (a damaged checkpoint's exit 3 became exit 1)."""
    from cdc_lake.summary import record_failure

    runs = tmp_path / "_runs"
    runs.write_text("not a folder")
    record_failure(runs, "p", _s("run_f", "10:00:00", "10:00:01", status="failed"))
    assert "WARNING: could not write the failed run's summary" in capsys.readouterr().err


def test_print_summary_machine_line(capsys):
    print_summary(_s("r1", "10:00:00", "10:00:01"), human=["[x] human line"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[x] human line"
    assert out[1].startswith(SUMMARY_PREFIX) and json.loads(out[1][len(SUMMARY_PREFIX):])["run_id"] == "r1"


def test_job_records_its_summary_while_holding_the_lock(spark, tmp_path, monkeypatch):
    """Otherwise a run that starts the moment the lock is free records first and is then
    overwritten by the older run's latest.json."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", event(1), event(2, "customers"))
    seen: list[tuple[str, bool]] = []
    real = job.record_summary

    def spy(runs_path, pipeline_name, summary):  # type: ignore[no-untyped-def]
        with open(cfg.checkpoint_path / "cdc.lock", "a+") as fh:  # a second open file = another run
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
                held = False
            except BlockingIOError:
                held = True
        seen.append((summary["status"], held))
        return real(runs_path, pipeline_name, summary)

    monkeypatch.setattr(job, "record_summary", spy)
    s = job.run_pipeline(cfg, spark=spark, run_id="r1")
    assert s["status"] == "succeeded"
    assert seen == [("succeeded", True)], seen
    latest = json.loads((cfg.runs_path / cfg.name / "latest.json").read_text())
    assert latest["run_id"] == "r1" and latest["events_read"] == 2


def test_summary_counts_follow_the_documented_rules(spark, tmp_path):
    """docs/contracts.md: ``events_read`` counts every event, ``row_changes`` those that are not
    DDL, skipped or ignored (quarantined ones included), ``ignored`` the events of
    ``ignore_tables`` (docs tester: ``row_changes`` counted the ignored event too)."""
    cfg = pipeline(tmp_path, extra="ignore_tables: [shop.audit_log]\n")
    alter = json.dumps({"database": "shop", "table": "orders", "type": "table-alter",
                        "ts": 1795000050, "position": "mysql-bin.000001:1050",
                        "sql": "ALTER TABLE orders ADD COLUMN note TEXT"})
    land(cfg.landing_path, "a.json", event(1), event(2, "customers"), event(3, "audit_log"),
         event(4, "audit_log", "update"), alter, "not json")
    s = job.run_pipeline(cfg, spark=spark, run_id="r1")
    got = {k: s[k] for k in ("events_read", "row_changes", "ignored", "ddl_events", "quarantined")}
    # 6 lines: 2 row changes of configured tables, 2 of an ignored table, 1 DDL, 1 not JSON
    assert got == {"events_read": 6, "row_changes": 3, "ignored": 2, "ddl_events": 1,
                   "quarantined": 1}, got
