"""Parser regressions found by the chaos harness (tests/chaos), pinned at the parser level."""

from __future__ import annotations

import collections
import json
import re

from cdc_lake.cdc.formats import parser_for


def test_debezium_schema_change_record_with_schema_wrapper_is_ddl_not_a_crash(spark):
    """A schema-change record's schema has no 'after' field; the type-hint lookup used to index
    an empty array (Spark INVALID_ARRAY_INDEX) and fail the whole run."""
    rec = {"schema": {"type": "struct", "fields": [
               {"field": "source", "type": "struct", "fields": []},
               {"field": "databaseName", "type": "string"}, {"field": "ddl", "type": "string"}]},
           "payload": {"source": {"file": "mysql-bin.000001", "pos": 100, "ts_ms": 1000},
                       "databaseName": "shop", "ddl": "ALTER TABLE orders ADD COLUMN x INT",
                       "tableChanges": []}}
    df = spark.createDataFrame([("f.json", json.dumps(rec))], "_file string, _line string")
    [row] = parser_for("debezium")(df).collect()
    assert row["_kind"] == "ddl" and row["_error"] is None
    assert row["ddl_sql"] == "ALTER TABLE orders ADD COLUMN x INT" and row["db"] == "shop"


def test_canal_message_whose_old_holds_fewer_rows_than_data_is_quarantined_not_a_crash(spark):
    """Tester: ``old`` with 1 entry for 2 rows of ``data`` failed the whole run (ANSI
    INVALID_ARRAY_INDEX_IN_ELEMENT_AT, exit 1, and every later run again). Every row of such a
    message is an error (the pairing of old[i] with data[i] is unreliable); others are not."""
    base = {"database": "shop", "table": "t", "es": 1700000000000, "id": 1, "pkNames": ["id"],
            "isDdl": False, "mysqlType": {"id": "int", "v": "varchar(8)"}}
    good = {**base, "type": "UPDATE", "data": [{"id": "1", "v": "b"}, {"id": "2", "v": "c"}],
            "old": [{"v": "a"}, {"v": "x"}]}
    short = {**base, "type": "UPDATE", "data": [{"id": "1", "v": "b"}, {"id": "2", "v": "c"}],
             "old": [{"v": "a"}]}
    no_old = {**base, "type": "INSERT", "data": [{"id": "3", "v": "d"}], "old": None}
    df = spark.createDataFrame([("f.json", json.dumps(m)) for m in (good, short, no_old)],
                               "_file string, _line string")
    rows = parser_for("canal")(df).collect()
    errors = sorted((r["_line"] == json.dumps(short), r["_error"]) for r in rows)
    assert [e for bad, e in errors if not bad] == [None, None, None], errors
    assert [e for bad, e in errors if bad] == ["old holds 1 rows for the 2 rows of data "
                                                 "(old[i] pairs with data[i])"] * 2, errors


def test_maxwell_unusable_position_or_ts_is_an_error_not_a_different_order(spark):
    """Tester: ``"position": "mysql-bin.000001"`` (no offset) sorted the row as if it had no
    position, before every positioned row (the newest update lost, exit 0); ``"ts": "abc"`` gave
    a null commit time (an SCD2 version without _valid_from, exit 0). Both are now errors; an
    absent position (old Maxwell) and a numeric-string ts still work."""
    def line(**kw):  # type: ignore[no-untyped-def]
        return json.dumps({"database": "shop", "table": "t", "type": "update", "xid": 7,
                           "xoffset": 0, "data": {"id": 1}, **kw})

    cases = {
        line(ts=1700000000, position="mysql-bin.000001:320"): None,
        line(ts=1700000000): None,
        line(ts="1700000000", position="mysql-bin.000001:330"): None,
        line(ts=1700000000, position=None): None,
        line(ts=1700000000, position="mysql-bin.000001"):
            'position is not <binlog file>:<offset>: "mysql-bin.000001"',
        line(ts=1700000000, position={"file": "x"}):
            'position is not <binlog file>:<offset>: {"file":"x"}',
        line(ts="abc", position="mysql-bin.000001:340"): 'ts is not a whole number of seconds: "abc"',
        line(ts=[1]): "ts is not a whole number of seconds: [1]",
    }
    df = spark.createDataFrame([("f.json", text) for text in cases], "_file string, _line string")
    got = {r["_line"]: r["_error"] for r in parser_for("maxwell")(df).collect()}
    assert got == cases


def test_debezium_unavailable_value_placeholder_is_an_error_and_transaction_markers_are_skipped(spark):
    """Tester: an UPDATE carrying Debezium's TOAST placeholder ``__debezium_unavailable_value``
    stored that text over the column's real value (exit 0). Now the event is an error naming the
    column (a delete, which needs only the key, is not). Transaction-metadata records
    (``status`` BEGIN/END) were quarantined as "missing op"; they are skipped, not data."""
    src = {"file": "mysql-bin.000001", "pos": 10, "row": 0, "db": "shop", "table": "t", "ts_ms": 1}

    def ev(op: str, after: dict | None, before: dict | None = None) -> str:
        return json.dumps({"op": op, "after": after, "before": before, "source": src, "ts_ms": 1})

    toast = ev("u", {"id": 1, "body": "__debezium_unavailable_value", "n": 2})
    toast_bytes = ev("u", {"id": 2, "blob": "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==", "n": 3})
    nested = ev("u", {"id": 3, "doc": '{"x": "__debezium_unavailable_value"}'})  # inside a value: data
    delete = ev("d", None, {"id": 4, "body": "__debezium_unavailable_value"})
    begin = json.dumps({"status": "BEGIN", "id": "571:53195829", "event_count": None,
                        "data_collections": None, "ts_ms": 1})
    end_wrapped = json.dumps({"schema": {"type": "struct", "name": "io.debezium.connector.common."
                                         "TransactionMetadataValue", "fields": []},
                              "payload": {"status": "END", "id": "571:53195829", "event_count": 2,
                                          "data_collections": [], "ts_ms": 1}})
    # (and a schema listing a field twice failed every run: Spark's duplicate map key)
    twice = json.dumps({"schema": {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"field": "id", "type": "int64"}, {"field": "id", "type": "string"}]}]},
        "payload": json.loads(ev("c", {"id": 5}))})
    toast_array = ev("u", {"id": 6, "tags": ["__debezium_unavailable_value"]})  # a TOASTed array
    lines = [toast, toast_bytes, nested, delete, begin, end_wrapped, twice, toast_array]
    df = spark.createDataFrame([("f.json", x) for x in lines], "_file string, _line string")
    got = {r["_line"]: (r["_kind"], r["_error"]) for r in parser_for("debezium")(df).collect()}
    assert got[toast][1].startswith("column(s) body hold Debezium's unavailable-value placeholder")
    assert "REPLICA IDENTITY FULL" in got[toast][1]
    assert got[toast_bytes][1].startswith("column(s) blob hold")
    assert got[nested] == ("row", None) and got[delete] == ("row", None)
    assert got[begin] == ("skip", None) and got[end_wrapped] == ("skip", None)
    assert got[toast_array][1].startswith("column(s) tags hold"), got[toast_array]
    assert got[twice] == ("row", "the schema's after fields list a name twice or a field without a "
                                 'name: ["id","id"]')


def test_order_values_the_order_key_cannot_hold_are_errors_not_a_different_order(spark):
    """The order key (``seq``) is text: each ordering value is left-padded to a fixed width so
    that text order is numeric order. A value wider than its slot was cut (Maxwell ``ts`` sent in
    milliseconds: 1700000000123 -> 170000000012), a negative one sorted backwards (-6 before -5
    as text), a 39-digit offset failed the whole run (ANSI decimal overflow) and a 20-digit
    binlog file number too (bigint overflow), as did a file name without a number and a
    commit time beyond the microsecond range (long overflow). Each is now an error naming the field and value;
    the widest values each slot holds still order as before."""
    def mx(**kw):  # type: ignore[no-untyped-def]
        return json.dumps({"database": "shop", "table": "t", "type": "update", "ts": 1700000000,
                           "xid": 7, "xoffset": 0, "data": {"id": 1}, **kw})

    def cn(**kw):  # type: ignore[no-untyped-def]
        return json.dumps({"database": "shop", "table": "t", "type": "UPDATE", "es": 1700000000000,
                           "id": 1, "isDdl": False, "data": [{"id": "1"}], **kw})

    def dbz(**src):  # type: ignore[no-untyped-def]
        source = {"file": "mysql-bin.000001", "pos": 100, "row": 0, "ts_ms": 1, "table": "t",
                  "db": "shop", **src}
        source = {k: v for k, v in source.items() if v is not None}
        return json.dumps({"op": "u", "before": {"id": 1}, "after": {"id": 1}, "source": source})

    big = "9" * 39
    cases = {
        "maxwell": {
            mx(position="mysql-bin.9999999999:4"): None,
            # leading zeros do not count against the slot (the number 7 in 16 digits)
            mx(position="mysql-bin." + "0" * 15 + "7:" + "0" * 25 + "4"): None,
            mx(position="mysql-bin.000001:" + "9" * 20): None,
            mx(ts=253402300799, position=None): None,  # the last second of year 9999
            mx(ts=-62135596800, xid=1, position="mysql-bin.000001:5"): None,  # the first of year 1
            mx(ts=999999999999, position=None):
                "ts 999999999999 is not a commit time in years 1 to 9999 (read as seconds "
                "since 1970)",
            mx(ts=2**62, position="mysql-bin.000001:6"):  # failed the run (long overflow)
                f"ts {2**62} is not a commit time in years 1 to 9999 (read as seconds since 1970)",
            mx(xoffset=9_999_999_999): None,
            mx(ts=1700000000123, position=None):  # sent in ms
                "ts 1700000000123 is not a commit time in years 1 to 9999 (read as seconds "
                "since 1970)",
            mx(ts=-5, position=None): "ts -5 does not fit the order key (0 to 999999999999)",
            mx(position="mysql-bin.10000000000:4"):
                "binlog file number 10000000000 does not fit the order key (0 to 9999999999)",
            mx(position="mysql-bin." + "1" * 20 + ":4"):
                f"binlog file number {'1' * 20} does not fit the order key (0 to 9999999999)",
            mx(position="mysql-bin.000001:" + big):
                f"binlog offset {big} does not fit the order key (0 to {'9' * 20})",
            mx(xoffset=-1): "xoffset -1 does not fit the order key (0 to 9999999999)",
            mx(xid=-7, position=None): f"xid -7 does not fit the order key (0 to {'9' * 20})",
            mx(position="binlog:4"): "position's binlog file name does not end in a number (the "
                                     'number orders binlog files): "binlog:4"',
            # a type that is not a string: its text held a '-', so it went to the DDL log
            # instead of the quarantine (fuzzer, slow tier)
            mx(type={"a": "x-y"}): 'unknown type {"a":"x-y"}',
            mx(type=-5): "unknown type -5",
        },
        "canal": {
            cn(es=253402300799999, id=2**63 - 1): None,
            cn(es=-1): "es -1 does not fit the order key (0 to 9999999999999999)",
            cn(es=9_999_999_999_999_999):  # failed the run (long overflow)
                "es 9999999999999999 is not a commit time in years 1 to 9999 (read as "
                "milliseconds since 1970)",
            cn(id=-3): f"id -3 does not fit the order key (0 to {'9' * 20})",
            # present but not a whole number: it ordered the message as id 0 (fuzzer, slow tier)
            cn(id=[None]): "id is not a whole number up to 9223372036854775807: [null]",
            cn(id="7"): 'id is not a whole number up to 9223372036854775807: "7"',
            cn(id=1.5): "id is not a whole number up to 9223372036854775807: 1.5",
            cn(id=2**64): f"id is not a whole number up to 9223372036854775807: {2**64}",
            cn(id=None, es=1700000000001): None,  # absent (JSON null): orders as id 0
        },
        "debezium": {
            dbz(file="mysql-bin.9999999999", pos=2**63 - 1, row=9_999_999_999): None,
            dbz(file="mysql-bin.10000000000"):
                "source.file number 10000000000 does not fit the order key (0 to 9999999999)",
            dbz(file="mysql-bin." + "2" * 25):
                f"source.file number {'2' * 25} does not fit the order key (0 to 9999999999)",
            dbz(pos=-100): f"source.pos -100 does not fit the order key (0 to {'9' * 20})",
            dbz(row=-1): "source.row -1 does not fit the order key (0 to 9999999999)",
            dbz(row=10**10): "source.row 10000000000 does not fit the order key (0 to 9999999999)",
            dbz(file=None, pos=None, lsn=-9): f"source.lsn -9 does not fit the order key (0 to {'9' * 20})",
            dbz(file=None, pos=None, lsn=5, txId=-2):
                f"source.txId -2 does not fit the order key (0 to {'9' * 20})",
            dbz(file=None, pos=None, lsn=5, txId=2): None,
            dbz(ts_ms=2**63 - 1):
                f"source.ts_ms (else ts_ms) {2**63 - 1} is not a commit time in years 1 to 9999 "
                "(read as milliseconds since 1970)",
            dbz(file="binlog"): "source.file does not end in a number (the number orders binlog "
                                'files): "binlog"',
        },
    }
    for fmt, expected in cases.items():
        df = spark.createDataFrame([("f.json", text) for text in expected], "_file string, _line string")
        parsed = parser_for(fmt)(df)  # every column computed (commit_ts as text: Python's
        rows = parsed.select("_line", "_error", parsed["commit_ts"].cast("string").alias("ts"),
                             "seq").collect()  # datetime stops at year 9999)
        assert {r["_line"]: r["_error"] for r in rows} == expected, fmt
        ok = sorted((r["seq"], r["_line"]) for r in rows if r["_error"] is None)
        assert all(r["seq"] for r in rows if r["_error"] is None), ok


def _reads_per_path(plan: str) -> dict[str, int]:
    """How often each JSON path below the top is read (``try_variant_get(..., $.path, ...)``) in
    a plan's text (``$`` itself: a typed read of a column already read, each its own)."""
    return dict(collections.Counter(re.findall(r"try_variant_get\([^,()]+, (\$[.\[][^,]*),", plan)))


def test_each_parser_reads_an_envelope_field_once_per_line(spark):
    """A performance guard without timing: b207d4f (2026-12-01) made the Maxwell parser evaluate
    the position's two regexes about twenty times per line (a 200k-event parse +50%), because
    Spark re-evaluates an expression in every ``CASE`` branch and column that uses it unless a
    projection of its own computes it first; the Debezium and Canal parsers read envelope fields
    that way too (Debezium's binlog file name regex three times). In each parser's optimized
    plan, a JSON path is read at most twice (its value, and for some the raw value an error
    message quotes on a bad line), and so is each regex. (Before: Debezium read ``$.op`` 41
    times, ``$.source.file`` 24 times with 18 regexes over it; Canal ``$.es`` 18 times; a 94k-line
    Debezium parse took 35-41 s, after 11-16 s: ``benchmarks/bench_parse.py``.)"""
    df = spark.createDataFrame([("f.json", "{}")], "_file string, _line string")
    key, before = "spark.sql.debug.maxToStringFields", spark.conf.get("spark.sql.debug.maxToStringFields")
    spark.conf.set(key, "100000")  # the plan's text lists every column (default: 25, then "...")
    try:
        plans = {fmt: parser_for(fmt)(df)._jdf.queryExecution().optimizedPlan().toString()
                 for fmt in ("maxwell", "debezium", "canal")}
    finally:
        spark.conf.set(key, before)
    for fmt, plan in plans.items():
        reads = _reads_per_path(plan)
        assert reads, (fmt, plan[:2000])  # the pattern still finds the reads
        assert {p: n for p, n in reads.items() if n > 2} == {}, (fmt, reads)
        regexes = collections.Counter(re.findall(r"regexp_extract\(([^)]*\)[^)]*)\)", plan))
        assert {r: n for r, n in regexes.items() if n > 2} == {}, (fmt, regexes)
