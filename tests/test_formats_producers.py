"""Format parsers on producer-shaped input (issue 6 items 3, 4, 7, 11, 12, 13, 14 + type rules).

Every test runs the real job (``cdc_lake.cdc.job.run_pipeline``: Spark Structured Streaming +
delta-rs) on small landing files and compares the Delta tables with rows stated by hand.
Fixtures in ``tests/fixtures/formats/`` are written from the public format documentation
(see ``make_fixtures.py`` there); ordering stories are written inline.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from cdc_lake.cdc.job import run_pipeline
from cdc_lake.config import load_pipeline

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "formats"


def _pipeline(tmp_path: Path, fmt: str, *, scd: int = 1, database: str = "inventory",
              name: str = "fmt", keys: bool = True):  # type: ignore[no-untyped-def]
    (tmp_path / "landing").mkdir(parents=True, exist_ok=True)
    key_line = "keys: [id], " if keys else ""
    (tmp_path / "p.yaml").write_text(
        f"pipeline: {name}\n"
        f"source: {{format: {fmt}, path: landing, database: {database}}}\n"
        "storage: {root: lake}\n"
        "engine: {name: deltalake}\n"
        "tables:\n"
        f"  products: {{{key_line}scd: {scd}}}\n", encoding="utf-8")
    return load_pipeline(tmp_path / "p.yaml")


def _land(cfg, name: str, lines: list[Any] | str) -> Path:  # type: ignore[no-untyped-def]
    text = lines if isinstance(lines, str) else "".join(
        (x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    tmp = cfg.landing_path / f".{name}.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.rename(cfg.landing_path / name)
    return cfg.landing_path / name


def _table(cfg) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    return DeltaTable(str(cfg.tables["products"].path)).to_pyarrow_table().to_pylist()


def _by_id(cfg) -> dict[Any, dict[str, Any]]:  # type: ignore[no-untyped-def]
    return {r["id"]: r for r in _table(cfg)}


def _quarantine(cfg) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    if not (cfg.quarantine_path / "_delta_log").is_dir():
        return []
    return DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().to_pylist()


def _schema(cfg) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Arrow type names of the table's columns (large_string shown as string)."""
    schema = DeltaTable(str(cfg.tables["products"].path)).to_pyarrow_table().schema
    return {f.name: str(f.type).replace("large_string", "string") for f in schema}


def _versions(cfg) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
    """SCD2 rows as (id, weight, op, is_current) in version order."""
    rows = sorted(_table(cfg), key=lambda r: (r["id"], r["_cdc_seq"]))
    return [(r["id"], r["weight"], r["_cdc_op"], r["_is_current"]) for r in rows]


# ------------------------------------------------------------------ Canal (items 3, 11)

CANAL_SCD1 = {  # id -> (weight, op) after canal_products.json
    101: (5.18, "update"), 102: (8.2, "update"), 103: (0.9, "update"), 105: (0.2, "insert")}
CANAL_SCD2 = [  # (id, weight, op, is_current) per version, in binlog order
    (101, 3.14, "snapshot", False), (101, 5.17, "update", False), (101, 5.18, "update", True),
    (102, 8.1, "snapshot", False), (102, 8.2, "update", True),
    (103, 0.8, "snapshot", False), (103, 0.9, "update", True),
    (104, 0.75, "snapshot", False), (104, 0.75, "delete", False),
    (105, 0.2, "insert", True)]


def test_canal_init_and_same_batch_updates_scd1_redelivery(spark, tmp_path):
    """INIT rows load as snapshot rows (item 11); two UPDATEs of one key sharing ``es`` and
    ``id`` apply in file order (item 3); a re-delivered copy of the file changes nothing."""
    cfg = _pipeline(tmp_path, "canal", name="canal_scd1")
    shutil.copy(FIXTURES / "canal_products.json", cfg.landing_path / "001.json")
    s = run_pipeline(cfg, spark=spark, run_id="r1")
    assert s["status"] == "succeeded"
    assert _quarantine(cfg) == []
    got = _by_id(cfg)
    assert {i: (r["weight"], r["_cdc_op"]) for i, r in got.items()} == CANAL_SCD1
    assert _schema(cfg)["id"] == "int64"  # type rule: every MySQL integer type -> bigint
    assert _schema(cfg)["weight"] == "double"  # mysqlType float -> double
    before = sorted(_table(cfg), key=lambda r: r["id"])
    version = DeltaTable(str(cfg.tables["products"].path)).version()

    shutil.copy(FIXTURES / "canal_products.json", cfg.landing_path / "002.json")  # re-delivery
    run_pipeline(cfg, spark=spark, run_id="r2")
    after = sorted(_table(cfg), key=lambda r: r["id"])
    strip = lambda rows: [{k: v for k, v in r.items() if k != "_cdc_run_id"} for r in rows]  # noqa: E731
    assert strip(after) == strip(before)
    assert DeltaTable(str(cfg.tables["products"].path)).version() <= version + 1


def test_canal_scd2_versions_in_file_order_and_redelivery_adds_none(spark, tmp_path):
    cfg = _pipeline(tmp_path, "canal", scd=2, name="canal_scd2")
    shutil.copy(FIXTURES / "canal_products.json", cfg.landing_path / "001.json")
    run_pipeline(cfg, spark=spark, run_id="r1")
    assert _versions(cfg) == CANAL_SCD2
    # the same transaction's changes of 101: validity chains in file order
    v101 = sorted((r for r in _table(cfg) if r["id"] == 101), key=lambda r: r["_cdc_seq"])
    assert [r["weight"] for r in v101] == [3.14, 5.17, 5.18]
    assert v101[1]["_valid_to"] == v101[2]["_valid_from"]

    shutil.copy(FIXTURES / "canal_products.json", cfg.landing_path / "002.json")  # re-delivery
    lines = (FIXTURES / "canal_products.json").read_text().splitlines()
    _land(cfg, "003.json", lines[4:6])  # and a partial re-delivery: both 101 updates again
    run_pipeline(cfg, spark=spark, run_id="r2")
    assert _versions(cfg) == CANAL_SCD2, "re-delivered files must not add versions"


# ------------------------------------------------------------------ Maxwell (item 4)

def _mx(i: int, typ: str, key: int, status: str, ts: int, pos: int | None = None,
        xid: int | None = None) -> dict[str, Any]:
    line: dict[str, Any] = {"database": "inventory", "table": "products", "type": typ, "ts": ts,
                            "xid": xid if xid is not None else 1000 + i, "commit": True,
                            "primary_key_columns": ["id"],
                            "data": {"id": key, "name": status, "weight": i}}
    if pos is not None:
        line["position"] = f"mysql-bin.000002:{pos}"
    return line


def test_maxwell_position_switched_on_mid_history(spark, tmp_path):
    """Rows written before ``output_binlog_position`` was turned on (no ``position``) come
    before every positioned row; later updates/deletes of old keys apply (item 4)."""
    cfg = _pipeline(tmp_path, "maxwell", name="mx_switch")
    _land(cfg, "001.json", [_mx(1, "insert", 1, "a", 1_700_000_100),
                            _mx(2, "insert", 2, "b", 1_700_000_101),
                            _mx(3, "update", 1, "a2", 1_700_000_102)])
    run_pipeline(cfg, spark=spark, run_id="r1")
    assert {i: r["name"] for i, r in _by_id(cfg).items()} == {1: "a2", 2: "b"}
    # positions on from here; the first positioned row shares the last second of the old era
    _land(cfg, "002.json", [_mx(4, "update", 1, "a3", 1_700_000_102, pos=4000),
                            _mx(5, "delete", 2, "b", 1_700_000_103, pos=5000),
                            _mx(6, "insert", 3, "c", 1_700_000_104, pos=6000)])
    run_pipeline(cfg, spark=spark, run_id="r2")
    assert {i: r["name"] for i, r in _by_id(cfg).items()} == {1: "a3", 3: "c"}

    # the same history in one micro-batch gives the same table
    cfg2 = _pipeline(tmp_path / "one", "maxwell", name="mx_switch_one")
    for f in ("001.json", "002.json"):
        shutil.copy(cfg.landing_path / f, cfg2.landing_path / f)
    run_pipeline(cfg2, spark=spark, run_id="r1")
    assert {i: r["name"] for i, r in _by_id(cfg2).items()} == {1: "a3", 3: "c"}


# ------------------------------------------------------------------ item 7: parser limits

def test_line_above_parser_limit_is_quarantined_with_the_limit_named(spark, tmp_path):
    cfg = _pipeline(tmp_path, "maxwell", name="mx_big")
    big = _mx(1, "insert", 1, "x" * 20_000_100, 1_700_000_100)
    _land(cfg, "001.json", [big, "{not json", _mx(2, "insert", 2, "ok", 1_700_000_101)])
    s = run_pipeline(cfg, spark=spark, run_id="r1")
    assert s["status"] == "succeeded"
    assert {i: r["name"] for i, r in _by_id(cfg).items()} == {2: "ok"}
    reasons = sorted((len(q["raw_line"]), q["reason"]) for q in _quarantine(cfg))
    assert len(reasons) == 2
    small, large = reasons
    assert small[1].startswith("malformed JSON")
    assert not large[1].startswith("malformed"), large[1]
    assert "JSON string value of about 20000100 characters" in large[1]
    assert "limit of 20000000 characters" in large[1]
    assert f"line of {large[0]} bytes" in large[1]


def test_line_that_is_not_valid_utf8_is_quarantined_not_stored_changed(spark, tmp_path):
    """Invalid UTF-8 bytes in a line (a producer or transfer with the wrong encoding) used to be
    decoded with U+FFFD replacement characters and stored as changed values, silently. The
    line is quarantined with a reason saying so; valid UTF-8 (incl. a BOM and CRLF) loads."""
    cfg = _pipeline(tmp_path, "maxwell", name="mx_utf8")
    good = json.dumps(_mx(1, "insert", 1, "Müller ✓", 1_700_000_100), ensure_ascii=False)
    bad = json.dumps(_mx(2, "insert", 2, "@@", 1_700_000_101)).encode("utf-8")
    raw = ("\ufeff" + good + "\r\n").encode("utf-8") + bad.replace(b"@@", b"\xff\xfeok") + b"\n"
    (cfg.landing_path / ".001.tmp").write_bytes(raw)
    (cfg.landing_path / ".001.tmp").rename(cfg.landing_path / "001.json")
    s = run_pipeline(cfg, spark=spark, run_id="r1")
    assert s["status"] == "succeeded" and s["quarantined"] == 1
    assert {i: r["name"] for i, r in _by_id(cfg).items()} == {1: "Müller ✓"}
    [q] = _quarantine(cfg)
    assert q["reason"].startswith("line is not valid UTF-8"), q["reason"]
    assert "\ufffd\ufffdok" in q["raw_line"]  # shown with replacement characters


def test_every_parser_refuses_invalid_utf8(spark):
    """The three parsers on one line whose only defect is an invalid UTF-8 byte sequence."""
    from pyspark.sql import functions as F

    from cdc_lake.cdc.formats import parser_for

    lines = {
        "maxwell": _mx(1, "insert", 1, "@@", 1_700_000_100),
        "canal": {"data": [{"id": "1", "name": "@@"}], "database": "inventory", "es": 1700000100000,
                  "id": 1, "isDdl": False, "mysqlType": {"id": "int", "name": "varchar(20)"},
                  "old": None, "pkNames": ["id"], "table": "products", "ts": 1700000100001,
                  "type": "INSERT"},
        "debezium": {"before": None, "after": {"id": 1, "name": "@@"}, "op": "c",
                     "ts_ms": 1700000100001, "source": {"db": "inventory", "table": "products",
                                                        "file": "mysql-bin.000001", "pos": 4,
                                                        "row": 0, "ts_ms": 1700000100000}},
    }
    for fmt, obj in lines.items():
        data = json.dumps(obj).encode("utf-8")
        for payload, valid in ((b"ok", True), (b"\xc3\x28", False)):
            df = spark.createDataFrame([("f.json", data.replace(b"@@", payload))],
                                       "_file string, b binary")
            df = df.select("_file", F.col("b").cast("string").alias("_line"))
            [row] = parser_for(fmt)(df).collect()
            if valid:
                assert row["_error"] is None, (fmt, row["_error"])
            else:
                assert row["_error"] and row["_error"].startswith("line is not valid UTF-8"), \
                    (fmt, row["_error"])


# ------------------------------------------------------------------ Debezium (items 12, 13)

def _dt(s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=UTC)


DBZ_ROW = {  # product() of make_fixtures.py, decoded by the types its schema states
    "w32": 0.5, "tiny": 1, "small": -300, "big": 9007199254740993, "flag": True,
    "price": Decimal("2.58"), "born": date(2022, 1, 8), "cdate": date(1969, 12, 31),
    "t_ms": "12:34:56.789", "t_us": "01:02:03.000001", "t_ns": "23:59:59.999999",
    "ctime": "00:00:00", "ts_ms": _dt("2023-11-14 22:13:20.123"),
    "ts_us": _dt("2023-11-14 22:13:20.123456"), "ts_ns": _dt("2023-11-14 22:13:20.123456"),
    "cts": _dt("1970-01-01 00:00:00"), "zts": _dt("2024-02-29 21:59:59.5"), "yr": 2024,
    "doc": '{"k":[1,2]}', "color": "red"}
DBZ_TYPES = {
    "id": "int64", "name": "string", "weight": "double", "w32": "double", "tiny": "int64",
    "small": "int64", "big": "int64", "flag": "bool", "price": "decimal128(10, 2)",
    "born": "date32[day]", "cdate": "date32[day]", "t_ms": "string", "t_us": "string",
    "t_ns": "string", "ctime": "string", "ts_ms": "timestamp[us, tz=UTC]",
    "ts_us": "timestamp[us, tz=UTC]", "ts_ns": "timestamp[us, tz=UTC]",
    "cts": "timestamp[us, tz=UTC]", "zts": "timestamp[us, tz=UTC]", "yr": "int64",
    "doc": "string", "color": "string"}


def test_debezium_connect_types_snapshot_rows_and_split_batches(spark, tmp_path):
    """The schema the producer states wins (item 12: ``double`` stays a full-precision double,
    every Connect/Debezium type name decodes); snapshot rows (op ``r``, or ``c`` with
    ``source.snapshot`` true) are ``snapshot`` rows ordered before the stream, with the envelope
    time when ``source.ts_ms`` is 0 (item 13). The same history cut into three micro-batches
    gives the same table and types (type rules are deterministic)."""
    lines = (FIXTURES / "debezium_mysql_products.json").read_text().splitlines()
    results = []
    for variant, files in (("one", [lines]), ("split", [lines[:2], lines[2:4], lines[4:]])):
        cfg = _pipeline(tmp_path / variant, "debezium", name=f"dbz_{variant}")
        for i, chunk in enumerate(files):
            _land(cfg, f"{i:03d}.json", chunk)
        s = run_pipeline(cfg, spark=spark, run_id="r1", max_files_per_trigger=1)
        assert s["status"] == "succeeded"
        assert _quarantine(cfg) == []
        got = _by_id(cfg)
        assert {i: (r["name"], r["weight"], r["_cdc_op"]) for i, r in got.items()} == {
            101: ("scooter", 5.17, "update"),
            102: ("car battery", 8.100000381469727, "snapshot"),
            104: ("hammer", 1.0000000000000002, "insert")}
        assert got[102]["_cdc_commit_ts"] == _dt("2020-05-13 07:40:06.202")  # envelope ts_ms
        for r in got.values():
            assert {c: r[c] for c in DBZ_ROW} == DBZ_ROW
        schema = _schema(cfg)
        assert {c: schema[c] for c in DBZ_TYPES} == DBZ_TYPES
        results.append(sorted((r["id"], r["_cdc_seq"]) for r in got.values()))
    assert results[0] == results[1]


def test_debezium_snapshot_order_scd2_exact_double(spark, tmp_path):
    cfg = _pipeline(tmp_path, "debezium", scd=2, name="dbz_scd2")
    shutil.copy(FIXTURES / "debezium_mysql_products.json", cfg.landing_path / "001.json")
    run_pipeline(cfg, spark=spark, run_id="r1")
    assert _versions(cfg) == [
        (101, 3.140000104904175, "snapshot", False), (101, 5.17, "update", True),
        (102, 8.100000381469727, "snapshot", True),
        (103, 0.800000011920929, "snapshot", False), (103, 0.800000011920929, "delete", False),
        (104, 1.0000000000000002, "insert", True)]
    snaps = sorted(r["_cdc_seq"] for r in _table(cfg) if r["_cdc_op"] == "snapshot")
    assert len(set(snaps)) == 3, "snapshot rows need distinct, deterministic sequence values"
    assert all(r["_valid_from"].year == 2020 for r in _table(cfg))  # never 1970 from ts_ms 0


# ------------------------------------------------------------------ Debezium PostgreSQL (item 14)

def test_debezium_postgres_ordered_by_lsn_across_out_of_order_files(spark, tmp_path):
    cfg = _pipeline(tmp_path, "debezium", name="dbz_pg")
    later = "debezium_pg_a_later.json"
    shutil.copy(FIXTURES / later, cfg.landing_path / later)  # the later changes land first
    run_pipeline(cfg, spark=spark, run_id="r1")
    shutil.copy(FIXTURES / "debezium_pg_b_snapshot_and_first_updates.json",
                cfg.landing_path / "debezium_pg_b.json")
    s = run_pipeline(cfg, spark=spark, run_id="r2")
    assert s["status"] == "succeeded"
    assert _quarantine(cfg) == []
    got = {i: (r["name"], r["weight"], r["_cdc_op"]) for i, r in _by_id(cfg).items()}
    assert got == {101: ("scooter", Decimal("5.18"), "update"),
                   102: ("car battery v2", Decimal("9.0"), "insert"),
                   103: ("drill bits", Decimal("0.8"), "snapshot")}
