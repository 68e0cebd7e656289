"""Functional tests of the enrichment job kind (issue 7), with hand-written expected rows.

Real Spark, real delta-rs. Upstream tables are Delta tables written with ``deltalake`` (change
data feed on; merges for updates, deletes for deletes). Batch-level tests feed
``DeltaTable.load_cdf`` rows (read by delta-rs itself, not by the job's source) into the job's
``foreachBatch`` handler; stream-level tests run :func:`run_enrich` end to end.
"""

from __future__ import annotations

import contextlib
import json
import os
import textwrap
import time
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from cdc_lake.config import ConfigError, load_pipeline
from cdc_lake.engines import select_engine
from cdc_lake.enrich import writer as writer_mod
from cdc_lake.enrich.joins import DimensionSchemaError
from cdc_lake.enrich.writer import EnrichBatch, EnrichStats

CDF = {"delta.enableChangeDataFeed": "true"}
FACT_SCHEMA = pa.schema([("line_id", pa.int64()), ("product_id", pa.int64()),
                         ("qty", pa.int64()), ("price", pa.decimal128(10, 2)),
                         ("ts", pa.timestamp("us", tz="UTC"))])


def ts(s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=timezone.utc)


def lines(*rows: tuple) -> pa.Table:
    """Fact rows (line_id, product_id, qty, price, ts-string)."""
    return pa.Table.from_pylist([{"line_id": r[0], "product_id": r[1], "qty": r[2],
                                  "price": Decimal(r[3]), "ts": ts(r[4])} for r in rows],
                                schema=FACT_SCHEMA)


def products(*rows: tuple) -> pa.Table:
    return pa.table({"id": [r[0] for r in rows], "name": [r[1] for r in rows],
                     "cat": [r[2] for r in rows]})


class Lake:
    """A tmp lake: upstream tables, a pipeline YAML, batches fed from ``load_cdf``."""

    def __init__(self, root: Path, spark) -> None:  # type: ignore[no-untyped-def]
        self.root, self.spark = root, spark
        self.engine = select_engine(spark, "deltalake")
        self.fed = -1  # last fact version fed
        self.batch_id = 0
        self.stats = EnrichStats()

    def path(self, rel: str) -> str:
        return str(self.root / rel)

    def create(self, rel: str, data: pa.Table) -> None:
        write_deltalake(self.path(rel), data, configuration=CDF)

    def upsert(self, rel: str, data: pa.Table, key: str) -> None:
        (DeltaTable(self.path(rel)).merge(data, f"t.{key} = s.{key}", "s", "t")
         .when_matched_update_all().when_not_matched_insert_all().execute())

    def delete(self, rel: str, predicate: str) -> None:
        DeltaTable(self.path(rel)).delete(predicate)

    def config(self, body: str):  # type: ignore[no-untyped-def]
        f = self.root / "pipeline.yaml"
        f.write_text(textwrap.dedent(body), encoding="utf-8")
        self.cfg = load_pipeline(f)
        return self.cfg

    def feed(self, batch_id: int | None = None) -> EnrichStats:
        """One micro-batch of every fact version not fed yet (as delta-rs's load_cdf reads it)."""
        dt = DeltaTable(self.path("facts"))
        end = dt.version()
        cdf = pa.table(dt.load_cdf(starting_version=self.fed + 1, ending_version=end).read_all())
        cdf = cdf.cast(pa.schema([pa.field(f.name, pa.string() if pa.types.is_string_view(f.type) else
                                           pa.int64() if f.name == "_commit_version" else f.type)
                                  for f in cdf.schema]))
        df = self.spark.createDataFrame(cdf)
        bid = self.batch_id if batch_id is None else batch_id
        EnrichBatch(self.cfg, self.engine, instance="test", run_id="r", stats=self.stats)(df, bid)
        self.fed, self.batch_id = end, bid + 1
        return self.stats

    def rows(self, rel: str, *cols: str) -> list[tuple]:
        if not DeltaTable.is_deltatable(self.path(rel)):
            return []
        t = DeltaTable(self.path(rel)).to_pyarrow_table().to_pylist()
        return sorted((tuple(_plain(r[c]) for c in cols) for r in t), key=repr)


EVENT_COLUMNS = "event_id: string, product_id: bigint, qty: bigint, event_ts: timestamp"


def clicks_on_events(lake: "Lake", columns: str = EVENT_COLUMNS, options: str = ""):  # type: ignore[no-untyped-def]
    """The ``clicks`` pipeline over the JSON events in ``<lake>/landing``: ``columns`` is
    ``fact.events.schema``'s body, ``options`` more ``fact.events`` entries (``"max_files_per_trigger:
    1, "``); products joined for ``category``; ``gold/clicks`` and the ``per_cat`` aggregate."""
    return lake.config(f"""
        kind: enrich
        pipeline: clicks
        fact:
          events: {{path: landing, format: json, id: event_id, time: event_ts, watermark: "1 hour",
                   {options}schema: {{{columns}}}}}
        dimensions:
          products: {{table: products, keys: [id], on: {{product_id: id}}, columns: {{category: cat}}}}
        event_time: event_ts
        outputs:
          enriched: gold/clicks
          aggregates: {{per_cat: {{group_by: [category], sums: {{units: qty}}}}}}
        engine: {{name: deltalake}}
    """)


def _plain(v):  # type: ignore[no-untyped-def]
    if isinstance(v, list) and v and isinstance(v[0], tuple):  # map<string,bigint>
        return dict(v)
    return v


BASE_YAML = """
    kind: enrich
    pipeline: lines
    fact: {change_feed: facts, keys: [line_id]}
    dimensions:
      products: {table: products, keys: [id], scd: 1, on: {product_id: id},
                 columns: {product_name: name, category: cat}}
    event_time: ts
    late_members: {wait: WAIT}
    outputs:
      enriched: gold/lines
      aggregates:
        rev: {group_by: [category], time_bucket: day, sums: {revenue: "qty * price", units: qty}}
    engine: {name: deltalake}
"""


def base(lake: Lake, wait: str = "2h") -> None:
    lake.config(BASE_YAML.replace("WAIT", wait))


AGG = ("category", "day", "revenue", "units", "count")
D2 = datetime(2026, 1, 2).date()


def test_config_errors_name_file_key_and_fix(tmp_path: Path) -> None:
    lake = Lake(tmp_path, None)
    bad = {
        "scd: 3": ("dimensions.products.scd", "expected 1 or 2"),
        "on: {product_id: name}": ("dimensions.products.on", "must map a column to each key"),
        "columns: {_fact_version: name}": ("dimensions.products.columns._fact_version", "reserved"),
    }
    for repl, (key, text) in bad.items():
        body = BASE_YAML.replace("WAIT", "1h").replace(
            "scd: 1" if repl.startswith("scd") else "on: {product_id: id}" if repl.startswith("on")
            else "columns: {product_name: name, category: cat}", repl)
        with pytest.raises(ConfigError) as e:
            lake.config(body)
        assert key in str(e.value) and text in str(e.value) and "pipeline.yaml" in str(e.value)
    with pytest.raises(ConfigError, match="late_members.wait: expected a duration"):
        lake.config(BASE_YAML.replace("WAIT", "soon"))
    with pytest.raises(ConfigError, match="event_time: is required"):
        lake.config(BASE_YAML.replace("WAIT", "1h").replace("event_time: ts", ""))
    cfg = lake.config(BASE_YAML.replace("WAIT", "0s"))
    assert cfg.kind == "enrich" and cfg.late_wait.total_seconds() == 0
    assert cfg.outputs.pending == tmp_path / "gold" / "_pending" / "lines"
    assert cfg.checkpoint_path == tmp_path / "gold" / "_checkpoints" / "lines"


def test_fresh_dimensions_each_batch_and_point_in_time(spark, tmp_path: Path) -> None:
    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 2, "1.50", "2026-01-02T10:00:00")))
    base(lake)
    lake.feed()
    # the dimension changes between two micro-batches
    lake.upsert("products", products((1, "apple", "produce"), (2, "pear", "produce")), "id")
    lake.upsert("facts", lines((2, 1, 1, "1.00", "2026-01-02T11:00:00")), "line_id")
    stats = lake.feed()
    assert lake.rows("gold/lines", "line_id", "category", "_dim_versions", "_enriched_batch") == [
        (1, "fruit", {"products": 0}, 0),        # keeps what it was enriched with
        (2, "produce", {"products": 1}, 1)]      # the new fact sees the dimension's new version
    assert lake.rows("gold/_manifests/lines", "batch_id", "dimension_versions") == [
        (0, {"products": 0}), (1, {"products": 1})]
    assert stats.dimension_versions == {"products": 1}
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("3.00"), 2, 1),
                                          ("produce", D2, Decimal("1.00"), 1, 1)]


def test_fact_update_delete_and_aggregate_group_disappears(spark, tmp_path: Path) -> None:
    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit"), (2, "pear", "fruit")))
    lake.create("facts", lines((1, 1, 2, "1.50", "2026-01-02T10:00:00"),
                               (2, 2, 1, "4.00", "2026-01-02T11:00:00")))
    base(lake)
    lake.feed()
    lake.upsert("products", products((1, "apple", "produce")), "id")
    lake.upsert("facts", lines((1, 1, 4, "1.50", "2026-01-02T10:00:00")), "line_id")  # update
    lake.delete("facts", "line_id = 2")                                                # delete
    stats = lake.feed()
    # the updated fact is re-enriched with the dimensions current at its batch
    assert lake.rows("gold/lines", "line_id", "qty", "category", "_fact_version") == [
        (1, 4, "produce", 1)]
    # 'fruit' lost both lines: count 0 -> the group is gone (no recompute: signed deltas)
    assert lake.rows("gold/rev", *AGG) == [("produce", D2, Decimal("6.00"), 4, 1)]
    assert stats.enriched_deleted == 1 and stats.enriched_upserted == 3
    # a delete of a fact that is not there and a stale update change nothing
    before = DeltaTable(lake.path("gold/lines")).version()
    lake.upsert("facts", lines((1, 1, 4, "1.50", "2026-01-02T10:00:00")), "line_id")
    lake.delete("facts", "line_id = 1")
    lake.feed()
    assert lake.rows("gold/lines", "line_id") == [] and lake.rows("gold/rev", *AGG) == []
    assert DeltaTable(lake.path("gold/lines")).version() == before + 1


def test_a_batch_of_new_facts_appends_to_the_enriched_table(spark, tmp_path: Path) -> None:
    """A MERGE scans its whole target (0.5-0.6 s at 442k enriched rows, growing with it); a
    batch whose enriched rows are all new facts (no stored row of its keys, no delete, no
    restated fact) appends them instead, and a batch that changes a stored fact still MERGEs.
    The rows and the aggregate are the same either way."""
    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 2, "1.50", "2026-01-02T10:00:00")))
    base(lake)
    lake.feed()
    lake.upsert("facts", lines((2, 1, 1, "1.00", "2026-01-02T11:00:00")), "line_id")  # new
    lake.feed()
    lake.upsert("facts", lines((1, 1, 4, "1.50", "2026-01-02T10:00:00"),              # update
                               (3, 1, 1, "2.00", "2026-01-02T12:00:00")), "line_id")  # new
    lake.feed()
    ops = [h["operation"] for h in sorted(DeltaTable(lake.path("gold/lines")).history(),
                                         key=lambda h: h["version"])]
    assert ops[-2:] == ["WRITE", "MERGE"], ops
    assert lake.rows("gold/lines", "line_id", "qty", "_fact_version") == [(1, 4, 2), (2, 1, 1),
                                                                         (3, 1, 2)]
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("9.00"), 6, 3)]


def test_scd2_as_of_event_time(spark, tmp_path: Path) -> None:
    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("customers", pa.Table.from_pylist([
        {"id": 10, "city": "Oslo", "_valid_from": ts("2026-01-01T00:00:00"),
         "_valid_to": ts("2026-01-05T00:00:00"), "_is_current": False, "_cdc_op": "insert"},
        {"id": 10, "city": "Rome", "_valid_from": ts("2026-01-05T00:00:00"),
         "_valid_to": ts("2026-01-10T00:00:00"), "_is_current": False, "_cdc_op": "update"},
        {"id": 10, "city": None, "_valid_from": ts("2026-01-10T00:00:00"),
         "_valid_to": None, "_is_current": False, "_cdc_op": "delete"},
        {"id": 11, "city": "Paris", "_valid_from": ts("2026-01-03T00:00:00"),
         "_valid_to": None, "_is_current": True, "_cdc_op": "insert"}]))
    facts = pa.Table.from_pylist([
        {"line_id": i, "product_id": 1, "customer_id": c, "qty": 1, "price": Decimal("1.00"),
         "ts": ts(t)} for i, c, t in [(1, 10, "2026-01-02T00:00:00"), (2, 10, "2026-01-07T00:00:00"),
                                      (3, 10, "2026-01-11T00:00:00"), (4, 11, "2026-01-01T00:00:00"),
                                      (5, 11, "2026-01-03T00:00:00"), (6, 10, "2026-01-05T00:00:00")]])
    lake.create("facts", facts)
    lake.config(BASE_YAML.replace("WAIT", "2h").replace("    event_time: ts", """\
      customers: {table: customers, keys: [id], scd: 2, on: {customer_id: id}, columns: {city: city}}
    event_time: ts"""))
    stats = lake.feed()
    assert lake.rows("gold/lines", "line_id", "city") == [
        (1, "Oslo"), (2, "Rome"), (5, "Paris"),   # _valid_from inclusive
        (6, "Rome")]                              # _valid_to exclusive
    # after the member's delete, and before its first version: late, parked (not joined to nulls)
    assert lake.rows("gold/_pending/lines", "line_id", "_missing") == [
        (3, ["customers"]), (4, ["customers"])]
    assert stats.parked == 2


def test_late_members_park_release_unknown_restate(spark, tmp_path: Path) -> None:
    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 1, "1.00", "2026-01-02T10:00:00"),
                               (2, 2, 1, "2.00", "2026-01-02T10:00:00"),
                               (3, 3, 1, "5.00", "2026-01-02T10:00:00")))
    base(lake, wait="0s")
    lake.feed()
    assert lake.rows("gold/lines", "line_id") == [(1,)]
    assert lake.rows("gold/_pending/lines", "line_id", "_missing") == [(2, ["products"]),
                                                                       (3, ["products"])]
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("1.00"), 1, 1)]  # pending: not counted
    lake.upsert("products", products((2, "pear", "fruit")), "id")                # member 2 arrives
    lake.upsert("facts", lines((4, 1, 1, "1.00", "2026-01-03T10:00:00")), "line_id")
    lake.feed()
    assert lake.rows("gold/lines", "line_id", "product_name", "_unknown_members") == [
        (1, "apple", []), (2, "pear", []),   # released: its member arrived
        (3, None, ["products"]),             # waited >= 0s: released, flagged unknown
        (4, "apple", [])]
    assert lake.rows("gold/_pending/lines", "line_id") == []
    assert lake.rows("gold/rev", *AGG) == [
        ("fruit", D2, Decimal("3.00"), 2, 2), ("fruit", datetime(2026, 1, 3).date(), Decimal("1.00"), 1, 1),
        (None, D2, Decimal("5.00"), 1, 1)]   # the unknown member aggregates under null
    lake.upsert("products", products((3, "kiwi", "exotic")), "id")               # member 3 arrives late
    lake.upsert("facts", lines((5, 2, 1, "2.00", "2026-01-03T10:00:00")), "line_id")
    stats = lake.feed()
    assert lake.rows("gold/lines", "line_id", "category", "_unknown_members", "_enriched_batch")[2] == \
        (3, "exotic", [], 2)                 # restated
    assert lake.rows("gold/rev", *AGG) == [
        ("exotic", D2, Decimal("5.00"), 1, 1), ("fruit", D2, Decimal("3.00"), 2, 2),
        ("fruit", datetime(2026, 1, 3).date(), Decimal("3.00"), 2, 2)]  # null group gone
    assert (stats.parked, stats.released, stats.released_unknown, stats.restated) == (2, 1, 1, 1)


def _batch_1_killed_after_its_enriched_write(tmp_path: Path, spark, monkeypatch) -> Lake:  # type: ignore[no-untyped-def]
    """Batch 0 enriches line 1 (qty 2); batch 1 (qty 4) crashes after its enriched write,
    before the aggregate's."""
    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 2, "1.50", "2026-01-02T10:00:00")))
    base(lake)
    lake.feed()
    lake.upsert("facts", lines((1, 1, 4, "1.50", "2026-01-02T10:00:00")), "line_id")  # v1: update
    with crash_at("enrich:after:enriched", monkeypatch):
        lake.feed()
    return lake


class Crash(Exception):
    """Raised at a writer fault-injection point instead of the SIGKILL (in-process tests)."""


@contextlib.contextmanager
def crash_at(point: str, monkeypatch):  # type: ignore[no-untyped-def]
    """The body must stop with :class:`Crash` at the writer's fault point ``point``."""
    def crash(name: str) -> None:
        if name == point:
            raise Crash(name)

    monkeypatch.setattr(writer_mod, "crash_point", crash)
    with pytest.raises(Crash):
        yield
    monkeypatch.undo()


def test_replayed_batch_changes_nothing_and_crash_between_writes_never_double_counts(
        spark, tmp_path: Path, monkeypatch) -> None:
    lake = _batch_1_killed_after_its_enriched_write(tmp_path, spark, monkeypatch)
    assert lake.rows("gold/lines", "line_id", "qty") == [(1, 4)]
    lake.upsert("products", products((1, "apple", "CHANGED")), "id")  # after the crash
    lake.fed, lake.batch_id = 0, 1  # Spark replays batch 1 with the same change-feed rows
    stats = lake.feed()
    # The replay used the batch's pinned plan: the old contribution (qty 2) was withdrawn once,
    # and the dimension version of the first attempt was used, not the one changed since.
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("6.00"), 4, 1)]
    assert lake.rows("gold/lines", "line_id", "qty", "category") == [(1, 4, "fruit")]
    assert stats.skipped_writes == 1 and stats.replayed_batches == 1
    versions = {t: DeltaTable(lake.path(t)).version() for t in ("gold/lines", "gold/rev")}
    lake.fed, lake.batch_id = 0, 1  # replay the whole batch once more: everything skipped
    stats = lake.feed()
    assert {t: DeltaTable(lake.path(t)).version() for t in versions} == versions
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("6.00"), 4, 1)]
    assert stats.skipped_writes >= 4  # enriched (x2), aggregate, manifest


def test_a_lost_or_damaged_plan_of_a_batch_that_wrote_stops_it(spark, tmp_path: Path, monkeypatch) -> None:
    """The plan of a batch killed after its enriched write, damaged or deleted by hand: exit 3
    (EnrichNeedsReprocess naming the file); before, a damaged one was a bare JSONDecodeError and
    a deleted one was planned again at the versions holding the batch's own write, so the replay
    took its changes for old ones and the aggregate missed them, exit 0 (tester). A damaged plan
    of a batch that wrote nothing is planned again."""
    from cdc_lake.enrich.plan import plan_file
    from cdc_lake.enrich.state import EnrichNeedsReprocess

    lake = _batch_1_killed_after_its_enriched_write(tmp_path, spark, monkeypatch)
    plan = plan_file(lake.cfg.checkpoint_path, 1)
    good = plan.read_text(encoding="utf-8")
    incomplete = json.dumps({**json.loads(good), "versions": {}})
    for damage, word in (("garbage{", "unreadable"), ("[]", "unreadable"), ("null", "unreadable"),
                         (incomplete, "incomplete"), (None, "missing")):
        if damage is None:
            plan.unlink()
        else:
            plan.write_text(damage, encoding="utf-8")
        lake.fed, lake.batch_id = 0, 1
        with pytest.raises(EnrichNeedsReprocess) as e:
            lake.feed()
        msg = str(e.value)
        assert str(plan) in msg and word in msg, msg
        assert "['enriched']" in msg and "--reprocess" in msg, msg
    plan.write_text(good, encoding="utf-8")  # the file put back: the replay completes the batch
    lake.fed, lake.batch_id = 0, 1
    lake.feed()
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("6.00"), 4, 1)]
    # the next batch's plan file damaged before the batch ran (nothing written): planned again
    lake.upsert("facts", lines((2, 1, 1, "1.50", "2026-01-02T11:00:00")), "line_id")
    plan_file(lake.cfg.checkpoint_path, 2).write_text("{", encoding="utf-8")
    lake.feed()
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("7.50"), 5, 2)]


def test_groups_of_timestamps_apart_by_microseconds_stay_apart(spark, tmp_path: Path) -> None:
    """`_group_key` (to_json) wrote timestamps to the millisecond: two groups .000100 and .000200
    got one key, then a fact moving between them failed every MERGE (multiply matched target
    row; tester). Truth: one row per distinct value, computed here from the facts."""
    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 1, "1.00", "2026-01-02T10:00:00.000100"),
                               (2, 1, 2, "1.00", "2026-01-02T10:00:00.000200"),
                               (3, 1, 4, "1.00", "2026-01-02T10:00:00")))
    lake.config(BASE_YAML.replace("WAIT", "0s").replace(
        "rev: {group_by: [category], time_bucket: day,", "rev: {group_by: [ts], time_bucket: none,"))
    lake.feed()
    lake.upsert("facts", lines((1, 1, 1, "1.00", "2026-01-02T10:00:00.000300")), "line_id")
    lake.feed()
    got = sorted((r[0].replace(tzinfo=None).isoformat(), r[1], r[2])
                 for r in lake.rows("gold/rev", "ts", "units", "count"))
    assert got == [("2026-01-02T10:00:00", 4, 1), ("2026-01-02T10:00:00.000200", 2, 1),
                   ("2026-01-02T10:00:00.000300", 1, 1)], got
    keys = [r[0] for r in lake.rows("gold/rev", "_group_key")]
    assert '{"ts":"2026-01-02T10:00:00.000Z"}' in keys  # whole milliseconds: the key as before


def test_schema_drift_new_column_flows_dropped_dimension_column_fails(spark, tmp_path: Path) -> None:
    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 2, "1.50", "2026-01-02T10:00:00")))
    base(lake)
    lake.feed()
    wider = lines((2, 1, 1, "1.00", "2026-01-02T11:00:00")).append_column("coupon", pa.array(["X1"]))
    write_deltalake(lake.path("facts"), wider, mode="append", schema_mode="merge")
    lake.feed()
    assert lake.rows("gold/lines", "line_id", "coupon", "category") == [(1, None, "fruit"),
                                                                       (2, "X1", "fruit")]
    write_deltalake(lake.path("products"), pa.table({"id": [1], "cat": ["fruit"]}),
                    mode="overwrite", schema_mode="overwrite")
    lake.upsert("facts", lines((3, 1, 1, "1.00", "2026-01-02T12:00:00")), "line_id")
    with pytest.raises(DimensionSchemaError) as e:
        lake.feed()
    msg = str(e.value)
    assert "'name'" in msg and lake.path("products") in msg and "dimensions.products.columns" in msg


def _run_cli(capsys, *args: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "enrich_cli", Path(__file__).resolve().parents[1] / "spark_jobs" / "enrich.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    code = mod.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_stream_fresh_dimension_within_one_run_and_between_runs(spark, tmp_path: Path) -> None:
    from cdc_lake.enrich.job import run_enrich

    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 2, "1.50", "2026-01-02T10:00:00")))
    lake.upsert("facts", lines((2, 1, 1, "1.00", "2026-01-02T11:00:00")), "line_id")
    cfg = lake.config(BASE_YAML.replace("WAIT", "2h").replace(
        "keys: [line_id]}", "keys: [line_id], max_versions_per_trigger: 1}"))

    def change_dimension(batch_id: int) -> None:  # between micro-batch 0 and 1 of this run
        if batch_id == 0:
            lake.upsert("products", products((1, "apple", "produce")), "id")

    s1 = run_enrich(cfg, spark=spark, run_id="r1", batch_hook=change_dimension)
    assert s1["batch_ids"] == [0, 1] and s1["dimension_versions"] == {"products": 1}
    assert lake.rows("gold/lines", "line_id", "category", "_dim_versions") == [
        (1, "fruit", {"products": 0}), (2, "produce", {"products": 1})]
    lake.upsert("products", products((1, "apple", "orchard")), "id")   # between runs
    lake.upsert("facts", lines((3, 1, 1, "1.00", "2026-01-02T12:00:00")), "line_id")
    s2 = run_enrich(cfg, spark=spark, run_id="r2")
    assert s2["batch_ids"] == [2] and s2["facts_read"] == 1 and s2["dimension_versions"] == {"products": 2}
    assert lake.rows("gold/lines", "line_id", "category")[2] == (3, "orchard")
    summary = json.loads((cfg.runs_path / "lines" / "r2.json").read_text())
    assert summary["tables"]["enriched"] == DeltaTable(lake.path("gold/lines")).version()


def test_upstream_rewrite_exits_3_and_reprocess_recovers(spark, tmp_path: Path, capsys) -> None:
    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    lake.create("facts", lines((1, 1, 2, "1.50", "2026-01-02T10:00:00")))
    cfg = lake.config(BASE_YAML.replace("WAIT", "2h"))
    code, out, _ = _run_cli(capsys, "--pipeline", str(cfg.file), "--run-id", "r1")
    assert code == 0 and "ENRICH_RUN_SUMMARY " in out
    # a full refresh of the upstream table: an overwrite, not a change feed
    write_deltalake(lake.path("facts"), lines((7, 1, 1, "2.00", "2026-01-02T10:00:00")), mode="overwrite")
    code, _, err = _run_cli(capsys, "--pipeline", str(cfg.file), "--run-id", "r2")
    assert code == 3
    assert lake.path("facts") in err and "--reprocess" in err and "versions" in err
    assert lake.rows("gold/lines", "line_id") == [(1,)]  # untouched
    code, out, err = _run_cli(capsys, "--pipeline", str(cfg.file), "--run-id", "r3", "--reprocess")
    assert code == 0, err
    assert lake.rows("gold/lines", "line_id", "category") == [(7, "fruit")]
    assert lake.rows("gold/rev", *AGG) == [("fruit", D2, Decimal("2.00"), 1, 1)]
    lake.upsert("facts", lines((8, 1, 1, "1.00", "2026-01-02T11:00:00")), "line_id")
    code, out, err = _run_cli(capsys, "--pipeline", str(cfg.file), "--run-id", "r4")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("ENRICH_RUN_SUMMARY "))
    assert json.loads(line.split(" ", 1)[1])["facts_read"] == 1  # follows on from the snapshot
    assert lake.rows("gold/lines", "line_id") == [(7,), (8,)]


def test_events_source_watermark_dedup_and_dropped_count(spark, tmp_path: Path) -> None:
    from cdc_lake.enrich.job import run_enrich

    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    landing = tmp_path / "landing"
    landing.mkdir()

    def land(name: str, events: list[tuple[str, int, str]], mtime: float) -> None:
        f = landing / name
        f.write_text("".join(json.dumps({"event_id": e, "product_id": p, "qty": 1, "event_ts": t}) + "\n"
                             for e, p, t in events))
        os.utime(f, (mtime, mtime))

    now = time.time()
    land("a.json", [("e1", 1, "2026-01-02T10:00:00Z"), ("e2", 1, "2026-01-02T10:30:00Z"),
                    ("e1", 1, "2026-01-02T10:00:00Z")], now - 20)
    land("b.json", [("e3", 1, "2026-01-02T08:00:00Z"),      # older than the watermark (09:30)
                    ("e2", 1, "2026-01-02T10:30:00Z"),      # duplicate within the watermark
                    ("e4", 1, "2026-01-02T11:00:00Z")], now - 10)
    cfg = clicks_on_events(lake, options="max_files_per_trigger: 1, ")
    s = run_enrich(cfg, spark=spark, run_id="r1")
    assert lake.rows("gold/clicks", "event_id", "category") == [("e1", "fruit"), ("e2", "fruit"),
                                                               ("e4", "fruit")]
    # one micro-batch per file and none after them: the watermark moved, but a batch that reads
    # nothing would plan and write a batch for no fact (spark_session.start_without_no_data_batches)
    assert s["batch_ids"] == [0, 1], s
    from cdc_lake.spark_session import NO_DATA_BATCHES
    assert spark.conf.get(NO_DATA_BATCHES) == "true"  # the session's own setting is back
    assert s["dropped_by_watermark"] == 1
    assert lake.rows("gold/per_cat", "category", "units", "count") == [("fruit", 3, 3)]
    # dropped, counted and kept: the late event is in the quarantine table with the reason
    (raw, reason), = lake.rows("gold/_quarantine", "raw_line", "reason")
    assert json.loads(raw)["event_id"] == "e3"
    assert reason.startswith("late event: event_ts 2026-01-02 08:00:00") and "watermark" in reason
    # a rerun with nothing new changes nothing (the replayed decision is the same)
    s2 = run_enrich(cfg, spark=spark, run_id="r2")
    assert s2["facts_read"] == 0 and len(lake.rows("gold/_quarantine", "reason")) == 1


def _file_of(uri: str) -> Path:
    """A quarantine row's source_file (Spark's ``_metadata.file_path``: ``file:/...``) as a path."""
    from urllib.parse import unquote, urlsplit

    return Path(unquote(urlsplit(uri).path))


# string: the stand-in path (bigint takes it too: slow tier, CI budget); int: the bypass (union)
@pytest.mark.parametrize("id_type", ["string", pytest.param("bigint", marks=pytest.mark.slow), "int"])
def test_events_without_an_id_and_malformed_lines_are_each_quarantined(spark, tmp_path: Path,
                                                                        id_type: str) -> None:
    """Spark's streaming dedup took every null id for one id: of two events without an id and
    two malformed lines (id null too), one row reached the quarantine, with raw_line '{}' and
    the others lost; a value not of its schema type ("yesterday" for a timestamp) became null
    and the event was enriched (tester). Truth: every line is enriched or quarantined, a
    malformed one with its own text; ids still deduplicate."""
    from cdc_lake.enrich.job import run_enrich

    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    landing = tmp_path / "landing"
    landing.mkdir()
    ids = ["e1", "e2", "e3"] if id_type == "string" else [1, 2, 3]
    good = [{"event_id": ids[0], "product_id": 1, "qty": 1, "event_ts": "2026-01-02T10:00:00Z"},
            {"event_id": ids[1], "product_id": 1, "qty": 2, "event_ts": "2026-01-02T10:01:00Z"},
            {"event_id": ids[0], "product_id": 1, "qty": 1, "event_ts": "2026-01-02T10:00:00Z"}]  # dup
    no_id = [{"event_id": None, "product_id": 1, "qty": q, "event_ts": "2026-01-02T10:05:00Z"} for q in (5, 6)]
    broken = ['{"event_id": "b1", "product_id": 1, "qty": 3, BROKEN',
              '{"product_id": 1, "qty": 4 BROKEN',
              json.dumps({"event_id": "e9" if id_type == "string" else 9, "product_id": 1, "qty": 8,
                          "event_ts": "yesterday"}),
              # a line not of the schema carrying a readable id: its id must not stand for the
              # correct event of that id further down (which the dedup then dropped; tester)
              json.dumps({"event_id": ids[2], "product_id": 1, "qty": "x", "event_ts": "2026-01-02T10:02:00Z"})]
    fixed = {"event_id": ids[2], "product_id": 1, "qty": 4, "event_ts": "2026-01-02T10:02:00Z"}
    (landing / "a.json").write_text("\n".join([json.dumps(e) for e in good + no_id] + broken
                                              + [json.dumps(fixed)]) + "\n")
    cfg = clicks_on_events(lake, EVENT_COLUMNS.replace("event_id: string", f"event_id: {id_type}"))
    s = run_enrich(cfg, spark=spark, run_id="r1")
    assert sorted(r[0] for r in lake.rows("gold/clicks", "event_id")) == ids
    assert lake.rows("gold/per_cat", "category", "units", "count") == [("fruit", 7, 3)]
    q = lake.rows("gold/_quarantine", "raw_line", "reason")
    assert s["quarantined"] == len(q) == 6, q
    assert sorted(json.loads(r)["qty"] for r, why in q if "is null" in why) == [5, 6]
    assert sorted(r for r, why in q if "malformed JSON line" in why) == sorted(
        b for b in broken if "yesterday" not in b)
    # a time not taken: its own reason, the line as the schema's columns with the time as sent
    (raw, why), = [(r, why) for r, why in q if "yesterday" in r]
    assert json.loads(raw) == json.loads(broken[2]) and 'event_ts "yesterday" is not an event time' in why
    # each names the file it came from (Spark's file URI, as the CDC quarantine does)
    assert {_file_of(f) for (f,) in lake.rows("gold/_quarantine", "source_file")} == {landing / "a.json"}
    # run 2: an event without an id older than the watermark is quarantined too (the dedup
    # dropped it as late before the job's own late check; tester); a duplicate still goes
    (landing / "b.json").write_text("\n".join(json.dumps(e) for e in [
        good[0], {"event_id": None, "product_id": 1, "qty": 11,
                  "event_ts": "2020-01-01T00:00:00.123456Z"}]) + "\n")
    s2 = run_enrich(cfg, spark=spark, run_id="r2")
    assert s2["quarantined"] == 1 and s2["enriched_upserted"] == 0, s2
    (late,) = [json.loads(r) for r, _ in lake.rows("gold/_quarantine", "raw_line", "reason")
               if '"qty":11' in r]
    assert late["event_ts"] == "2020-01-01T00:00:00.123456Z", late  # not cut to ms (tester)
    assert [_file_of(f) for r, f in lake.rows("gold/_quarantine", "raw_line", "source_file")
            if '"qty":11' in r] == [landing / "b.json"]
    # the checkpoint is checked before the stream like the CDC job's (a missing metadata file)
    from cdc_lake.checkpoint_log import CheckpointDamaged

    (cfg.checkpoint_path / "metadata").unlink()
    with pytest.raises(CheckpointDamaged) as e:
        run_enrich(cfg, spark=spark, run_id="r3")
    assert "metadata" in str(e.value) and "--reprocess" in str(e.value)


def test_event_values_spark_would_change_are_quarantined_not_stored(spark, tmp_path: Path) -> None:
    """Spark's JSON reader took ``01:30:00 PST`` on the night DST ends as the PDT instant, CST
    as US Central and a region's repeated hour as one of its two instants (one to thirteen hours
    off, exit 0: tester L for the CDC job; this source read them the same way); it stored
    ``9999-12-31T23:30:00-01:00`` as the year 10000 and wrapped a too large epoch number to
    1969; an event without its time was enriched with a null one; a decimal was rounded to the
    column's scale (``1.234`` -> ``1.23``) and a date-time in a ``date`` column lost its time; a
    column named twice in a line kept the last value, one named only in another case (``Qty``)
    was stored null. Truth: instants computed here with fixed offsets, decimals with ``Decimal``; a value Spark
    would change, or a missing time, is quarantined with its reason, and its id does not drop
    the correct event of that id after it."""
    from cdc_lake.enrich.job import run_enrich

    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    landing = tmp_path / "landing"
    landing.mkdir()
    sent = [("ok1", "2026-11-01T01:30:00-08:00"), ("z1", "2026-11-01 01:30:00 PST"),
            ("z2", "2026-11-01 08:00:00 CST"), ("z3", "2026-11-01 01:30:00 America/Los_Angeles"),
            ("ok2", "2026-11-01 01:30:00 UTC"), ("ok3", "2026-11-01 09:00:00 GMT+08:00"),
            ("ok4", 1793500000), ("ok5", "2026-11-01T02:00:00.123456Z"),
            ("r1", "9999-12-31T23:30:00-01:00"), ("r2", 9223372036854775807),
            ("m1", None), ("z1", "2026-11-01T09:31:00Z")]  # the correct event after z1's refused line
    base = {"product_id": 1, "qty": 1, "price": "1.50", "day": "2026-11-01"}
    lines = [{"event_id": i, **base, "event_ts": t} for i, t in sent]
    # no time under the schema's (case-sensitive) name: was enriched with a null time
    lines += [{"event_id": "m2", **base, "Event_TS": "2026-11-01T09:00:00Z"},
              {"event_id": "m2", **base, "event_ts": "2026-11-01T09:32:00Z"}]
    # decimal(10,2), date and a second timestamp column: what Spark changed vs. what it holds
    t0 = "2026-11-01T10:00:00Z"
    other = {"d1": {"price": 1.234}, "d2": {"price": "1.235"}, "d3": {"price": 12.5},
             "d4": {"price": "7.10"}, "d5": {"day": "2026-11-01T10:00:00"},
             "d6": {"seen_at": "2026-11-01 01:30:00 PST"}, "d7": {"seen_at": 1793500000}}
    lines += [{"event_id": i, **base, "event_ts": t0, **v} for i, v in other.items()]
    # a column named twice (Spark's reader kept the last value) or only in another case (stored
    # null): each is the line's own text in the quarantine
    named = ['{"event_id": "n1", "product_id": 1, "qty": 1, "qty": 500, "price": "1.50", "event_ts": "%s"}' % t0,
             '{"event_id": "n2", "product_id": 1, "Qty": 9, "price": "1.50", "event_ts": "%s"}' % t0,
             '{"event_id": "n3", "product_id": 1, "qty": 1, "event_ts": "%s", "event_ts": "2026-11-05T10:00:00Z"}' % t0]
    (landing / "a.json").write_text("".join(json.dumps(e) + "\n" for e in lines) + "\n".join(named) + "\n")
    cfg = clicks_on_events(lake, EVENT_COLUMNS + ', price: "numeric(10, 2)", day: date, seen_at: timestamp')
    s = run_enrich(cfg, spark=spark, run_id="r1")
    utc = timezone.utc
    at = datetime(2026, 11, 1, 10, 0, tzinfo=utc)
    want = {"ok1": datetime(2026, 11, 1, 9, 30, tzinfo=utc), "ok2": datetime(2026, 11, 1, 1, 30, tzinfo=utc),
            "ok3": datetime(2026, 11, 1, 1, 0, tzinfo=utc),
            "ok4": datetime.fromtimestamp(1793500000, utc),
            "ok5": datetime(2026, 11, 1, 2, 0, 0, 123456, tzinfo=utc),
            "z1": datetime(2026, 11, 1, 9, 31, tzinfo=utc), "m2": datetime(2026, 11, 1, 9, 32, tzinfo=utc),
            "d3": at, "d4": at, "d7": at}
    got = {i: (t.replace(tzinfo=utc) if t is not None and t.tzinfo is None else t, price, str(day),
               seen if seen is None else seen.replace(tzinfo=utc))
           for i, t, price, day, seen in lake.rows("gold/clicks", "event_id", "event_ts", "price", "day", "seen_at")}
    prices = {"d3": Decimal("12.50"), "d4": Decimal("7.10")}
    assert got == {i: (t, prices.get(i, Decimal("1.50")), "2026-11-01",
                       datetime.fromtimestamp(1793500000, utc) if i == "d7" else None)
                   for i, t in want.items()}
    q = {json.loads(r)["event_id"]: (json.loads(r), why)
         for r, why in lake.rows("gold/_quarantine", "raw_line", "reason")}
    assert s["quarantined"] == len(q) == 14, q
    for i in ("z1", "z2", "z3"):
        assert "names a time zone" in q[i][1] and "+08:00" in q[i][1], q[i]
    for i in ("r1", "r2"):
        assert "is not an event time" in q[i][1], q[i]
    assert "event time event_ts is missing or null" in q["m1"][1], q["m1"]
    assert "field(s) Event_TS match a column of fact.events.schema only in another case" in q["m2"][1], q["m2"]
    raw = {json.loads(r)["event_id"]: r for r, _ in lake.rows("gold/_quarantine", "raw_line", "reason")}
    for i, field, why in (("n1", "qty", "more than once"), ("n2", "Qty", "only in another case"),
                          ("n3", "event_ts", "more than once")):
        assert q[i][1].startswith(f"field(s) {field} ") and why in q[i][1], q[i]
        assert raw[i] == named[int(i[1]) - 1], raw[i]
    assert 'column price "1.234" is not a decimal(10,2) value exactly' in q["d1"][1], q["d1"]
    assert 'column price "1.235" is not a decimal(10,2) value exactly' in q["d2"][1], q["d2"]
    assert 'column day "2026-11-01T10:00:00" is not a date' in q["d5"][1], q["d5"]
    assert 'column seen_at "2026-11-01 01:30:00 PST" names a time zone' in q["d6"][1], q["d6"]
    # raw_line: the schema's columns, the checked values as sent (as text)
    assert {i: q[i][0].get("event_ts") for i in q} == {
        **{i: None if t is None else str(t) for i, t in sent[1:4] + sent[8:11]}, "m2": None,
        **{i: t0 for i in ("d1", "d2", "d5", "d6")}, "n1": t0, "n2": t0, "n3": "2026-11-05T10:00:00Z"}
    assert (q["d1"][0]["price"], q["d2"][0]["price"], q["d5"][0]["day"]) == ("1.234", "1.235", "2026-11-01T10:00:00")
    assert lake.rows("gold/per_cat", "category", "units", "count") == [("fruit", 10, 10)]


def test_quarantined_event_line_with_invalid_utf8_keeps_the_table_readable(spark, tmp_path: Path) -> None:
    """A malformed line holding the byte \\xff was kept as it was in raw_line: the shared
    quarantine Delta table then failed to read in Arrow/pandas (UnicodeDecodeError; tester)."""
    from cdc_lake.enrich.job import run_enrich

    lake = Lake(tmp_path, spark)
    lake.create("products", products((1, "apple", "fruit")))
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.json").write_bytes(
        b'{"event_id": "e1", "product_id": 1, "qty": 1, "event_ts": "2026-01-02T10:00:00Z"}\n'
        b'{"event_id": "b\xff1", "product_id": 1, BROKEN\n')
    cfg = clicks_on_events(lake)
    s = run_enrich(cfg, spark=spark, run_id="r1")
    assert s["quarantined"] == 1
    (raw, reason), = lake.rows("gold/_quarantine", "raw_line", "reason")  # to_pylist: no error
    assert raw == '{"event_id": "b\ufffd1", "product_id": 1, BROKEN' and "malformed" in reason
    assert lake.rows("gold/clicks", "event_id") == [("e1",)]
