"""One contract for every Delta engine: run against each available engine (see conftest).

The session summary prints which engines ran and why any was skipped. Tables are read back
with delta-rs (``deltalake.DeltaTable``) for the deltalake engine and with the engine itself
otherwise, so the contract is checked against Delta's log, not the engine's own bookkeeping.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal

import pytest

from cdc_lake.engines import MergeSpec, Txn, select_engine


@pytest.fixture
def engine(spark, engine_name):  # type: ignore[no-untyped-def]
    return select_engine(spark, engine_name)


def _rows(engine, path):  # type: ignore[no-untyped-def]
    """The table's rows read independently of the engine under test (delta-rs, no Spark),
    checked against what the engine's own ``read`` returns."""
    from reference_model import read_delta_rows

    rows = sorted(read_delta_rows(path), key=lambda r: r["id"])
    df = engine.read(path)
    via_engine = sorted((r.asDict() for r in df.collect()), key=lambda r: r["id"]) if df is not None else []
    assert [r["id"] for r in via_engine] == [r["id"] for r in rows], (via_engine, rows)
    return rows


def _log_txns(path) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """``appId -> version`` from the ``txn`` actions of the JSON commit files (Delta protocol),
    parsed here, not by the engine under test."""
    import json
    from pathlib import Path

    out: dict[str, int] = {}
    for f in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            txn = json.loads(line).get("txn") if line.strip() else None
            if txn:
                out[txn["appId"]] = max(out.get(txn["appId"], -1), int(txn["version"]))
    return out


def _df(spark, rows, schema="id bigint, name string, amount decimal(10,2), seq string"):  # type: ignore[no-untyped-def]
    return spark.createDataFrame(rows, schema)


SPEC = (MergeSpec(on=("id",))
        .when_matched_delete("s.name IS NULL")
        .when_matched_update_all("s.seq > t.seq")
        .when_not_matched_insert_all("s.name IS NOT NULL"))


def test_merge_creates_table_and_is_idempotent_per_txn(spark, engine, tmp_path):
    path = str(tmp_path / "t")
    r = engine.merge(path, _df(spark, [(1, "a", Decimal("1.50"), "1"), (2, "b", None, "1")]), SPEC,
                     txn=Txn("app-1", 0))
    assert not r.skipped and r.inserted == 2
    v = engine.version(path)
    # Same (app id, version) again — even with different data — is skipped and commits nothing.
    again = engine.merge(path, _df(spark, [(3, "c", None, "1")]), SPEC, txn=Txn("app-1", 0))
    assert again.skipped and engine.version(path) == v
    assert [r["id"] for r in _rows(engine, path)] == [1, 2]
    assert engine.txn_version(path, "app-1") == 0
    assert engine.txn_version(path, "other-app") is None
    assert _log_txns(path) == {"app-1": 0}  # recorded in the same commit as the data


def test_new_app_id_is_not_mistaken_for_done(spark, engine, tmp_path):
    """A rebuilt checkpoint restarts batch ids at 0 under a new app id: writes must happen."""
    path = str(tmp_path / "t")
    engine.merge(path, _df(spark, [(1, "a", None, "1")]), SPEC, txn=Txn("app-old", 5))
    r = engine.merge(path, _df(spark, [(2, "b", None, "1")]), SPEC, txn=Txn("app-new", 0))
    assert not r.skipped
    assert [r["id"] for r in _rows(engine, path)] == [1, 2]


def test_merge_clauses_update_delete_and_guard(spark, engine, tmp_path):
    path = str(tmp_path / "t")
    engine.merge(path, _df(spark, [(1, "a", None, "5"), (2, "b", None, "5")]), SPEC, txn=Txn("a", 0))
    r = engine.merge(path, _df(spark, [(1, "old", None, "3"), (2, None, None, "6"), (3, "c", None, "1")]),
                     SPEC, txn=Txn("a", 1))
    rows = _rows(engine, path)
    assert [(x["id"], x["name"]) for x in rows] == [(1, "a"), (3, "c")]  # seq guard kept 1='a'
    assert (r.inserted, r.updated, r.deleted) == (1, 0, 1)
    assert engine.count(path) == len(rows) == 2  # after a delete: the snapshot, not the files ever written


def test_merge_evolves_schema_older_rows_null(spark, engine, tmp_path):
    path = str(tmp_path / "t")
    engine.merge(path, _df(spark, [(1, "a", None, "1")]), SPEC, txn=Txn("a", 0))
    wide = spark.createDataFrame([(2, "b", None, "1", "gold", date(2024, 1, 2))],
                                 "id bigint, name string, amount decimal(10,2), seq string, tier string, d date")
    engine.merge(path, wide, SPEC, txn=Txn("a", 1))
    rows = _rows(engine, path)
    assert rows[0]["tier"] is None and rows[1]["tier"] == "gold" and rows[1]["d"] == date(2024, 1, 2)
    types = {f.name: f.dataType.simpleString() for f in engine.schema(path).fields}
    assert types["amount"] == "decimal(10,2)" and types["d"] == "date"


def test_append_idempotent_and_types_preserved(spark, engine, tmp_path):
    path = str(tmp_path / "q")
    ts = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    df = spark.createDataFrame([(1, "x", ts)], "id bigint, name string, at timestamp")
    assert engine.append(path, df, txn=Txn("q", 3)).inserted == 1
    assert engine.append(path, df, txn=Txn("q", 3)).skipped
    assert engine.append(path, df, txn=Txn("q", 2)).skipped  # older versions are done too
    assert _log_txns(path) == {"q": 3}
    rows = _rows(engine, path)
    assert len(rows) == 1 and rows[0]["at"].replace(tzinfo=timezone.utc) == ts


def test_read_arrow_selects_columns_of_rows_in_a_value_list(spark, engine, tmp_path):
    path = str(tmp_path / "k")
    assert engine.read_arrow(path, ["id"], where_in=("name", ["a"])) is None
    engine.append(path, _df(spark, [(1, "a", None, "1"), (2, "b", None, "1"), (3, None, None, "2"),
                                    (4, "a", None, "3")]), txn=Txn("k", 0))
    got = engine.read_arrow(path, ["id", "seq"], where_in=("name", ["a", "zz"]))
    assert got.column_names == ["id", "seq"]
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == [{"id": 1, "seq": "1"}, {"id": 4, "seq": "3"}]
    with_null = engine.read_arrow(path, ["id"], where_in=("name", [None, "b"]))
    assert sorted(with_null.column("id").to_pylist()) == [2, 3]
    assert engine.read_arrow(path, ["id"], where_in=("name", [])).num_rows == 0


def test_empty_source_commits_nothing(spark, engine, tmp_path):
    path = str(tmp_path / "t")
    assert engine.merge(path, _df(spark, []), SPEC, txn=Txn("a", 0)).version is None
    assert not engine.exists(path)
    engine.merge(path, _df(spark, [(1, "a", None, "1")]), SPEC, txn=Txn("a", 1))
    v = engine.version(path)
    engine.append(path, _df(spark, []), txn=Txn("a", 2))
    assert engine.version(path) == v


@pytest.mark.parametrize("rows", [10, None, 10**9], ids=["small", "unknown", "big"])
def test_compute_many_sources_then_write_each(spark, engine, tmp_path, rows):
    """Sources computed together (delta-rs: one Spark job for a small batch, one per frame for a
    big or unknown one) write exactly what the frames hold: different schemas, NOT NULL columns,
    timestamps, decimals, an empty frame, nulls."""
    ts = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    a = _df(spark, [(1, "a", Decimal("1.50"), "1"), (2, None, None, "1")]).where("id IS NOT NULL")
    b = spark.createDataFrame([(7, ts, date(2024, 1, 2))], "k bigint NOT NULL, at timestamp, d date")
    empty = _df(spark, [])
    sources = engine.compute({"a": a, "b": b, "empty": empty}, rows=rows)
    assert set(sources) == {"a", "b", "empty"}
    r = engine.merge(str(tmp_path / "a"), sources["a"], MergeSpec(on=("id",)).when_not_matched_insert_all(),
                     txn=Txn("c", 0))
    assert r.inserted == 2
    assert [(x["id"], x["name"], x["amount"]) for x in _rows(engine, str(tmp_path / "a"))] == \
        [(1, "a", Decimal("1.50")), (2, None, None)]
    engine.append(str(tmp_path / "b"), sources["b"], txn=Txn("c", 0))
    from reference_model import read_delta_rows

    (row,) = read_delta_rows(str(tmp_path / "b"))
    assert (row["k"], row["at"].replace(tzinfo=timezone.utc), row["d"]) == (7, ts, date(2024, 1, 2))
    assert engine.merge(str(tmp_path / "e"), sources["empty"], SPEC, txn=Txn("c", 0)).version is None
    assert engine.frame(sources["a"]).count() == 2  # usable again as a DataFrame


def test_replace_is_one_commit_and_history_keeps_old_version(spark, engine, tmp_path):
    path = str(tmp_path / "t")
    engine.merge(path, _df(spark, [(1, "a", None, "1"), (2, "b", None, "1")]), SPEC, txn=Txn("a", 0))
    before = engine.version(path)
    engine.replace(path, spark.createDataFrame([(9, "z")], "id bigint, name string"))
    assert engine.version(path) == before + 1
    assert [r["id"] for r in _rows(engine, path)] == [9]
    assert len(engine.history(path)) >= 2
    # with a txn: recorded (the owner mark of a full refresh), the merge's kept
    engine.replace(path, spark.createDataFrame([(8, "y")], "id bigint, name string"),
                   txn=Txn("cdc-shop-refresh-1", 0))
    assert engine.version(path) == before + 2
    assert [r["id"] for r in _rows(engine, path)] == [8]
    assert engine.txn_version(path, "cdc-shop-refresh-1") == 0 and engine.txn_version(path, "a") == 0


def test_read_as_of_a_version_is_that_snapshot(spark, engine, tmp_path):
    """``read(path, version=v)`` is Delta time travel: the rows and schema of version ``v``
    (truth: delta-rs reads of each version), even after the schema grew."""
    from deltalake import DeltaTable

    path = str(tmp_path / "t")
    engine.merge(path, _df(spark, [(1, "a", None, "1"), (2, "b", None, "1")]), SPEC, txn=Txn("a", 0))
    v0 = engine.version(path)
    engine.merge(path, _df(spark, [(2, None, None, "2"), (3, "c", Decimal("3.00"), "2")]), SPEC,
                 txn=Txn("a", 1))
    wider = spark.createDataFrame([(4, "d", None, "3", "x")],
                                  "id bigint, name string, amount decimal(10,2), seq string, extra string")
    engine.merge(path, wider, SPEC, txn=Txn("a", 2))
    v2 = engine.version(path)
    for v in (v0, v0 + 1, v2):
        truth = DeltaTable(path, version=v).to_pyarrow_table()
        df = engine.read(path, version=v)
        assert df is not None
        assert sorted(df.columns) == sorted(truth.column_names), v
        assert sorted(r["id"] for r in df.collect()) == sorted(truth.column("id").to_pylist()), v
    assert sorted(r["id"] for r in engine.read(path, version=v0).collect()) == [1, 2]
    assert "extra" not in engine.read(path, version=v0 + 1).columns
    assert sorted(r["id"] for r in engine.read(path).collect()) == [1, 3, 4]  # latest by default
    assert engine.read(str(tmp_path / "nope"), version=0) is None


@pytest.mark.parametrize(("folder", "decoy"), [("with space", None), ("unicode_é", None),
                                               ("lake {x}", "lake x"), ("a*b?", "aZZbQ")])
def test_tables_under_folders_with_special_characters(spark, engine, tmp_path, folder, decoy):
    """delta-rs returns percent-encoded file URIs: handed to Spark as they are, a table under
    `with space/` was written once and then failed every read (PATH_NOT_FOUND, tester). (A
    folder named with `%` is beyond delta-rs 1.6.6 itself: it decodes `a%20b` to `a b`.)
    Spark expands glob characters in the paths it reads: a table under `lake {x}` was read
    from `lake x` (its files "gone": a false exit 3, tester), so a decoy table with the same
    file layout sits where the glob would match."""
    if decoy is not None:
        engine.merge(str(tmp_path / decoy / "t"), _df(spark, [(99, "decoy", None, "1")]), SPEC, txn=Txn("d", 1))
    path = str(tmp_path / folder / "t")
    engine.merge(path, _df(spark, [(1, "x", None, "1")]), SPEC, txn=Txn("s", 1))
    engine.merge(path, _df(spark, [(2, "y", None, "1")]), SPEC, txn=Txn("s", 2))
    assert sorted((r["id"], r["name"]) for r in _rows(engine, path)) == [(1, "x"), (2, "y")]
    assert (tmp_path / folder / "t" / "_delta_log").is_dir()


def test_job_commits_never_clean_up_the_delta_log(spark, engine, tmp_path):
    """delta-rs deletes expired log files after the checkpoint it writes every
    delta.checkpointInterval commits, and delta-spark does the same by default
    (``delta.enableExpiredLogCleanup``); behind a change-feed reader paused past the log
    retention that lost the commits it still had to read. The jobs' commits leave the cleanup
    to the maintenance job, which holds it back for lagging readers."""
    from deltalake import DeltaTable

    path = str(tmp_path / "t")
    engine.merge(path, _df(spark, [(1, "a", None, "1")]), SPEC, txn=Txn("j", 0))
    DeltaTable(path).alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds",
                                                 "delta.checkpointInterval": "2"})
    for i in range(1, 6):
        engine.merge(path, _df(spark, [(i + 1, "b", None, "1")]), SPEC, txn=Txn("j", i))
        engine.append(str(tmp_path / "q"), _df(spark, [(i, "q", None, "1")]), txn=Txn("q", i))
    logs = sorted(p.name for p in (tmp_path / "t" / "_delta_log").glob("*.json"))
    assert logs[0] == "00000000000000000000.json" and any(
        p.name.endswith(".checkpoint.parquet") for p in (tmp_path / "t" / "_delta_log").iterdir()), logs
    assert len(_rows(engine, path)) == 6


def test_a_table_created_from_a_not_null_source_takes_nulls_later(spark, engine, tmp_path):
    """Both engines create tables all-nullable (delta-spark kept a source's NOT NULL columns:
    a later MERGE with a null there would fail on one engine only; reviewer I)."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    path = str(tmp_path / "t")
    strict = StructType([StructField("id", LongType(), False), StructField("name", StringType(), False),
                         StructField("seq", StringType(), False)])
    engine.merge(path, spark.createDataFrame([(1, "a", "1")], strict), MergeSpec(
        on=("id",)).when_not_matched_insert_all(), txn=Txn("n", 0))
    assert all(f.nullable for f in engine.schema(path).fields)  # type: ignore[union-attr]
    loose = spark.createDataFrame([(2, "b", None)], "id bigint, name string, seq string")
    engine.merge(path, loose, MergeSpec(on=("id",)).when_not_matched_insert_all(), txn=Txn("n", 1))
    assert {r["id"]: r["seq"] for r in _rows(engine, path)} == {1: "1", 2: None}


def test_delta_spark_reads_transactions_from_the_log_as_delta_rs_does(spark, tmp_path):
    """The delta-spark engine reads ``txn`` actions from the log itself (Delta has no public API):
    the newest checkpoint plus the commits after it. Plain Spark reads, so it runs without the
    Delta jars, on logs delta-rs wrote (truth: delta-rs's ``transaction_version``): before and
    after a checkpoint, with the commits before the checkpoint cleaned up, per app id."""
    from deltalake import DeltaTable

    from cdc_lake.engines.delta_spark_engine import DeltaSparkEngine

    rs = select_engine(spark, "deltalake")
    reader = DeltaSparkEngine(spark)
    path = str(tmp_path / "t")

    def same() -> None:
        dt = DeltaTable(path)
        for app in ("a", "b", "c", "zz"):
            assert reader.txn_version(path, app) == dt.transaction_version(app), app

    rs.merge(path, _df(spark, [(1, "a", None, "1")]), SPEC, txn=Txn("a", 3))
    rs.merge(path, _df(spark, [(2, "b", None, "1")]), SPEC, txn=Txn("b", 7))
    same()
    DeltaTable(path).create_checkpoint()
    rs.merge(path, _df(spark, [(3, "c", None, "1")]), SPEC, txn=Txn("a", 4))
    same()
    DeltaTable(path).alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    DeltaTable(path).create_checkpoint()
    rs.merge(path, _df(spark, [(4, "d", None, "1")]), SPEC, txn=Txn("c", 1))
    DeltaTable(path).cleanup_metadata()
    assert not (tmp_path / "t" / "_delta_log" / "00000000000000000000.json").exists()
    same()
    assert reader.txn_version(str(tmp_path / "nope"), "a") is None


def test_read_missing_table_is_none(spark, engine, tmp_path):
    assert engine.read(str(tmp_path / "nope")) is None
    assert engine.count(str(tmp_path / "nope")) == 0
    assert engine.version(str(tmp_path / "nope")) is None
    assert engine.txn_version(str(tmp_path / "nope"), "a") is None


def test_auto_prefers_delta_spark_only_when_classes_load(spark):
    from cdc_lake.engines import delta_spark_available

    # The expectation must not come from the function under test: ask the JVM directly.
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(
            "io.delta.tables.DeltaTable", True,
            spark.sparkContext._jvm.java.lang.Thread.currentThread().getContextClassLoader())
        loads = True
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
        loads = False
    ok, _ = delta_spark_available(spark)
    assert ok == loads
    assert select_engine(spark, "auto").name == ("delta-spark" if loads else "deltalake")
    if not ok:
        with pytest.raises(RuntimeError, match="delta-spark"):
            select_engine(spark, "delta-spark")


def test_read_of_a_table_without_rows_keeps_its_schema(spark, engine, tmp_path):
    from pyspark.sql.types import (ArrayType, DecimalType, LongType, MapType, StringType,
                                   StructField, StructType, TimestampType)

    schema = StructType([StructField("id", LongType()), StructField("at", TimestampType()),
                         StructField("amount", DecimalType(20, 3)),
                         StructField("tags", MapType(StringType(), LongType())),
                         StructField("path", ArrayType(StringType()))])
    path = str(tmp_path / "empty")
    engine.create(path, schema)
    df = engine.read(path)
    assert df is not None and df.count() == 0 and engine.count(path) == 0
    assert [(f.name, f.dataType) for f in df.schema.fields] == \
        [(f.name, f.dataType) for f in schema.fields]


def test_driver_side_frames_keep_the_exact_schema(spark):
    """``arrow_frame``/``empty_frame`` (JVM-built, no Python worker) keep types, nesting and
    nullability exactly as asked, rows included."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (ArrayType, BinaryType, DateType, DecimalType, LongType,
                                   MapType, StringType, StructField, StructType, TimestampNTZType,
                                   TimestampType)

    from cdc_lake.engines.base import arrow_frame, empty_frame

    schema = StructType([
        StructField("id", LongType(), False), StructField("at", TimestampType()),
        StructField("local", TimestampNTZType()), StructField("amount", DecimalType(20, 3)),
        StructField("versions", MapType(StringType(), LongType())),
        StructField("tags", ArrayType(StringType())),
        StructField("inner", StructType([StructField("d", DateType()), StructField("b", BinaryType())]))])
    empty = empty_frame(spark, schema)
    assert empty.schema == schema and empty.count() == 0
    at = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc)
    row = {"id": 7, "at": at, "local": datetime(2026, 1, 2, 3, 4, 5), "amount": Decimal("-1.250"),
           "versions": [("orders", 3), ("gone", None)], "tags": ["a", None],
           "inner": {"d": date(2026, 1, 2), "b": b"\x00\xff"}}
    df = arrow_frame(spark, pa.Table.from_pylist([row], schema=to_arrow_schema(schema, timezone="UTC")),
                     schema)
    assert df.schema == schema
    got = df.collect()[0].asDict(recursive=True)
    assert got["id"] == 7 and got["amount"] == Decimal("-1.250") and got["tags"] == ["a", None]
    assert got["at"].replace(tzinfo=timezone.utc) == at  # session time zone is UTC in tests
    assert got["local"] == datetime(2026, 1, 2, 3, 4, 5)
    assert got["versions"] == {"orders": 3, "gone": None}
    assert got["inner"] == {"d": date(2026, 1, 2), "b": bytearray(b"\x00\xff")}


def test_deltalake_count_reads_file_statistics_or_the_footers_of_files_without(spark, tmp_path):
    """delta-rs: ``count`` sums the log's ``numRecords``; a file whose add action has no
    statistics (another writer's choice) is counted from its Parquet footer instead."""
    import json

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    engine = select_engine(spark, "deltalake")
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1, 2, 3]}))
    write_deltalake(path, pa.table({"id": [4, 5]}), mode="append")
    DeltaTable(path).delete("id = 2")  # rewrites the first file: the snapshot, not every file
    assert engine.count(path) == 4
    log = tmp_path / "t" / "_delta_log" / "00000000000000000001.json"
    actions = [json.loads(ln) for ln in log.read_text().splitlines() if ln.strip()]
    assert any("stats" in a.get("add", {}) for a in actions)
    log.write_text("".join(json.dumps({"add": {k: v for k, v in a["add"].items() if k != "stats"}}
                                      if "add" in a else a) + "\n" for a in actions))
    assert engine.count(path) == 4  # the appended file's 2 rows from its footer
    assert engine.count(str(tmp_path / "nope")) == 0
