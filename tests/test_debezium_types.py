"""Debezium values decoded by their own event's schema, whatever the batch holds (tester, 2026-11-27).

* A source-side ALTER between events of one micro-batch (``DECIMAL(10,2)`` -> ``(12,4)``,
  ``DATETIME(3)`` -> ``(6)``) gave the column one hint for the whole batch: -0.05 was stored as
  -0.0005 and 2024-01-01 as 1970-01-20, exit 0; landed in two runs the same files came out right.
* ``precise`` decimals wider than 8 bytes (``BIGINT UNSIGNED`` >= 2^63, ``DECIMAL(25,2)``) were
  quarantined although Spark's decimal(38) holds them.
* ``NanoTimestamp`` ...123456999 ns was stored as ...123457 (divided as a double).
* A column named ``it's`` failed every run (Spark's variant path has no escapes); ``b\\s`` was
  stored as null, not quarantined.

Truth is computed here from the values the events were built from (Python ``Decimal`` and
``datetime``, no code of the job), for one batch and for the same files in two runs.
"""

from __future__ import annotations

import base64
import json
import os
import random
from datetime import datetime, timedelta, timezone
from decimal import Context, Decimal
from pathlib import Path

from deltalake import DeltaTable

from cdc_lake.cdc.job import run_pipeline
from cdc_lake.config import load_pipeline

YAML = """pipeline: {name}
source: {{format: debezium, path: landing, database: shop}}
storage: {{root: lake}}
engine: {{name: deltalake}}
tables:
  orders: {{keys: [id]}}
  wide: {{keys: [id]}}
  dec: {{keys: [id]}}
  ts: {{keys: [id]}}
  tm: {{keys: [id]}}
"""
DECIMAL = "org.apache.kafka.connect.data.Decimal"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _b64(unscaled: int) -> str:
    """Kafka Connect's Decimal bytes: Java BigInteger.toByteArray (minimal two's complement)."""
    return base64.b64encode(unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)).decode()


def _field(name: str, kind: str, logical: str | None = None, **params: str) -> dict:
    f: dict = {"field": name, "type": kind, "optional": True}
    if logical:
        f["name"] = logical
    if params:
        f["parameters"] = params
    return f


def _event(pos: int, op: str, fields: list[dict], after: dict | None, before: dict | None = None,
           table: str = "orders") -> str:
    row = {"type": "struct", "optional": True, "fields": fields}
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                                           {"field": "op", "type": "string"}]}
    payload = {"before": before, "after": after, "op": op, "ts_ms": 1704105000000 + pos,
               "source": {"file": "mysql-bin.000001", "pos": 1000 + pos, "row": 0, "db": "shop",
                          "table": table, "ts_ms": 1704105000000 + pos}}
    return json.dumps({"schema": schema, "payload": payload})


def _pipeline(tmp_path: Path, name: str):  # type: ignore[no-untyped-def]
    d = tmp_path / name
    (d / "landing").mkdir(parents=True)
    (d / "p.yaml").write_text(YAML.format(name=name), encoding="utf-8")
    return load_pipeline(d / "p.yaml")


def _rows(cfg, table: str) -> dict:  # type: ignore[no-untyped-def]
    rows = DeltaTable(str(cfg.tables[table].path)).to_pyarrow_table().to_pylist()
    return {r["id"]: {k: v for k, v in r.items() if not k.startswith("_cdc")} for r in rows}


def _quarantined(cfg) -> list[str]:  # type: ignore[no-untyped-def]
    if not DeltaTable.is_deltatable(str(cfg.quarantine_path)):
        return []
    return sorted(r["reason"] for r in DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().to_pylist())


def _scaled(unscaled: int, scale: int) -> Decimal:
    return Decimal(unscaled).scaleb(-scale, context=Context(prec=60))  # (28 digits by default)


def _ts(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


def _in_one_and_in_two_runs(spark, tmp_path: Path, files: list[list[str]], check) -> None:  # type: ignore[no-untyped-def]
    one = _pipeline(tmp_path, "one_batch")
    for i, lines in enumerate(files):
        (one.landing_path / f"{i:03d}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert run_pipeline(one, spark=spark)["batches"] == 1
    check(one)
    split = _pipeline(tmp_path, "split")
    for i, lines in enumerate(files):
        (split.landing_path / f"{i:03d}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
        run_pipeline(split, spark=spark)
    check(split)


def test_values_are_decoded_by_their_own_events_schema_however_the_batches_are_cut(spark, tmp_path):
    """Table ``orders``: a DECIMAL(10,2) -> (12,4) and DATETIME(3) -> (6) ALTER between the two
    files. Table ``wide``: decimals of up to 38 digits, unsigned bigints >= 2^63, nanosecond
    timestamps, column names with ``'``, ``\\`` and both quotes; one row beyond both decimal
    columns (quarantined). Both files in one batch, and in two runs: the same tables."""
    seed = int(os.environ.get("CDC_SEED") or random.SystemRandom().randrange(10 ** 6))
    rng = random.Random(seed)
    old = [_field("id", "int64"), _field("price", "bytes", DECIMAL, scale="2", **{"connect.decimal.precision": "10"}),
           _field("at", "int64", "io.debezium.time.Timestamp")]
    new = [_field("id", "int64"), _field("price", "bytes", DECIMAL, scale="4", **{"connect.decimal.precision": "12"}),
           _field("at", "int64", "io.debezium.time.MicroTimestamp")]
    truth: dict[int, tuple[Decimal, datetime]] = {}
    first, second = [], []
    for i in range(1, 9):  # before the ALTER: scale 2, milliseconds
        cents, ms = rng.randrange(-10 ** 9, 10 ** 9), rng.randrange(-10 ** 12, 4 * 10 ** 12)
        first.append(_event(i, "c", old, {"id": i, "price": _b64(cents), "at": ms}))
        truth[i] = (_scaled(cents, 2), _ts(ms * 1000))
    first += [_event(9, "c", old, {"id": 100, "price": _b64(-5), "at": 1704105000123})]  # the tester's -0.05
    truth[100] = (Decimal("-0.05"), datetime(2024, 1, 1, 10, 30, 0, 123000, tzinfo=timezone.utc))
    for i in range(1, 6):  # after it: scale 4, microseconds; updates of older rows and new rows
        key = i if i % 2 else 100 + i
        units, us = rng.randrange(-10 ** 11, 10 ** 11), rng.randrange(-10 ** 15, 4 * 10 ** 15)
        second.append(_event(20 + i, "u" if key in truth else "c", new, {"id": key, "price": _b64(units), "at": us}))
        truth[key] = (_scaled(units, 4), _ts(us))

    fields = [_field("id", "int64"),
              _field("big", "bytes", DECIMAL, scale="0", **{"connect.decimal.precision": "20"}),  # BIGINT UNSIGNED
              _field("wide", "bytes", DECIMAL, scale="2", **{"connect.decimal.precision": "38"}),
              _field("ns", "int64", "io.debezium.time.NanoTimestamp"),
              _field("it's", "string"), _field("b\\s", "string"), _field("q\"x'y", "string")]
    wide = [rng.randrange(-10 ** 36, 10 ** 36) for _ in range(6)] + [10 ** 36 - 1, -(10 ** 36), 5, -5, -128, 128]
    wide_truth = {}
    for i, units in enumerate(wide, start=1):
        big = rng.choice([2 ** 63, 2 ** 64 - 1, rng.randrange(2 ** 64)])
        ns = rng.randrange(-10 ** 18, 4 * 10 ** 18)
        (first if i <= 6 else second).append(_event(
            40 + i, "c", fields, {"id": i, "big": _b64(big), "wide": _b64(units), "ns": ns,
                                  "it's": f"a{i}", "b\\s": f"b{i}", "q\"x'y": f"c{i}"}, table="wide"))
        wide_truth[i] = {"id": i, "big": Decimal(big), "wide": _scaled(units, 2),
                         "ns": _ts(ns // 1000), "it's": f"a{i}", "b\\s": f"b{i}", "q\"x'y": f"c{i}"}
    second.append(_event(90, "c", fields, {"id": 90, "big": _b64(10 ** 20), "wide": _b64(10 ** 38), "ns": 0,
                                           "it's": "x", "b\\s": "y", "q\"x'y": "z"}, table="wide"))  # beyond both

    def check(cfg) -> None:  # type: ignore[no-untyped-def]
        for table, expected, got in (
                ("orders", truth, {k: (r["price"], r["at"]) for k, r in _rows(cfg, "orders").items()}),
                ("wide", wide_truth, _rows(cfg, "wide"))):
            assert got == expected, f"seed {seed} ({cfg.name}, {table}): " + str(
                {k: (got.get(k), expected.get(k)) for k in set(got) | set(expected) if got.get(k) != expected.get(k)})
        reasons = _quarantined(cfg)
        assert len(reasons) == 1 and "column big: value" in reasons[0] and "decimal(20,0)" in reasons[0] \
            and "column wide: value" in reasons[0], (seed, reasons)

    _in_one_and_in_two_runs(spark, tmp_path, [first, second], check)


def test_hints_without_a_lossless_merge_are_refused_not_stored_changed(spark, tmp_path):
    """Verification tester, same day: hints that do not merge were decoded by their own decoder
    and cast into the first hint's type: a MicroTimestamp cut to a date, a Decimal rounded to a
    double, scale 4 rounded into decimal(38,2), empty base64 stored as 0, an epoch-day number
    into an existing timestamp column read as seconds (1970). Each such value is quarantined
    now; values the column holds exactly are stored."""
    cfg = _pipeline(tmp_path, "mixed")
    d38 = {"connect.decimal.precision": "38"}
    date_f = [_field("id", "int64"), _field("d", "int32", "io.debezium.time.Date")]
    ts_f = [_field("id", "int64"), _field("d", "int64", "io.debezium.time.MicroTimestamp")]
    dbl_f = [_field("id", "int64"), _field("d", "double")]
    dec_f = [_field("id", "int64"), _field("d", "bytes", DECIMAL, scale="2", **{"connect.decimal.precision": "20"})]
    s2 = [_field("id", "int64"), _field("d", "bytes", DECIMAL, scale="2", **d38)]
    s4 = [_field("id", "int64"), _field("d", "bytes", DECIMAL, scale="4", **d38)]
    lines = [
        _event(1, "c", date_f, {"id": 1, "d": 19723}),                           # date: stored
        _event(2, "c", ts_f, {"id": 2, "d": 1704105000123456}),                  # refused
        _event(3, "c", dbl_f, {"id": 1, "d": 1.5}, table="wide"),                # double: stored
        _event(4, "c", dec_f, {"id": 2, "d": _b64(12345678901234567891)}, table="wide"),  # refused
        _event(5, "c", s2, {"id": 10, "d": _b64(150)}),                          # 1.50
        _event(6, "c", s4, {"id": 11, "d": _b64(15000)}),                        # 1.5000: exact, stored
        _event(7, "c", s4, {"id": 12, "d": _b64(12345)}),                        # 1.2345: refused
        _event(8, "c", s2, {"id": 13, "d": ""}),                                 # no bytes: refused
    ]
    for i in (4, 5, 6, 7):  # two decimal scales without a lossless merge: table dec
        lines[i] = lines[i].replace('"table": "orders"', '"table": "dec"')
    # two hints of one type family, one of them cast plainly: the format-decoded one is not
    # checked as if it were a plain cast (a ms number is not a "timestamp string")
    zoned = [_field("id", "int64"), _field("d", "string", "io.debezium.time.ZonedTimestamp")]
    connect_ms = [_field("id", "int64"), _field("d", "int64", "org.apache.kafka.connect.data.Timestamp")]
    lines += [_event(9, "c", zoned, {"id": 1, "d": "2024-01-01T10:30:00.5Z"}, table="ts"),
              _event(10, "c", connect_ms, {"id": 2, "d": 1704105000123}, table="ts")]
    (cfg.landing_path / "000.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_pipeline(cfg, spark=spark)
    from datetime import date

    assert {k: r["d"] for k, r in _rows(cfg, "ts").items()} == {
        1: datetime(2024, 1, 1, 10, 30, 0, 500000, tzinfo=timezone.utc),
        2: datetime(2024, 1, 1, 10, 30, 0, 123000, tzinfo=timezone.utc)}

    assert {k: r["d"] for k, r in _rows(cfg, "orders").items()} == {1: date(2024, 1, 1)}
    assert {k: r["d"] for k, r in _rows(cfg, "wide").items()} == {1: 1.5}  # the Decimal: refused
    dec = {k: r["d"] for k, r in _rows(cfg, "dec").items()}
    assert dec == {10: Decimal("1.50"), 11: Decimal("1.50")}, dec  # 1.5000 held exactly by (38,2)
    reasons = _quarantined(cfg)
    assert len(reasons) == 4 and all("is not a valid" in r for r in reasons), reasons
    # an existing timestamp column and an epoch-day number: not read as seconds
    later = _pipeline(tmp_path, "later")
    (later.landing_path / "000.json").write_text(_event(1, "c", ts_f, {"id": 1, "d": 1704105000123456}) + "\n")
    run_pipeline(later, spark=spark)
    (later.landing_path / "001.json").write_text(_event(2, "c", date_f, {"id": 2, "d": 19723}) + "\n")
    run_pipeline(later, spark=spark)
    assert set(_rows(later, "orders")) == {1} and len(_quarantined(later)) == 1, _rows(later, "orders")


def _mysql_time(micros: int) -> str:
    """MySQL's TIME text of a signed duration: ``[-]HH:MM:SS`` with at least two hour digits
    (TIME spans -838:59:59 .. 838:59:59), a fraction without trailing zeros."""
    sign, rest = ("-" if micros < 0 else ""), abs(micros)
    hours, rest = divmod(rest, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, frac = divmod(rest, 1_000_000)
    text = f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
    return text + (f".{frac:06d}".rstrip("0") if frac else "")


def test_time_columns_keep_every_hour_digit(spark, tmp_path):
    """``Time`` (ms), ``MicroTime`` (µs) and ``NanoTime`` (ns) over MySQL's whole TIME range:
    100 hours and more were stored with the hour cut to two digits (100:00:00 as 10:00:00,
    838:59:59 as 83:59:59), exit 0 (tester, 2026-11-28)."""
    seed = int(os.environ.get("CDC_SEED") or random.SystemRandom().randrange(10 ** 6))
    rng = random.Random(seed)
    top = 838 * 3_600_000_000 + 59 * 60_000_000 + 59_999_999  # 838:59:59.999999
    edges = [0, 1, -1, 99 * 3_600_000_000, 100 * 3_600_000_000, -100 * 3_600_000_000, top, -top,
             3_600_000_000 * 24, 123 * 3_600_000_000 + 4_000_500]
    micros = edges + [rng.randrange(-top, top + 1) for _ in range(30)]
    fields = [_field("id", "int64"), _field("ms", "int32", "io.debezium.time.Time"),
              _field("us", "int64", "io.debezium.time.MicroTime"),
              _field("ns", "int64", "io.debezium.time.NanoTime")]
    lines, truth = [], {}
    for i, us in enumerate(micros, start=1):
        ms = max(min(us // 1000, 2 ** 31 - 1), -(2 ** 31))  # int32: Time reaches +-596 h
        lines.append(_event(i, "c", fields, {"id": i, "ms": ms, "us": us, "ns": us * 1000}, table="tm"))
        truth[i] = {"id": i, "ms": _mysql_time(ms * 1000), "us": _mysql_time(us), "ns": _mysql_time(us)}
    cfg = _pipeline(tmp_path, "times")
    (cfg.landing_path / "000.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_pipeline(cfg, spark=spark)
    got = _rows(cfg, "tm")
    bad = {k: (got.get(k), truth[k]) for k in truth if got.get(k) != truth[k]}
    assert not bad, f"seed {seed}: {len(bad)} of {len(truth)} rows differ, e.g. {list(bad.items())[:3]}"
    assert _quarantined(cfg) == [], seed


def test_epoch_values_beyond_years_1_to_9999_are_quarantined_not_a_failed_run(spark, tmp_path):
    """An epoch value past Spark's range (``Timestamp`` ms x 1000 beyond int64) failed the whole
    run (ANSI long overflow) on every later run too; one beyond year 9999 but inside Spark's
    range would be stored as a date no reader of the table can load. Both are quarantined; the
    first and last microsecond of years 1 to 9999 are stored exactly."""
    first_us = (datetime(1, 1, 1, tzinfo=timezone.utc) - EPOCH) // timedelta(microseconds=1)
    last_us = ((datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc) - EPOCH)
               // timedelta(microseconds=1))
    fields = [_field("id", "int64"), _field("ms", "int64", "io.debezium.time.Timestamp"),
              _field("us", "int64", "io.debezium.time.MicroTimestamp"),
              _field("ns", "int64", "io.debezium.time.NanoTimestamp"),
              _field("d", "int32", "io.debezium.time.Date")]
    first_day, last_day = first_us // 86_400_000_000, last_us // 86_400_000_000
    ok = {1: (first_us // 1000, first_us, None, first_day), 2: (last_us // 1000, last_us, None, last_day)}
    bad = {3: {"ms": 2 ** 63 - 1}, 4: {"ms": -(2 ** 63)}, 5: {"us": 2 ** 63 - 1},
           6: {"us": last_us + 1}, 7: {"ms": last_us // 1000 + 1}, 8: {"us": first_us - 1},
           9: {"d": 2 ** 31 - 1}, 10: {"d": -(2 ** 31)}, 11: {"d": last_day + 1}}
    lines = []
    for i, (ms, us, ns, d) in ok.items():
        lines.append(_event(i, "c", fields, {"id": i, "ms": ms, "us": us, "ns": ns, "d": d}, table="ts"))
    for i, value in bad.items():
        lines.append(_event(i, "c", fields, {"id": i, **value}, table="ts"))
    cfg = _pipeline(tmp_path, "epochs")
    (cfg.landing_path / "000.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_pipeline(cfg, spark=spark)
    got = _rows(cfg, "ts")
    assert sorted(got) == [1, 2], (sorted(got), _quarantined(cfg))
    for i, (ms, us, ns, d) in ok.items():
        assert got[i] == {"id": i, "ms": _ts(ms * 1000), "us": _ts(us), "ns": None,
                          "d": (EPOCH + timedelta(days=d)).date()}, got[i]
    reasons = _quarantined(cfg)
    assert sorted(r.split(":")[0] for r in reasons) == sorted(
        f"table ts column {c}" for v in bad.values() for c in v), reasons
