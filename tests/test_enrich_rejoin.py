"""Parked facts are re-joined by runs without fact changes (``cdc_lake.enrich.rejoin``).

Issue 7: a fact whose member is missing is parked and "re-joined by every later
micro-batch/run". Micro-batches exist only when the fact table changes, so before the re-join
pass a member arriving in a dimension (or a ``late_members.wait`` running out) changed nothing
until the next fact change. Expected rows are written by hand; real Spark, real delta-rs,
:func:`run_enrich` end to end. The random histories of ``tests/test_enrich_properties.py``
check the same rule against the reference model (runs without fact changes included).
"""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path

import pytest
from deltalake import DeltaTable
from test_enrich_job import AGG, D2, Lake, base, crash_at, lines, products


OUTPUTS = ("gold/lines", "gold/_pending/lines", "gold/rev")


def _versions(lake: Lake) -> dict[str, int | None]:
    return {rel: DeltaTable(lake.path(rel)).version() if DeltaTable.is_deltatable(lake.path(rel)) else None
            for rel in (*OUTPUTS, "gold/_manifests/lines")}


def _manifest_ids(lake: Lake) -> list[int]:
    return sorted(r["batch_id"] for r in DeltaTable(lake.path("gold/_manifests/lines")).to_pyarrow_table().to_pylist())


def _parked_line_2(lake: Lake, spark, wait: str):  # type: ignore[no-untyped-def]
    from cdc_lake.enrich.job import run_enrich

    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 1, "1.00", "2026-01-02T10:00:00"),
                               (2, 2, 3, "2.00", "2026-01-02T10:00:00")))
    base(lake, wait=wait)
    s1 = run_enrich(lake.cfg, spark=spark, run_id="r1")
    assert (s1["batches"], s1["parked"], s1["rejoin"]) == (1, 1, None), s1
    assert lake.rows("gold/_pending/lines", "line_id", "_missing") == [(2, ["products"])]
    return run_enrich


def test_a_member_arriving_releases_parked_facts_without_a_fact_change(spark, tmp_path: Path) -> None:
    lake = Lake(tmp_path, spark)
    run_enrich = _parked_line_2(lake, spark, wait="1000h")
    # nothing new, nothing changed: no pass, no commit anywhere
    before = _versions(lake)
    s = run_enrich(lake.cfg, spark=spark, run_id="r2")
    assert (s["batches"], s["rejoin"]) == (0, None), s
    assert _versions(lake) == before
    # the member arrives; the fact table does not change
    lake.upsert("products", products((2, "pear", "fruit")), "id")
    s = run_enrich(lake.cfg, spark=spark, run_id="r3")
    assert s["batches"] == 0 and s["facts_read"] == 0, s
    rj = s["rejoin"]
    assert rj["passes"] == [-1] and rj["released"] == 1 and rj["released_unknown"] == 0, rj
    assert "products 0 -> 1" in rj["reason"] and "1 pending" in rj["reason"], rj
    assert s["pending_rows"] == 0 and s["dimension_versions"] == {"products": 1}, s
    assert lake.rows("gold/lines", "line_id", "product_name", "_unknown_members", "_enriched_batch") == [
        (1, "apple", [], 0), (2, "pear", [], -1)]
    assert lake.rows("gold/_pending/lines", "line_id") == []
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("7.00"), 4, 2)]
    assert _manifest_ids(lake) == [-1, 0]
    human = _cli()._human(s)
    assert any("re-join pass [-1]" in ln and "1 released" in ln for ln in human), human
    # and again nothing: the pass recorded what it joined
    before = _versions(lake)
    s = run_enrich(lake.cfg, spark=spark, run_id="r4")
    assert s["rejoin"] is None and _versions(lake) == before, s
    # a later fact change is a micro-batch as before (batch 1), the pass numbers stay apart
    lake.upsert("facts", lines((2, 2, 5, "2.00", "2026-01-02T10:00:00")), "line_id")
    s = run_enrich(lake.cfg, spark=spark, run_id="r5")
    assert s["batch_ids"] == [1] and s["rejoin"] is None, s
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("11.00"), 6, 2)]
    assert _manifest_ids(lake) == [-1, 0, 1]


def test_a_wait_running_out_releases_unknown_then_the_member_restates(spark, tmp_path: Path) -> None:
    lake = Lake(tmp_path, spark)
    run_enrich = _parked_line_2(lake, spark, wait="0s")
    # wait 0s: parked by run 1, released by the next run although no fact changed
    s = run_enrich(lake.cfg, spark=spark, run_id="r2")
    assert s["rejoin"]["released_unknown"] == 1 and "waited late_members.wait (0s)" in s["rejoin"]["reason"], s
    assert lake.rows("gold/lines", "line_id", "category", "_unknown_members") == [
        (1, "fruit", []), (2, None, ["products"])]
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("1.00"), 1, 1),
                                           (None, D2, Decimal("6.00"), 3, 1)]
    before = _versions(lake)
    s = run_enrich(lake.cfg, spark=spark, run_id="r3")
    assert s["rejoin"] is None and _versions(lake) == before, s
    # a dimension change that does not concern it: one pass, nothing restated
    lake.upsert("products", products((1, "apple", "fruit")), "id")
    s = run_enrich(lake.cfg, spark=spark, run_id="r4")
    assert s["rejoin"]["restated"] == 0 and "unknown members" in s["rejoin"]["reason"], s
    assert _versions(lake)["gold/rev"] == before["gold/rev"]
    # the member arrives: restated, the null group withdrawn
    lake.upsert("products", products((2, "pear", "veg")), "id")
    s = run_enrich(lake.cfg, spark=spark, run_id="r5")
    assert s["rejoin"]["passes"] == [-3] and s["rejoin"]["restated"] == 1, s
    assert lake.rows("gold/lines", "line_id", "category", "_unknown_members", "_enriched_batch") == [
        (1, "fruit", [], 0), (2, "veg", [], -3)]
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("1.00"), 1, 1),
                                           ("veg", D2, Decimal("6.00"), 3, 1)]


def test_a_pass_killed_between_its_writes_is_finished_first_and_counts_once(
        spark, tmp_path: Path, monkeypatch) -> None:
    lake = Lake(tmp_path, spark)
    run_enrich = _parked_line_2(lake, spark, wait="1000h")
    lake.upsert("products", products((2, "pear", "fruit")), "id")
    with crash_at("enrich:after:enriched", monkeypatch):
        run_enrich(lake.cfg, spark=spark, run_id="r2")
    # the pass wrote the enriched row, not the pending delete nor the aggregate
    assert lake.rows("gold/lines", "line_id") == [(1,), (2,)]
    assert lake.rows("gold/_pending/lines", "line_id") == [(2,)]
    # until it is finished, its plan holds VACUUM back on the versions it read
    from cdc_lake.retention import pinned_readers
    assert ("lines (re-join pass 0 replay)", 0) in pinned_readers(Path(lake.path("products")), [lake.cfg])
    # a fact change lands before the rerun: the pass is finished before the stream's batch
    # (planned on the half-written tables, that batch would count line 2 again)
    lake.upsert("facts", lines((3, 1, 1, "1.00", "2026-01-02T10:00:00")), "line_id")
    s = run_enrich(lake.cfg, spark=spark, run_id="r3")
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("8.00"), 5, 3)]
    assert lake.rows("gold/_pending/lines", "line_id") == []
    assert s["rejoin"]["resumed"] == [-1] and s["replayed_batches"] >= 1 and s["batch_ids"] == [1], s
    assert _manifest_ids(lake) == [-1, 0, 1]
    s = run_enrich(lake.cfg, spark=spark, run_id="r4")
    assert s["rejoin"] is None and s["batches"] == 0, s
    assert pinned_readers(Path(lake.path("products")), [lake.cfg]) == []


def test_events_fact_source_parked_events_released_without_new_files(spark, tmp_path: Path) -> None:
    from cdc_lake.enrich.job import run_enrich

    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.json").write_text("".join(json.dumps(
        {"event_id": e, "product_id": p, "qty": 1, "event_ts": "2026-01-02T10:00:00Z"}) + "\n"
        for e, p in (("e1", 1), ("e2", 2))))
    lake.config("""
        kind: enrich
        pipeline: clicks
        fact:
          events: {path: landing, format: json, id: event_id, time: event_ts, watermark: "1 hour",
                    schema: {event_id: string, product_id: bigint, qty: bigint, event_ts: timestamp}}
        dimensions:
          products: {table: products, keys: [id], on: {product_id: id}, columns: {category: cat}}
        event_time: event_ts
        late_members: {wait: 1000h}
        outputs:
          enriched: gold/clicks
        engine: {name: deltalake}
    """)
    assert run_enrich(lake.cfg, spark=spark, run_id="r1")["parked"] == 1
    time.sleep(0.01)
    lake.upsert("products", products((2, "pear", "veg")), "id")
    s = run_enrich(lake.cfg, spark=spark, run_id="r2")
    assert s["batches"] == 0 and s["rejoin"]["released"] == 1, s
    assert lake.rows("gold/clicks", "event_id", "category", "_enriched_batch") == [
        ("e1", "fruit", 0), ("e2", "veg", -1)]


def _cli():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "enrich_cli", Path(__file__).resolve().parents[1] / "spark_jobs" / "enrich.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_rerun_after_a_failed_run_counts_its_parked_facts_as_parked_by_this_run(
        spark, tmp_path: Path, monkeypatch) -> None:
    """With ``wait: 0s`` a fact parked by a run is released by the next run. A run that stopped
    after its micro-batch committed (here: failing in the re-join check) is completed by the
    rerun, which must not release what that run parked: an uninterrupted run would not have."""
    from cdc_lake.enrich import rejoin
    from cdc_lake.enrich.job import run_enrich

    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 1, "1.00", "2026-01-02T10:00:00")))
    base(lake, wait="0s")
    run_enrich(lake.cfg, spark=spark, run_id="r1")
    lake.upsert("facts", lines((2, 2, 3, "2.00", "2026-01-02T10:00:00")), "line_id")

    def fails(*a, **k):  # type: ignore[no-untyped-def]
        raise RuntimeError("stopped after the stream")

    monkeypatch.setattr(rejoin, "due", fails)
    with pytest.raises(RuntimeError, match="stopped after the stream"):
        run_enrich(lake.cfg, spark=spark, run_id="r2")
    monkeypatch.undo()
    assert lake.rows("gold/_pending/lines", "line_id") == [(2,)]  # batch 1 committed, parked
    s = run_enrich(lake.cfg, spark=spark, run_id="r3")             # completes r2: nothing more
    assert s["rejoin"] is None and lake.rows("gold/_pending/lines", "line_id") == [(2,)], s
    s = run_enrich(lake.cfg, spark=spark, run_id="r4")             # the next run: released
    assert s["rejoin"]["released_unknown"] == 1 and lake.rows("gold/_pending/lines", "line_id") == [], s


def test_unknown_members_are_re_joined_only_when_the_dimensions_changed(spark, tmp_path: Path,
                                                                        capsys) -> None:  # type: ignore[no-untyped-def]
    """A batch re-joins the enriched facts with unknown members (a scan of the whole enriched
    table) only if the dimensions changed since the last batch joined them: with the same
    versions each would be kept as it is. Its plan pins the decision (``restate``)."""
    from cdc_lake.enrich.plan import BatchPlan, plan_file
    from cdc_lake.enrich.rejoin import LAST_JOIN_FILE, restate_needed

    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 1, "1.00", "2026-01-02T10:00:00"),
                               (3, 3, 1, "5.00", "2026-01-02T10:00:00")))
    base(lake, wait="0s")
    lake.feed()                                                      # 0: line 3 parked
    lake.upsert("facts", lines((4, 1, 1, "1.00", "2026-01-03T10:00:00")), "line_id")
    lake.feed()                                                      # 1: released, unknown
    assert lake.rows("gold/lines", "line_id", "_unknown_members") == [(1, []), (3, ["products"]), (4, [])]

    def plan(b: int) -> BatchPlan:
        return BatchPlan.from_json(plan_file(lake.cfg.checkpoint_path, b).read_text())

    capsys.readouterr()
    lake.upsert("facts", lines((5, 1, 2, "1.00", "2026-01-03T10:00:00")), "line_id")
    lake.feed()                       # 2: products as batch 1 joined them: line 3 not re-joined
    out = capsys.readouterr().out
    assert plan(2).restate is False and "'keep'" not in out and "not re-joined" in out, out
    assert lake.rows("gold/lines", "line_id", "_unknown_members", "_enriched_batch") == [
        (1, [], 0), (3, ["products"], 1), (4, [], 1), (5, [], 2)]
    # the decision's inputs: versions, commit fingerprints, the join's definition, the record
    versions, commits = {"products": 0}, {"products": plan(2).commits["dim:products"]}
    assert restate_needed(lake.cfg, versions, commits) is False
    assert restate_needed(lake.cfg, {"products": 1}, commits) is True
    assert restate_needed(lake.cfg, versions, {"products": "another commit"}) is True
    assert restate_needed(lake.cfg, versions, {"products": None}) is True
    record = lake.cfg.checkpoint_path / LAST_JOIN_FILE
    doc = json.loads(record.read_text())
    record.write_text(json.dumps({**doc, "definition": "an earlier definition"}))
    assert restate_needed(lake.cfg, versions, commits) is True
    record.write_text(json.dumps(doc))
    capsys.readouterr()
    # a dimension change of another member: re-joined, and kept (nothing written for line 3)
    lake.upsert("products", products((2, "pear", "fruit")), "id")
    lake.upsert("facts", lines((6, 1, 1, "1.00", "2026-01-03T10:00:00")), "line_id")
    lake.feed()
    out = capsys.readouterr().out
    assert plan(3).restate is True and "'keep': 1" in out, out
    # the member arrives: restated by the next batch
    lake.upsert("products", products((3, "kiwi", "exotic")), "id")
    lake.upsert("facts", lines((7, 1, 1, "1.00", "2026-01-03T10:00:00")), "line_id")
    stats = lake.feed()
    assert plan(4).restate is True and stats.restated == 1
    assert lake.rows("gold/lines", "line_id", "category", "_unknown_members")[1] == (3, "exotic", [])
    assert lake.rows("gold/rev", *AGG)[0] == ("exotic", D2, Decimal("5.00"), 1, 1)
    record.unlink()                   # no record: re-join (at most one scan too many)
    assert restate_needed(lake.cfg, {"products": 2}, {"products": plan(4).commits["dim:products"]}) is True


def test_the_statistics_bound_never_hides_a_wait_that_ran_out(tmp_path: Path) -> None:
    """A run decides "no parked fact has waited" from the pending table's file statistics when
    it can (``rejoin._may_have_waited``: no row read). Against the exact rule on the rows
    (oldest ``_parked_at`` before the run's start and ``wait`` past it), random tables of 1-3
    files and instants within milliseconds of the boundaries: the bound may say "maybe" where the
    rows say no, never "no" where they say yes. Without statistics it always says "maybe"."""
    import os
    import random
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa
    from deltalake import write_deltalake

    from cdc_lake.engines import DeltaRsEngine
    from cdc_lake.enrich.rejoin import _may_have_waited

    seed = int(os.environ.get("CDC_SEED") or random.randrange(2**31))
    rng, engine = random.Random(seed), DeltaRsEngine(None)  # type: ignore[arg-type]
    base, decided = datetime(2026, 1, 2, tzinfo=timezone.utc), 0
    for case in range(24):
        path, times = str(tmp_path / f"p{case}"), []
        for _ in range(rng.randint(1, 3)):
            ts = [base + timedelta(microseconds=rng.randrange(10**9)) for _ in range(rng.randint(1, 4))]
            write_deltalake(path, pa.table({"line_id": list(range(len(ts))),
                                            "_parked_at": pa.array(ts, pa.timestamp("us", tz="UTC"))}),
                            mode="append")
            times += ts
        oldest = min(times)
        for _ in range(20):
            wait = timedelta(seconds=rng.choice([0, 1, 3600]))
            started = oldest + timedelta(microseconds=rng.randint(-3000, 3000))
            now = oldest + wait + timedelta(microseconds=rng.randint(-3000, 3000))
            exact = oldest < started and oldest + wait <= now
            maybe = _may_have_waited(engine, path, wait, started, now)
            assert maybe or not exact, (f"CDC_SEED={seed}: oldest {oldest}, started {started}, "
                                        f"now {now}, wait {wait}")
            decided += not maybe
    assert decided > 0, f"CDC_SEED={seed}: the statistics never decided"
    # a table whose files carry no statistics: the rows decide
    log = tmp_path / "p0" / "_delta_log"
    for f in log.glob("*.json"):
        actions = [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()]
        f.write_text("".join(json.dumps({"add": {k: v for k, v in a["add"].items() if k != "stats"}}
                                        if "add" in a else a) + "\n" for a in actions))
    assert _may_have_waited(engine, str(tmp_path / "p0"), timedelta(0), base, base) is True
