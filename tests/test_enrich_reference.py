"""The enrichment reference model (tests/enrich_reference.py) on small hand-computed stories.

Pure Python, no Spark: every expected row below is worked out by hand from the spec
(/work/team/ENRICH_SPEC.md, docs/enrichment.md), so the model that judges the job is itself
checked against something other than its own code.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

from enrich_reference import Commit, EnrichModel
from enrich_workload import AGG, MERGE_ON, model_config


def ts(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 1, day, hour, tzinfo=UTC)


def c(table: str, upserts=(), deletes=(), create=False) -> Commit:  # type: ignore[no-untyped-def]
    return Commit(table, MERGE_ON[table], tuple(upserts), tuple(deletes), create)


def item(o: int, n: int, p: int, qty: int, price: int) -> dict:
    return {"order_id": o, "line_no": n, "product_id": p, "qty": qty, "unit_price": price}


def base(wait_zero: bool = True, **kw) -> EnrichModel:  # type: ignore[no-untyped-def]
    m = EnrichModel(model_config(wait_zero=wait_zero, **kw))
    m.apply(c("orders", [{"id": 1, "status": "new", "customer_id": 7, "created_at": ts(2, 10)},
                         {"id": 2, "status": "paid", "customer_id": 8, "created_at": ts(3, 5)}], create=True))
    m.apply(c("products", [{"id": 10, "name": "widget"}, {"id": 11, "name": "gadget"}], create=True))
    m.apply(c("categories", [{"product_id": 10, "category": "A"}, {"product_id": 11, "category": "B"}],
              create=True))
    m.apply(c("customers", [
        {"id": 7, "city": "Oslo", "_valid_from": ts(1), "_valid_to": ts(2, 10), "_is_current": False},
        {"id": 7, "city": "Lyon", "_valid_from": ts(2, 10), "_valid_to": None, "_is_current": True},
        {"id": 8, "city": "Kyiv", "_valid_from": ts(4), "_valid_to": None, "_is_current": True}],
        create=True))
    return m


def agg(m: EnrichModel) -> dict:
    return {(r["category"], r["day"]): (r["count"], r["revenue"], r["units"]) for r in m.aggregate(AGG)}


def test_join_scd1_and_scd2_as_of_with_exclusive_valid_to():
    m = base()
    m.apply(c("order_items", [item(1, 1, 10, 2, 5), item(1, 2, 11, 1, 7)], create=True))
    m.run()
    e = m.enriched[(1, 1)]
    # order 1 at 2026-01-02 10:00 == first version's _valid_to (exclusive) -> second version
    assert (e["order_status"], e["customer_id"], e["order_time"], e["product_name"], e["category"],
            e["customer_city"], e["_unknown_members"], e["_fact_version"]) == \
        ("new", 7, ts(2, 10), "widget", "A", "Lyon", [], 0)
    assert agg(m) == {("A", date(2026, 1, 2)): (1, 10, 2), ("B", date(2026, 1, 2)): (1, 7, 1)}
    assert m.pending == {}
    assert m.batches[0].dimension_versions == {"orders": 0, "products": 0, "categories": 0, "customers": 0}


def test_fact_before_first_scd2_version_is_parked_then_released_unknown_then_restated():
    m = base(wait_zero=True)
    # order 2 (2026-01-03 05:00) belongs to customer 8 whose first version starts 2026-01-04
    m.apply(c("order_items", [item(2, 1, 10, 3, 4)], create=True))
    m.run()
    assert m.enriched == {}
    p = m.pending_rows()
    assert p == [{**item(2, 1, 10, 3, 4), "_missing": ["customers"], "_fact_version": 0}]
    assert agg(m) == {}                                   # parked facts are not counted
    m.apply(c("order_items", [item(1, 1, 11, 1, 1)]))     # v1: a batch happens
    m.run()
    e = m.enriched[(2, 1)]
    assert (e["customer_city"], e["category"], e["_unknown_members"], e["_fact_version"]) == \
        (None, "A", ["customers"], 0)
    assert m.pending == {}
    assert agg(m) == {("A", date(2026, 1, 3)): (1, 12, 3), ("B", date(2026, 1, 2)): (1, 1, 1)}
    # the member's history is slotted in before its first version: restated at the next batch
    m.apply(c("customers", [{"id": 8, "city": "Porto", "_valid_from": ts(2), "_valid_to": ts(4),
                             "_is_current": False}]))
    m.apply(c("categories", [{"product_id": 10, "category": "C"}]))   # SCD1 change before restating
    m.apply(c("order_items", [item(1, 2, 11, 1, 1)]))     # v2
    cnt = m.run()
    e = m.enriched[(2, 1)]
    assert (e["customer_city"], e["category"], e["_unknown_members"], e["_fact_version"]) == \
        ("Porto", "C", [], 0)                             # full re-join with today's dims
    assert cnt.restated == 1
    assert agg(m) == {("C", date(2026, 1, 3)): (1, 12, 3), ("B", date(2026, 1, 2)): (2, 2, 2)}
    assert m.batches[2].dimension_versions == {"orders": 0, "products": 0, "categories": 1, "customers": 1}


def test_runs_without_fact_versions_release_by_wait_and_restate_by_member():
    m = base(wait_zero=True)
    m.apply(c("order_items", [item(2, 1, 10, 3, 4)], create=True))  # customer 8 starts 2026-01-04
    m.run()
    assert set(m.pending) == {(2, 1)} and not m.passes    # parked by this run: not released by it
    cnt = m.run()                                         # no fact version: the wait ran out
    assert cnt.released_unknown == 1 and m.pending == {} and len(m.passes) == 1
    assert m.enriched[(2, 1)]["_unknown_members"] == ["customers"]
    assert m.run() == type(cnt)() and len(m.passes) == 1  # nothing changed: no pass
    m.apply(c("customers", [{"id": 8, "city": "Porto", "_valid_from": ts(2), "_valid_to": ts(4),
                             "_is_current": False}]))
    assert m.run().restated == 1 and len(m.passes) == 2 and len(m.batches) == 1
    assert m.enriched[(2, 1)]["customer_city"] == "Porto"


def test_long_wait_keeps_parked_until_member_arrives_and_missing_orders_cascade():
    m = base(wait_zero=False)
    m.apply(c("order_items", [item(3, 1, 10, 1, 9)], create=True))   # order 3 does not exist
    m.run()
    assert m.pending_rows() == [{**item(3, 1, 10, 1, 9), "_missing": ["orders", "customers"],
                                 "_fact_version": 0}]
    m.apply(c("order_items", [item(1, 1, 10, 1, 1)]))
    m.run()
    assert set(m.pending) == {(3, 1)} and set(m.enriched) == {(1, 1)}   # no release without wait
    assert m.run().released == 0 and not m.passes         # nothing changed: no pass
    m.apply(c("orders", [{"id": 3, "status": "new", "customer_id": 7, "created_at": ts(1, 12)}]))
    batches = len(m.batches)
    cnt = m.run()                                         # no fact version: a re-join pass
    assert cnt.released == 1 and m.pending == {} and len(m.batches) == batches and len(m.passes) == 1
    m.apply(c("order_items", [item(1, 2, 10, 1, 1)]))
    assert m.run().upserted == 1 and len(m.passes) == 1
    e = m.enriched[(3, 1)]
    assert (e["customer_city"], e["_fact_version"], e["_unknown_members"]) == ("Oslo", 0, [])
    assert agg(m) == {("A", date(2026, 1, 1)): (1, 9, 1), ("A", date(2026, 1, 2)): (2, 2, 2)}


def test_update_moves_group_withdrawing_what_was_counted_then_delete_empties_group():
    m = base()
    m.apply(c("order_items", [item(1, 1, 10, 2, 5)], create=True))
    m.run()
    # the product's category changes later: the enriched row keeps "A" (point in time) ...
    m.apply(c("categories", [{"product_id": 10, "category": "B"}]))
    m.apply(c("products", [{"id": 10, "name": "renamed"}]))
    m.apply(c("order_items", [item(2, 1, 11, 1, 1)]))
    m.run()
    assert (m.enriched[(1, 1)]["category"], m.enriched[(1, 1)]["product_name"]) == ("A", "widget")
    # ... and an update of the fact withdraws the "A" contribution it made, adds to the new group
    m.apply(c("order_items", [item(1, 1, 11, 4, 5)]))
    m.run()
    e = m.enriched[(1, 1)]
    assert (e["category"], e["product_name"], e["_fact_version"]) == ("B", "gadget", 2)
    d1 = date(2026, 1, 2)
    assert agg(m) == {("B", d1): (1, 20, 4), ("B", date(2026, 1, 3)): (1, 1, 1)}
    m.apply(c("order_items", deletes=[item(1, 1, 11, 4, 5)]))
    m.run()
    assert (1, 1) not in m.enriched
    assert agg(m) == {("B", date(2026, 1, 3)): (1, 1, 1)}   # count 0 -> group gone


def test_update_to_missing_member_moves_fact_from_enriched_to_pending_and_delete_clears_pending():
    m = base(wait_zero=False)
    m.apply(c("order_items", [item(1, 1, 10, 2, 5)], create=True))
    m.run()
    m.apply(c("order_items", [item(1, 1, 99, 2, 5)]))     # product 99 exists nowhere
    m.run()
    assert m.enriched == {} and agg(m) == {}
    assert m.pending_rows() == [{**item(1, 1, 99, 2, 5), "_missing": ["products", "categories"],
                                 "_fact_version": 1}]
    m.apply(c("order_items", deletes=[item(1, 1, 99, 2, 5)]))
    m.run()
    assert m.pending == {} and m.enriched == {}


def test_several_versions_per_batch_latest_change_wins():
    m = base(max_versions_per_trigger=3)
    m.apply(c("order_items", [item(1, 1, 10, 2, 5)], create=True))
    m.apply(c("order_items", [item(1, 1, 11, 3, 5)]))
    m.apply(c("order_items", deletes=[item(1, 1, 11, 3, 5)]))
    m.apply(c("order_items", [item(1, 1, 10, 1, 1)]))     # re-insert after delete
    m.run()
    assert [b.fact_versions for b in m.batches] == [(0, 1, 2), (3,)]
    assert m.enriched[(1, 1)]["_fact_version"] == 3
    assert agg(m) == {("A", date(2026, 1, 2)): (1, 1, 1)}
