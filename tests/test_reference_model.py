"""Fast (no Spark) checks of the demo generator and of the independent reference model.

The reference model, fed the generator's landing lines, must rebuild exactly the generator's
true final database state, whatever the file order, duplicates or format options; the generator
must be deterministic, resumable, and produce every scenario the property tests rely on.
"""

from __future__ import annotations

import json
import random
import sys
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference_model import (  # noqa: E402
    RefConfig,
    ReferenceModel,
    assert_no_diff,
    cast,
    diff_scd2,
    diff_table,
    quarantine_entries,
    sortable_seq,
    values_equal,
)

from cdc_lake.demo import GeneratorError, generate, history_lines, pipeline_config  # noqa: E402
from cdc_lake.demo.__main__ import main as demo_main  # noqa: E402
from cdc_lake.demo.generator import GeneratorOptions  # noqa: E402
from cdc_lake.demo.writers import make_writer  # noqa: E402

TABLES = ("customers", "products", "orders", "order_items")
KEYS = {"customers": ("id",), "products": ("id",), "orders": ("id",),
        "order_items": ("order_id", "line_no")}

VARIANTS = [
    pytest.param("debezium", {"debezium_schema": True}, id="debezium-schema"),
    pytest.param("debezium", {"debezium_schema": False}, id="debezium-plain"),
    pytest.param("debezium", {"debezium_schema": True, "debezium_tombstones": False},
                 id="debezium-no-tombstones"),
    pytest.param("maxwell", {}, id="maxwell"),
    pytest.param("maxwell", {"maxwell_position": False}, id="maxwell-no-position"),
    pytest.param("maxwell", {"maxwell_position": False, "maxwell_commit_xoffset": False},
                 id="maxwell-real-xoffset"),
    pytest.param("canal", {}, id="canal"),
]


def ref_config(fmt: str, options: dict, **kwargs) -> RefConfig:
    cfg = pipeline_config(fmt, landing="/landing", lake_root="/lake",
                          debezium_schema=options.get("debezium_schema", True), **kwargs)
    return RefConfig.from_mapping(cfg)


def model_for(fmt: str, options: dict, files: list[tuple[str, list[str]]], **kw) -> ReferenceModel:
    model = ReferenceModel(ref_config(fmt, options, **kw))
    for name, lines in files:
        model.add_lines(name, lines)
    return model


def split(lines: list[str], rng: random.Random, n_files: int) -> list[tuple[str, list[str]]]:
    cuts = sorted(rng.sample(range(1, len(lines)), n_files - 1))
    bounds = [0, *cuts, len(lines)]
    return [(f"f-{i:06d}.json", lines[a:b]) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def assert_matches_truth(model: ReferenceModel, truth: dict) -> None:
    diff: list[str] = []
    for t in TABLES:
        diff += diff_table(model.scd1(t), list(truth[t].values()), KEYS[t], table=t)
    assert_no_diff(diff)


@pytest.fixture(scope="module")
def histories() -> dict:
    out = {}
    for p in VARIANTS:
        fmt, options = p.values
        out[p.id] = history_lines(fmt, days=3, seed=11, txns_per_day=40, **options)
    return out


# --------------------------------------------------------------------------- reference vs truth

@pytest.mark.parametrize(("fmt", "options"), VARIANTS)
def test_reference_rebuilds_true_state(fmt, options, histories, request):
    lines, sim = histories[request.node.callspec.id]
    model = model_for(fmt, options, [("all.json", lines)])
    assert not model.quarantine
    assert_matches_truth(model, sim.rows)
    assert sum(len(sim.rows[t]) for t in TABLES) > 30


@pytest.mark.parametrize(("fmt", "options"), VARIANTS)
def test_reference_ignores_file_order_and_duplicates(fmt, options, histories, request):
    lines, sim = histories[request.node.callspec.id]
    rng = random.Random(5)
    files = split(lines, rng, 12)
    files += [(f"dup-{name}", body) for name, body in rng.sample(files, 4)]  # duplicated files
    files = [(n, body + rng.sample(body, min(3, len(body)))) for n, body in files]  # dup lines
    rng.shuffle(files)
    model = model_for(fmt, options, files)
    assert_matches_truth(model, sim.rows)


@pytest.mark.parametrize("fmt", ["maxwell", "canal", "debezium"])
def test_reference_matches_truth_after_every_day(fmt):
    opts = GeneratorOptions(fmt=fmt, seed=3, txns_per_day=30)
    sim = opts.new_simulation()
    writer = make_writer(fmt, **opts.writer_options())
    model = ReferenceModel(ref_config(fmt, {}))
    for day in range(3):
        lines = [ln for e in sim.simulate_day() for ln in writer.lines(e)]
        model.add_lines(f"day-{day}.json", lines)
        assert_matches_truth(model, sim.rows)


@pytest.mark.parametrize("fmt", ["maxwell", "canal"])
def test_reference_types_without_config_types(fmt, histories):
    """Maxwell values typed by JSON kind + temporal inference, Canal by mysqlType."""
    lines, sim = histories[fmt]
    raw = pipeline_config(fmt, landing="/l", lake_root="/k")
    for t in raw["tables"].values():
        t.pop("types", None)
    model = ReferenceModel(RefConfig.from_mapping(raw))
    model.add_lines("all.json", lines)
    assert_matches_truth(model, sim.rows)


@pytest.mark.parametrize(("fmt", "options"), VARIANTS)
def test_scd2_versions_agree_with_scd1(fmt, options, histories, request):
    lines, _ = histories[request.node.callspec.id]
    model = model_for(fmt, options, [("all.json", lines)])
    for t in TABLES:
        versions = model.scd2(t)
        current = {v["_ref_key"]: v for v in versions if v["_is_current"]}
        live = model.scd1(t)
        assert set(current) == set(live)
        for k, row in live.items():
            assert all(values_equal(row[c], current[k].get(c)) for c in row if c != "_cdc_op")
        assert not set(model.deleted_keys(t)) & set(live)
        # the versions of a key never overlap: each one ends where the next begins
        by_key: dict = {}
        for v in versions:
            by_key.setdefault(v["_ref_key"], []).append(v)
        for vs in by_key.values():
            for a, b in zip(vs, vs[1:]):
                if a["_cdc_op"] != "delete":
                    assert a["_valid_to"] == b["_valid_from"]
        assert not diff_scd2(versions, [{**v, "_cdc_seq": sortable_seq(v["_ref_seq"])}
                                        for v in versions], KEYS[t])  # self-consistency
    # deletes and re-inserts happened, so some keys have a delete version then a new one
    assert any(v["_cdc_op"] == "delete" for t in TABLES for v in model.scd2(t))


# --------------------------------------------------------------------------- reference details

def test_reference_quarantine_reasons():
    good = ('{"database":"shop","table":"orders","type":"insert","ts":1767600000,"xid":1,'
            '"xoffset":0,"position":"mysql-bin.000001:100","data":{"id":1,"amount":1.50}}')
    lines = [
        good,
        "{not json",
        "[1, 2]",
        good.replace('"orders"', '"audit_log"'),
        good.replace('"id":1,', ""),
        good.replace('"insert"', '"upsert"'),
        good.replace("1.50", '"one fifty"'),
        "",
    ]
    raw = {"source": {"format": "maxwell", "database": "shop"},
           "tables": {"orders": {"keys": ["id"], "types": {"amount": "decimal(10,2)"}}}}
    model = ReferenceModel(RefConfig.from_mapping(raw))
    model.add_lines("/x/maxwell-000001.json", lines)
    reasons = [q.reason.split(":")[0] for q in model.quarantine]
    assert reasons == ["malformed", "malformed", "unknown_table", "missing_key", "unknown_op",
                       "cast"]
    assert model.scd1("orders") == {(1,): {"id": 1, "amount": Decimal("1.50"), "_cdc_op": "insert",
                                           "_cdc_commit_ts": datetime.fromtimestamp(1767600000, UTC)}}
    assert ("maxwell-000001.json", "{not json") in quarantine_entries(model)


def test_reference_orders_by_binlog_not_by_file_or_ts():
    """Maxwell: a newer binlog file wins over a larger offset; a late older event loses."""
    def ev(pos: str, ts: int, status: str, typ: str = "update") -> str:
        return json.dumps({"database": "shop", "table": "orders", "type": typ, "ts": ts, "xid": 1,
                           "xoffset": 0, "position": pos, "data": {"id": 7, "status": status}})
    raw = {"source": {"format": "maxwell", "database": "shop"},
           "tables": {"orders": {"keys": ["id"]}}}
    model = ReferenceModel(RefConfig.from_mapping(raw))
    model.add_lines("b.json", [ev("mysql-bin.000002:200", 50, "shipped")])
    model.add_lines("a.json", [ev("mysql-bin.000001:90000", 60, "paid")])  # older, arrives late
    assert model.scd1("orders")[(7,)]["status"] == "shipped"
    model.add_lines("c.json", [ev("mysql-bin.000010:4", 10, "gone", "delete")])
    model.add_lines("d.json", [ev("mysql-bin.000009:99999", 99, "zombie", "insert")])  # late
    assert model.scd1("orders") == {}
    assert model.deleted_keys("orders") == {(7,)}


def test_cast_rules():
    assert cast("12", "int") == 12
    assert cast(Decimal("19.9"), "decimal(10,2)") == Decimal("19.90")
    assert cast("2026-01-05 06:10:09", "timestamp") == datetime(2026, 1, 5, 6, 10, 9, tzinfo=UTC)
    assert cast(-1, "date") == date(1969, 12, 31)
    assert cast(1767593409000, "timestamp") == datetime(2026, 1, 5, 6, 10, 9, tzinfo=UTC)
    for v, t in [("x", "int"), ("1.5", "int"), ("abc", "decimal(10,2)"),
                 ("123456789.00", "decimal(10,2)"), ("2026-13-01", "date"), (2**40, "int")]:
        with pytest.raises(Exception, match="cast"):
            cast(v, t)
    assert values_equal(Decimal("1.50"), Decimal("1.5000000000"))
    assert not values_equal(date(2020, 1, 1), "2020-01-01")
    assert not values_equal(date(2020, 1, 1), datetime(2020, 1, 1))
    assert values_equal(datetime(2020, 1, 1, tzinfo=UTC), datetime(2020, 1, 1))
    assert not values_equal(1, True)


# --------------------------------------------------------------------------- generator

def test_generator_is_deterministic_and_seed_sensitive():
    a, _ = history_lines("canal", days=2, seed=1, txns_per_day=25)
    b, _ = history_lines("canal", days=2, seed=1, txns_per_day=25)
    c, _ = history_lines("canal", days=2, seed=2, txns_per_day=25)
    assert a == b
    assert a != c


def test_generator_covers_every_scenario(histories):
    lines, sim = histories["maxwell"]
    events = [json.loads(ln, parse_float=Decimal) for ln in lines]
    rows = [e for e in events if e["type"] in ("insert", "update", "delete")]
    by = {t: [e for e in rows if e["table"] == t] for t in TABLES}
    # primary-key changes: one update whose `old` holds the old key
    assert any("id" in e.get("old", {}) for e in by["products"] + by["customers"])
    assert any("line_no" in e.get("old", {}) for e in by["order_items"])
    # re-insert of a deleted key
    deleted = {e["data"]["id"] for e in by["customers"] if e["type"] == "delete"}
    assert any(e["type"] == "insert" and e["data"]["id"] in deleted
               and events.index(e) > min(events.index(d) for d in by["customers"]
                                         if d["type"] == "delete" and d["data"]["id"] == e["data"]["id"])
               for e in by["customers"])
    # delete + insert of the same key in one transaction
    assert any(e1["xid"] == e2["xid"] and e1["type"] == "delete" and e2["type"] == "insert"
               and (e1["data"]["order_id"], e1["data"]["line_no"]) ==
               (e2["data"]["order_id"], e2["data"]["line_no"])
               for e1 in by["order_items"] for e2 in by["order_items"])
    # multi-row statements (several rows at one position), multi-statement transactions
    positions = [e["position"] for e in rows]
    assert len(positions) > len(set(positions))
    assert len({e["xid"] for e in rows}) < len(rows)
    # NULLs, unicode, emoji, negative decimals, pre-epoch dates, bigint ids
    assert any(e["data"].get("city") is None for e in by["customers"])
    text = "\n".join(lines)
    assert "Zoë" in text and "東京" in text and ("📦" in text or "🎁" in text)
    assert any(e["data"]["unit_price"] < 0 for e in by["order_items"])
    assert any(e["data"]["id"] > 2**31 for e in by["orders"])
    # schema change: DDL recorded mid-stream, rows before it lack the column, after have it
    ddl = [i for i, e in enumerate(events) if e["type"] == "table-alter" and
           e["table"] == "customers"]
    assert len(ddl) == 1
    cust = [(i, e) for i, e in enumerate(events) if e.get("table") == "customers"
            and e["type"] in ("insert", "update", "delete")]
    assert all("loyalty_tier" not in e["data"] for i, e in cust if i < ddl[0])
    assert all("loyalty_tier" in e["data"] for i, e in cust if i > ddl[0])
    assert any(e["data"]["loyalty_tier"] for i, e in cust if i > ddl[0])
    assert sum(e["type"].startswith("table-") for e in events) >= 6  # creates + 2 alters
    # binlog rotation: later files restart at small positions
    files = {e["position"].split(":")[0] for e in rows}
    assert len(files) >= 3


def test_debezium_encodings():
    lines, _ = history_lines("debezium", days=1, seed=11, txns_per_day=25)
    docs = [json.loads(ln) for ln in lines if ln != "null"]
    voucher = next(d for d in docs if d["payload"]["after"] and
                   d["payload"]["after"].get("sku") == "VOUCHER-5")
    assert voucher["payload"]["after"]["price"] == "/gw="  # -500 as two's complement 0xFE0C
    fields = {f["field"]: f for f in voucher["schema"]["fields"][1]["fields"]}
    assert fields["price"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert fields["price"]["parameters"]["scale"] == "2"
    assert fields["created_at"]["name"] == "io.debezium.time.Timestamp"
    # a PK change is a delete of the old key then a create of the new key, same coordinates
    pairs = [(a, b) for a, b in zip(docs, docs[1:]) if a["payload"]["op"] == "d" and
             b["payload"]["op"] == "c" and a["payload"]["source"]["pos"] ==
             b["payload"]["source"]["pos"] and a["payload"]["source"]["row"] ==
             b["payload"]["source"]["row"]]
    assert pairs
    assert lines.count("null") == sum(d["payload"]["op"] == "d" for d in docs)
    plain, _ = history_lines("debezium", days=1, seed=11, txns_per_day=25, debezium_schema=False)
    doc = json.loads(next(ln for ln in plain if '"VOUCHER-5"' in ln))
    assert doc["after"]["price"] == "-5.00"
    assert doc["after"]["created_at"].count(":") == 2 and "T" not in doc["after"]["created_at"]


def test_canal_messages():
    lines, _ = history_lines("canal", days=2, seed=11, txns_per_day=30)
    docs = [json.loads(ln) for ln in lines]
    assert all(all(v is None or isinstance(v, str) for r in d["data"] or [] for v in r.values())
               for d in docs)
    assert [d["id"] for d in docs] == sorted(d["id"] for d in docs)
    assert any(len(d["data"] or []) > 1 for d in docs)
    assert any(d["isDdl"] and d["type"] == "ALTER" for d in docs)
    es = [d["es"] for d in docs]
    assert es == sorted(es)


def test_generate_resume_equals_one_shot(tmp_path):
    one = generate(tmp_path / "one", "maxwell", days=3, seed=5, txns_per_day=30,
                   lines_per_file=50)
    generate(tmp_path / "two", "maxwell", days=2, seed=5, txns_per_day=30, lines_per_file=50)
    second = generate(tmp_path / "two", "maxwell", days=1, start_day=2)
    assert second.first_day == 2 and second.next_day == 3
    names_one = sorted(p.name for p in one.files)
    names_two = sorted(p.name for p in (tmp_path / "two").glob("maxwell-*.json"))
    assert names_one == names_two
    assert all(second_file.name in names_one for second_file in second.files)
    assert min(p.name for p in second.files) > max(
        p.name for p in (tmp_path / "two").glob("maxwell-*.json") if p not in second.files)
    for n in names_one:
        assert (tmp_path / "one" / n).read_bytes() == (tmp_path / "two" / n).read_bytes()
    assert not list(tmp_path.rglob("*.tmp"))


def test_generate_refuses_mismatched_resume(tmp_path):
    generate(tmp_path, "canal", days=1, seed=5, txns_per_day=20)
    with pytest.raises(GeneratorError, match="--start-day 1"):
        generate(tmp_path, "canal", days=1)
    with pytest.raises(GeneratorError, match="--start-day 1"):
        generate(tmp_path, "canal", days=1, start_day=3)
    with pytest.raises(GeneratorError, match="seed"):
        generate(tmp_path, "canal", days=1, seed=6, start_day=1)
    with pytest.raises(GeneratorError, match="fmt"):
        generate(tmp_path, "maxwell", days=1, start_day=1)
    with pytest.raises(GeneratorError, match="no generator state"):
        generate(tmp_path / "new", "canal", days=1, start_day=2)


def test_cli_two_runs_and_pipeline_yaml(tmp_path, capsys):
    out = tmp_path / "landing"
    assert demo_main(["--format", "debezium", "--out", str(out), "--days", "1", "--seed", "7",
                      "--txns-per-day", "20", "--no-debezium-schema",
                      "--write-pipeline", str(tmp_path / "p.yaml"),
                      "--lake-root", str(tmp_path / "lake")]) == 0
    first = set(out.glob("*.json"))
    assert demo_main(["--format", "debezium", "--out", str(out), "--days", "1",
                      "--start-day", "1"]) == 0
    assert set(out.glob("*.json")) > first
    assert demo_main(["--format", "debezium", "--out", str(out), "--days", "1"]) == 2
    assert "--start-day 2" in capsys.readouterr().err

    from cdc_lake.config import load_pipeline

    cfg = load_pipeline(tmp_path / "p.yaml")
    assert cfg.source_format == "debezium"
    assert cfg.landing_path == out.resolve()
    assert cfg.tables["order_items"].keys == ("order_id", "line_no")
    assert cfg.tables["orders"].types["amount"] == "decimal(10,2)"
    assert cfg.tables["customers"].types["birth_date"] == "date"


@pytest.mark.parametrize("fmt", ["maxwell", "canal", "debezium"])
def test_pipeline_yaml_is_valid_config(tmp_path, fmt):
    from cdc_lake.config import load_pipeline
    from cdc_lake.demo import write_pipeline_yaml

    path = write_pipeline_yaml(tmp_path / "p.yaml", fmt, landing=tmp_path / "l",
                               lake_root=tmp_path / "k", scd={"orders": 2})
    cfg = load_pipeline(path)
    assert set(cfg.tables) == set(TABLES)
    assert cfg.tables["orders"].scd == 2
    assert bool(cfg.tables["products"].types) == (fmt == "maxwell")
