"""Column types fixed by an earlier batch (issue 6 item 2) and deletes with a bad non-key value
(item 8b).

* A value is never stored changed: a column is widened when that is lossless, otherwise the
  change is quarantined with a reason naming table, column, value and type.
* Types and values do not depend on where micro-batches split: the same history in two runs and
  in one run gives the same table.
* A delete needs only its key.

Expected values are written by hand from the history below, not computed by the job's code.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from deltalake import DeltaTable

from cdc_lake.cdc.job import run_pipeline
from cdc_lake.cdc.widening import widen
from cdc_lake.config import load_pipeline

YAML = """pipeline: {name}
source: {{format: maxwell, path: landing, database: shop}}
storage: {{root: lake}}
engine: {{name: deltalake}}
tables:
  orders: {{keys: [id]}}
  history: {{keys: [id], scd: 2, source_table: orders_h}}
  priced: {{keys: [id], types: {{price: "decimal(10,2)"}}}}
"""


def _ev(pos: int, typ: str, table: str = "orders", **data: object) -> str:
    # amounts are written as JSON number literals exactly as given (no float round trip)
    body = ", ".join(f'"{k}": {v if isinstance(v, str) and v[:1] in "0123456789-" else json.dumps(v)}'
                     for k, v in data.items())
    return (f'{{"database": "shop", "table": "{table}", "type": "{typ}", "ts": {1795000000 + pos}, '
            f'"xid": {pos}, "xoffset": 0, "position": "mysql-bin.000001:{1000 + pos}", "data": {{{body}}}}}')


def _both(pos: int, typ: str, **data: object) -> list[str]:
    """The change for the SCD1 table ``orders`` and the same change for the SCD2 ``history``."""
    return [_ev(pos, typ, **data), _ev(pos, typ, table="orders_h", **data)]


FIRST = [*_both(1, "insert", id=1, amt="10"), *_both(2, "insert", id=2, amt="20")]
SECOND = [*_both(3, "insert", id=3, amt="10.5"),          # fraction after an integer-only batch
          *_both(4, "update", id=1, amt="7.25"),
          *_both(5, "delete", id=2, amt="20")]


def _pipeline(tmp_path: Path, name: str):  # type: ignore[no-untyped-def]
    d = tmp_path / name
    (d / "landing").mkdir(parents=True)
    (d / "p.yaml").write_text(YAML.format(name=name), encoding="utf-8")
    return load_pipeline(d / "p.yaml")


def _land(cfg, file: str, lines: list[str]) -> None:  # type: ignore[no-untyped-def]
    (cfg.landing_path / file).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _table(path: Path) -> tuple[dict, dict]:  # type: ignore[type-arg]
    dt = DeltaTable(str(path))
    types = {f.name: f.type.type for f in dt.schema().fields if hasattr(f.type, "type")}
    return types, dt.to_pyarrow_table().to_pylist()


def _scd1(path: Path) -> tuple[dict, dict]:  # type: ignore[type-arg]
    types, rows = _table(path)
    return types, {r["id"]: r["amt"] for r in rows}


def _scd2(path: Path) -> list[tuple]:  # type: ignore[type-arg]
    _, rows = _table(path)
    return sorted((r["id"], r["_cdc_op"], r["amt"], r["_is_current"]) for r in rows)


def test_split_history_equals_one_batch_and_widens_instead_of_truncating(spark, tmp_path):
    split, whole = _pipeline(tmp_path, "split"), _pipeline(tmp_path, "whole")
    _land(split, "a.json", FIRST)
    assert run_pipeline(split, spark=spark, run_id="s1")["status"] == "succeeded"
    assert _scd1(split.tables["orders"].path)[0]["amt"] == "long"  # integers only so far
    _land(split, "b.json", SECOND)
    s2 = run_pipeline(split, spark=spark, run_id="s2")
    _land(whole, "ab.json", FIRST + SECOND)
    w = run_pipeline(whole, spark=spark, run_id="w1")

    assert s2["status"] == w["status"] == "succeeded"
    assert s2["quarantined"] == 0 and w["quarantined"] == 0
    s_types, s_rows = _scd1(split.tables["orders"].path)
    w_types, w_rows = _scd1(whole.tables["orders"].path)
    assert s_rows == w_rows == {1: Decimal("7.25"), 3: Decimal("10.5")}  # 2 deleted, 3 not "10"
    assert s_types["amt"] == w_types["amt"] == "decimal(38,10)"
    expected_history = [(1, "insert", Decimal("10"), False), (1, "update", Decimal("7.25"), True),
                        (2, "delete", Decimal("20"), False), (2, "insert", Decimal("20"), False),
                        (3, "insert", Decimal("10.5"), True)]
    assert _scd2(split.tables["history"].path) == _scd2(whole.tables["history"].path) == expected_history

    # Now the type is fixed at decimal(38,10): what it cannot hold exactly is quarantined. A
    # delete needs only its key: an uncastable non-key value does not stop it (item 8b); a
    # delete with a bad key is quarantined.
    _land(split, "c.json", [
        _ev(6, "insert", id=5, amt="0.123456789012345"),   # 15 decimals: no lossless widening
        *_both(7, "delete", id=3, amt="ten and a half"),   # uncastable non-key value
        _ev(8, "delete", id="x", amt="1"),                 # a delete with a bad key
        _ev(9, "insert", id="6.5", amt="1"),               # a key that is not an integer
        _ev(10, "insert", id=7, amt="2.5", table="priced", price="1.234")])  # configured type
    s3 = run_pipeline(split, spark=spark, run_id="s3")

    assert s3["status"] == "succeeded"
    assert _scd1(split.tables["orders"].path)[1] == {1: Decimal("7.25")}  # 3 deleted
    assert _scd2(split.tables["history"].path) == sorted(
        [*expected_history[:4], (3, "insert", Decimal("10.5"), False), (3, "delete", None, False)])
    priced = split.tables["priced"].path
    assert not DeltaTable.is_deltatable(str(priced)) or _table(priced)[1] == []
    q = DeltaTable(str(split.quarantine_path)).to_pyarrow_table().to_pylist()
    reasons = sorted(r["reason"] for r in q if r["run_id"] == "s3")
    assert len(reasons) == 4, reasons
    assert any("missing key column(s) ['id']" in r and 'column id: value "x" is not a valid bigint' in r
               for r in reasons), reasons
    assert any("table orders column amt: value 0.123456789012345 does not fit column type "
               "decimal(38,10) exactly" in r for r in reasons), reasons
    assert any("table orders column id: value 6.5 does not fit column type bigint exactly "
               "(would be stored as 6)" in r for r in reasons), reasons
    assert any("table priced column price: value 1.234 does not fit column type decimal(10,2) "
               "exactly (would be stored as 1.23)" in r for r in reasons), reasons


@pytest.mark.parametrize("existing, incoming, expected", [
    ("bigint", "decimal(38,10)", "decimal(38,10)"),   # the case
    ("int", "bigint", "bigint"),
    ("bigint", "int", None),                          # already wide enough
    ("int", "double", "double"),                      # 32-bit integers are exact doubles
    ("bigint", "double", None),                       # not exact above 2^53: values checked
    ("float", "double", "double"),
    ("int", "decimal(5,2)", "decimal(12,2)"),         # keeps int's 10 integer digits
    ("bigint", "decimal(38,20)", None),               # would need 40 digits
    ("decimal(10,2)", "decimal(12,4)", "decimal(12,4)"),
    ("decimal(10,2)", "decimal(5,4)", "decimal(12,4)"),
    ("decimal(38,10)", "decimal(38,15)", None),       # integer digits would shrink
    ("decimal(38,10)", "bigint", None),               # 28 integer digits hold any bigint
    ("decimal(10,2)", "bigint", "decimal(22,2)"),
    ("decimal(38,10)", "double", None),
    ("string", "bigint", None),
    ("bigint", "string", None),
])
def test_widening_rule(existing, incoming, expected):
    assert widen(existing, incoming) == expected


def test_engine_widen_keeps_values_and_changes_the_type(spark, tmp_path, engine_name):
    from cdc_lake.engines import Txn, select_engine

    engine = select_engine(spark, engine_name)
    path = str(tmp_path / "t")
    df = spark.createDataFrame([(1, 9_223_372_036_854_775_807), (2, -5)], "id bigint, amt bigint")
    engine.append(path, df, txn=Txn("t", 0))
    engine.widen(path, {"amt": "decimal(38,10)"})
    assert engine.schema(path)["amt"].dataType.simpleString() == "decimal(38,10)"  # type: ignore[index]
    got = {r.id: r.amt for r in engine.read(path).collect()}  # type: ignore[union-attr]
    assert got == {1: Decimal(9_223_372_036_854_775_807), 2: Decimal(-5)}
    # change-feed readers (enrichment) follow the table across the widening: same rows, no changes
    from cdc_lake.sources.change_feed import check_versions

    check_versions(path, 0, DeltaTable(path).version())
