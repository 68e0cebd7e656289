"""Late events of an events fact source: every one is counted once and quarantined, none lost.

Spark's ``dropDuplicatesWithinWatermark`` itself drops a row whose event time is at or before
the watermark of the batch before (the watermark it uses for late events), before the job's
``foreachBatch`` sees it; the job recovers those rows from the batch's own files (tester: in a
second run, events older than the watermark the first run left, and events exactly on it, were
in no table and not in the quarantine, exit 0; ``dropped_by_watermark`` counted each twice).

Truth is computed here from the landed events by the documented rule: micro-batch ``i`` (one
file each with ``max_files_per_trigger: 1``, in landing order) has the watermark
``max(event time of the files before it) - watermark delay`` (none for the first); an event
with an id and an event time at or before its batch's watermark is late: quarantined and
counted in ``dropped_by_watermark``; every other event with an id is enriched.

Real Spark, real delta-rs, end to end through :func:`run_enrich`.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from cdc_lake.config import load_pipeline

DELAY = timedelta(hours=1)

YAML = """
    kind: enrich
    pipeline: late_t
    trigger: TRIGGER
    fact:
      events: {path: landing, format: json, id: event_id, time: event_ts, watermark: "1 hour",
               max_files_per_trigger: 1,
               schema: {event_id: ID_TYPE, product_id: bigint, qty: bigint, event_ts: timestamp}}
    dimensions:
      products: {table: products, keys: [id], on: {product_id: id}, columns: {category: cat}}
    event_time: event_ts
    outputs:
      enriched: gold/ev
      aggregates: {per_cat: {group_by: [category], sums: {units: qty}}}
    engine: {name: deltalake}
"""


def _t(s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=timezone.utc)


class Landing:
    """Event files landed in order (increasing mtimes), and the truth of the documented rule."""

    def __init__(self, root: Path, id_type: str) -> None:
        self.dir = root / "landing"
        self.dir.mkdir()
        self.id_type = id_type
        self.files: list[list[dict]] = []
        self.names: list[str] = []
        self.mtime = time.time() - 1000

    def ident(self, i: str):  # type: ignore[no-untyped-def]
        return i if self.id_type == "string" else int(i[1:])

    def land(self, name: str, events: list[tuple[str | None, int, str]]) -> list[dict]:
        rows = [{"event_id": None if i is None else self.ident(i), "product_id": 1, "qty": q,
                 "event_ts": t} for i, q, t in events]
        f = self.dir / name
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        self.mtime += 10
        os.utime(f, (self.mtime, self.mtime))
        self.files.append(rows)
        self.names.append(name)
        return rows

    def truth(self) -> tuple[set, set]:
        """(ids enriched, ids late) over every file landed, one micro-batch per file."""
        enriched, late, newest = set(), set(), None
        wm = None
        self.late_watermarks: dict = {}  # late id -> {(this batch's wm, the batch before's)}
        for rows in self.files:
            wm, before = (None if newest is None else newest - DELAY), wm
            for r in rows:
                if r["event_id"] is None:
                    continue
                if wm is not None and _t(r["event_ts"].rstrip("Z")) <= wm:
                    late.add(r["event_id"])
                    self.late_watermarks.setdefault(r["event_id"], set()).add((wm, before))
                else:
                    enriched.add(r["event_id"])
            newest = max([newest] * (newest is not None)
                         + [_t(r["event_ts"].rstrip("Z")) for r in rows])
        return enriched, late


def _setup(tmp_path: Path, id_type: str = "string", trigger: str = "available_now"):  # type: ignore[no-untyped-def]
    write_deltalake(str(tmp_path / "products"), pa.table({"id": pa.array([1], pa.int64()), "cat": ["fruit"]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    f = tmp_path / "p.yaml"
    f.write_text(textwrap.dedent(YAML.replace("TRIGGER", trigger).replace("ID_TYPE", id_type)))
    return load_pipeline(f), Landing(tmp_path, id_type)


def _rows(path: Path) -> list[dict]:
    if not (path / "_delta_log").exists():
        return []
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def _check(tmp_path: Path, landing: Landing, summaries: list[dict], null_ids: int = 0) -> set:
    enriched, late = landing.truth()
    got = {r["event_id"] for r in _rows(tmp_path / "gold/ev")}
    assert got == enriched, (got, enriched)
    q = _rows(tmp_path / "gold/_quarantine")
    late_rows = [r for r in q if r["reason"].startswith("late event")]
    got_late = sorted(json.loads(r["raw_line"])["event_id"] for r in late_rows)
    assert got_late == sorted(late), (got_late, late)  # each once
    for r in late_rows:  # the reason names the event id, its time and the watermark it is at
        ev = json.loads(r["raw_line"])  # or before: this batch's, or (dropped by Spark's dedup)
        assert f"event_id {ev['event_id']}" in r["reason"], r  # the one of the batch before
        m = re.search(r"is at or before (this batch's watermark|the watermark Spark's "
                      r"deduplication applies in this batch) (\S+ \S+) \(", r["reason"])
        assert m, r["reason"]
        printed = _t(m.group(2))
        assert printed >= _t(ev["event_ts"].rstrip("Z")), r["reason"]
        # Spark's dedup: the watermark of the Spark batch before, which is the previous file's
        # batch or a no-data batch Spark ran after it (with this batch's watermark already)
        allowed = [w[0] for w in landing.late_watermarks[ev["event_id"]]] + (
            [] if m.group(1).startswith("this") else
            [w[1] for w in landing.late_watermarks[ev["event_id"]]])
        assert printed in allowed, (r["reason"], allowed)
    for r in q:  # the file the line came from (also for late rows Spark's dedup dropped)
        f = Path(unquote(urlsplit(r["source_file"]).path))
        assert f.parent == landing.dir and f.name in landing.names, r
        ev = json.loads(r["raw_line"])
        if ev.get("event_id") is not None:
            assert ev["event_id"] in {e["event_id"] for e in landing.files[landing.names.index(f.name)]}, r
    assert sum(1 for r in q if "is null" in r["reason"]) == null_ids
    assert sum(s["dropped_by_watermark"] for s in summaries) == len(late)
    assert sum(s["quarantined"] for s in summaries) == len(q) == len(late) + null_ids
    qty = sum(r["qty"] for rows in landing.files for r in rows if r["event_id"] in enriched)
    assert [(r["category"], r["units"], r["count"]) for r in _rows(tmp_path / "gold/per_cat")] == [
        ("fruit", qty, len(enriched))]
    return late


@pytest.mark.parametrize("id_type,trigger", [
    # string ids: late events within one run are the next test's (default tier); across runs,
    # the int leg below (CI budget)
    pytest.param("string", "available_now", marks=pytest.mark.slow),
    pytest.param("string", "once", marks=pytest.mark.slow),  # same mechanism, other trigger
    ("int", "available_now")])  # int: the union path
def test_second_run_events_older_than_on_and_newer_than_the_watermark(
        spark, tmp_path: Path, id_type: str, trigger: str) -> None:
    from cdc_lake.enrich.job import run_enrich

    cfg, landing = _setup(tmp_path, id_type, trigger)
    landing.land("a.json", [("e1", 1, "2026-01-02T10:00:00Z"), ("e2", 2, "2026-01-02T13:00:00Z")])
    s1 = run_enrich(cfg, spark=spark, run_id="r1")  # watermark: 12:00
    landing.land("b.json", [("e3", 4, "2026-01-02T11:00:00Z"),    # older than the watermark
                            ("e4", 8, "2026-01-02T12:00:00Z"),    # exactly on it
                            ("e5", 16, "2026-01-02T12:00:00.001Z"),  # just after it
                            ("e6", 32, "2026-01-02T14:00:00Z"),   # newer
                            (None, 64, "2020-01-01T00:00:00Z")])  # no id, old: quarantined once
    s2 = run_enrich(cfg, spark=spark, run_id="r2")
    late = _check(tmp_path, landing, [s1, s2], null_ids=1)
    assert late == {landing.ident("e3"), landing.ident("e4")}
    # a rerun with nothing new changes nothing
    s3 = run_enrich(cfg, spark=spark, run_id="r3")
    assert s3["facts_read"] == 0 and s3["dropped_by_watermark"] == 0
    _check(tmp_path, landing, [s1, s2, s3], null_ids=1)


def test_one_run_one_file_per_batch_late_events_at_and_before_each_watermark(
        spark, tmp_path: Path) -> None:
    from cdc_lake.enrich.job import run_enrich

    cfg, landing = _setup(tmp_path)
    landing.land("a.json", [("e1", 1, "2026-01-02T10:00:00Z")])
    landing.land("b.json", [("e2", 2, "2026-01-02T13:00:00Z")])   # batch 1: watermark 09:00
    landing.land("c.json", [("e3", 4, "2026-01-02T16:00:00Z"),    # batch 2: watermark 12:00
                            ("e4", 8, "2026-01-02T12:00:00Z")])   # on batch 2's watermark
    landing.land("d.json", [("x1", 16, "2026-01-02T11:00:00Z"),   # batch 3: watermark 15:00,
                            ("x2", 32, "2026-01-02T14:30:00Z"),   # the one before 12:00
                            ("x3", 64, "2026-01-02T15:00:00Z"),   # on the watermark
                            ("x4", 128, "2026-01-02T12:00:00Z"),  # on the one before
                            ("x5", 256, "2026-01-02T16:30:00Z")])
    s = run_enrich(cfg, spark=spark, run_id="r1")
    late = _check(tmp_path, landing, [s])
    assert late == {"e4", "x1", "x2", "x3", "x4"}


def test_late_events_of_a_batch_whose_file_log_entry_is_compacted(spark, tmp_path: Path) -> None:
    """Spark writes every ``compactInterval``-th entry of the file source log as ``<n>.compact``
    (all entries up to it, each with its batchId; 10 by default, 3 here to keep the test short):
    the batch's files are found there too."""
    from cdc_lake.enrich.job import run_enrich

    key = "spark.sql.streaming.fileSource.log.compactInterval"
    cfg, landing = _setup(tmp_path)
    for n in range(2):  # log entries 0, 1, one event an hour
        landing.land(f"f{n:02d}.json", [(f"e{n}", 1, f"2026-01-02T{10 + n:02d}:00:00Z")])
    # entry 2 (written as 2.compact): watermark 10:00 (newest 11:00), the one before 09:00
    landing.land("f02 [late] x.json", [("x1", 2, "2026-01-02T08:00:00Z"), ("x2", 4, "2026-01-02T09:00:00Z"),
                              ("x3", 8, "2026-01-02T10:00:00Z"), ("x4", 16, "2026-01-02T12:00:00Z")])
    landing.land("f03.json", [("x5", 32, "2026-01-02T10:59:00Z")])
    before = spark.conf.get(key, None)
    spark.conf.set(key, "3")
    try:
        s = run_enrich(cfg, spark=spark, run_id="r1")
    finally:
        spark.conf.unset(key) if before is None else spark.conf.set(key, before)
    assert (cfg.checkpoint_path / "sources" / "0" / "2.compact").is_file()
    assert not (cfg.checkpoint_path / "sources" / "0" / "2").exists()
    late = _check(tmp_path, landing, [s])
    assert late == {"x1", "x2", "x3", "x5"}
