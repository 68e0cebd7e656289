"""Binlog order of Maxwell rows without ``xoffset``, and exactness of boolean/date/timestamp
columns (a value is never stored changed).

* Old Maxwell versions write no ``xoffset``; only a transaction's last row has
  ``"commit": true``. Every row of one transaction then shares (``ts``, ``xid``) or position: the
  row's place in its landing file is its order (``events.finalize_order``). Checked against a
  reference model written here (latest image per key in line order; no product code), on random
  histories: ``CDC_ORDER_SEED=<seed>`` reproduces a failing one (the seed is in the message).
* A boolean column takes JSON booleans, ``"true"``/``"false"`` and 0/1; a date column takes a
  full date with no time part; a timestamp column no sub-microsecond digits it would drop.
  Anything else is quarantined with the documented reason, never stored changed.

Expected values are written by hand or by the model below, not computed by the job's code.
"""

from __future__ import annotations

import json
import os
import random
from datetime import date, datetime
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from cdc_lake.cdc.job import run_pipeline
from cdc_lake.config import load_pipeline

TABLES = ("t0", "t1", "t2", "t3", "t4", "t5")
YAML = """pipeline: {name}
source: {{format: maxwell, path: landing, database: shop, max_files_per_trigger: 2}}
storage: {{root: lake}}
engine: {{name: deltalake}}
tables:
{tables}"""


def _pipeline(tmp_path: Path, name: str, tables: dict[str, str]):  # type: ignore[no-untyped-def]
    d = tmp_path / name
    (d / "landing").mkdir(parents=True)
    body = "".join(f"  {t}: {{keys: [id]{extra}}}\n" for t, extra in tables.items())
    (d / "p.yaml").write_text(YAML.format(name=name, tables=body), encoding="utf-8")
    return load_pipeline(d / "p.yaml")


def _land(cfg, file: str, lines: list[str]) -> None:  # type: ignore[no-untyped-def]
    tmp = cfg.landing_path / f".{file}.tmp"
    tmp.write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
    os.replace(tmp, cfg.landing_path / file)


def _rows(path: Path) -> dict[Any, dict[str, Any]]:
    if not DeltaTable.is_deltatable(str(path)):
        return {}
    return {r["id"]: {k: v for k, v in r.items() if not k.startswith("_")}
            for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()}


def _quarantine(cfg) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    p = cfg.quarantine_path
    if not DeltaTable.is_deltatable(str(p)):
        return []
    return DeltaTable(str(p)).to_pyarrow_table().to_pylist()


def _mw(table: str, typ: str, data: dict[str, Any], *, ts: int, xid: int | None = None,
        position: str | None = None, commit: bool = False, old: dict | None = None) -> str:
    """A Maxwell line as old Maxwell versions write it: no ``xoffset``."""
    ev: dict[str, Any] = {"database": "shop", "table": table, "type": typ, "ts": ts}
    if xid is not None:
        ev["xid"] = xid
    if position is not None:
        ev["position"] = position
    if commit:
        ev["commit"] = True
    ev["primary_key_columns"] = ["id"]
    ev["data"] = data
    if old is not None:
        ev["old"] = old
    return json.dumps(ev)


# ------------------------------------------------------------------------ reference model
def _reference(lines: list[str]) -> dict[str, dict[Any, dict[str, Any]]]:
    """Final state per table: apply the change lines in line order (landing order), latest
    image per key. Valid for these histories: transactions never interleave and each lies in
    one file, files land in binlog order."""
    state: dict[str, dict[Any, dict[str, Any]]] = {}
    for ln in lines:
        e = json.loads(ln)
        t = state.setdefault(e["table"], {})
        if e["type"] == "delete":
            t.pop(e["data"]["id"], None)
        else:
            t[e["data"]["id"]] = dict(e["data"])
    return state


# ------------------------------------------------------------------------ random histories
def _history(rng: random.Random, table: str, mode: str, base_ts: int) -> list[list[str]]:
    """Transactions (lists of lines) of one table. ``mode``: ``xid`` (ts + xid, several
    transactions per ts), ``noxid`` (ts only, one transaction per ts), ``position`` (one
    position per transaction). No two lines are byte-identical (a value counts changes)."""
    live: dict[int, dict[str, Any]] = {}
    txs: list[list[str]] = []
    ts, xid, n = base_ts, rng.randrange(1, 1000), 0
    for tx_no in range(rng.randint(3, 7)):
        if mode != "xid" or rng.random() < 0.5:
            ts += rng.randint(1, 3)
        xid += rng.randint(1, 5)
        lines: list[str] = []
        size = rng.randint(2, 6)
        for i in range(size):
            n += 1
            key = rng.randint(1, 3)
            if key in live:
                typ = rng.choice(["update", "update", "delete"])
            else:
                typ = "insert"
            if typ == "delete":
                data = live.pop(key)
                old = None
            else:
                data = {"id": key, "name": f"{table}-v{n}", "qty": rng.randint(0, 9)}
                old = ({"name": live[key]["name"]} if typ == "update" else None)
                live[key] = data
            lines.append(_mw(table, typ, data, ts=ts,
                             xid=xid if mode in ("xid", "position") else None,
                             position=(f"mysql-bin.000001:{1000 + 100 * tx_no}"
                                       if mode == "position" else None),
                             commit=i == size - 1, old=old))
        txs.append(lines)
    return txs


def _files(rng: random.Random) -> list[list[str]]:
    """Landing files of all tables' histories: each transaction whole in one file, files in
    binlog order per table (tables are independent)."""
    per_table = [_history(rng, t, mode, 1_795_000_000)
                 for t, mode in zip(TABLES, ["xid", "noxid", "position", "xid", "noxid", "xid"])]
    files: list[list[str]] = []
    cursors = [0] * len(per_table)
    while any(c < len(h) for c, h in zip(cursors, per_table)):
        body: list[str] = []
        for i, h in enumerate(per_table):
            take = rng.randint(0, 2)
            for tx in h[cursors[i]:cursors[i] + take]:
                body.extend(tx)
            cursors[i] = min(len(h), cursors[i] + take)
        if body:
            files.append(body)
    return files


def test_maxwell_without_xoffset_random_histories(spark, tmp_path):
    """Random old-Maxwell histories (no xoffset; equal ts/xid inside a transaction, some without
    xid, some positioned), landed in several files and two runs, equal the line-order model."""
    seed = int(os.environ.get("CDC_ORDER_SEED") or random.SystemRandom().randrange(2**32))
    rng = random.Random(seed)
    files = _files(rng)
    cfg = _pipeline(tmp_path, "rand", {t: "" for t in TABLES})
    half = max(1, len(files) // 2)
    all_lines: list[str] = []
    for run, chunk in (("r1", files[:half]), ("r2", files[half:])):
        for i, body in enumerate(chunk):
            _land(cfg, f"maxwell-{len(all_lines):06d}-{i}.json", body)
            all_lines.extend(body)
        if chunk:
            summary = run_pipeline(cfg, spark=spark, run_id=run)
            assert summary["status"] == "succeeded", (seed, summary)
    expected = _reference(all_lines)
    hint = (f"seed {seed}: reproduce with CDC_ORDER_SEED={seed} pytest "
            "tests/test_order_and_exactness.py -k random")
    assert _quarantine(cfg) == [], hint
    for t in TABLES:
        got = _rows(cfg.tables[t].path)
        assert got == expected.get(t, {}), f"{hint}; table {t}\n" + "\n".join(
            all_ln for all_ln in all_lines if f'"table": "{t}"' in all_ln)


def _tie_lines(xid: int | None) -> list[str]:
    kw: dict[str, Any] = {"ts": 600, "xid": xid}
    return [_mw("t0", "insert", {"id": 1, "name": "first"}, **kw),
            _mw("t0", "update", {"id": 1, "name": "second"}, old={"name": "first"}, **kw),
            _mw("t0", "insert", {"id": 2, "name": "x"}, **kw),
            _mw("t0", "delete", {"id": 2, "name": "x"}, **kw),
            _mw("t0", "insert", {"id": 3, "name": "y"}, commit=True, **kw)]


def test_maxwell_without_xoffset_one_transaction(spark, tmp_path):
    """The issue's case: one transaction (ts 600, xid 7 or no xid), no xoffset: later rows win;
    a re-delivered copy of the file changes nothing; the DDL log gets no placeholder."""
    cfg = _pipeline(tmp_path, "tie", {"t0": "", "t1": ""})
    ddl = json.dumps({"database": "shop", "table": "t0", "type": "table-alter", "ts": 600,
                      "sql": "ALTER TABLE t0 ADD COLUMN z INT"})
    _land(cfg, "a.json", [*_tie_lines(7), ddl])
    _land(cfg, "b.json", [ln.replace('"t0"', '"t1"') for ln in _tie_lines(None)])
    assert run_pipeline(cfg, spark=spark, run_id="r1")["status"] == "succeeded"
    expected = {1: {"id": 1, "name": "second"}, 3: {"id": 3, "name": "y"}}
    assert _rows(cfg.tables["t0"].path) == expected
    assert _rows(cfg.tables["t1"].path) == expected
    seqs = sorted(r["_cdc_seq"] for r in DeltaTable(str(cfg.tables["t0"].path)).to_pyarrow_table()
                  .to_pylist())
    # the xoffset slot: "00" + the line's ordinal (update = 2nd line), the commit row last
    assert seqs == ["V.0.000000000600.00000000000000000007.0000000002.1",
                    "V.0.000000000600.00000000000000000007.9999999999.1"], seqs
    d = DeltaTable(str(cfg.ddl_log_path)).to_pyarrow_table().to_pylist()
    assert [r["_cdc_seq"] for r in d] == ["V.0.000000000600.00000000000000000000.0000000000"]
    # the same file again under another name: same sequence values, nothing changes
    _land(cfg, "a2.json", _tie_lines(7))
    s2 = run_pipeline(cfg, spark=spark, run_id="r2")
    assert s2["status"] == "succeeded"
    t0 = s2["tables"].get("t0", {})
    assert (t0.get("inserted", 0), t0.get("updated", 0), t0.get("deleted", 0)) == (0, 0, 0), s2
    assert _rows(cfg.tables["t0"].path) == expected


def test_order_keys_with_xoffset_unchanged_and_survey_gate(spark):
    """Rows with ``xoffset`` keep today's order keys byte for byte (stored ``_cdc_seq`` values of
    existing lakes), and the survey asks for the ordinal window only where a row needs it."""
    from cdc_lake.cdc.discovery import survey
    from cdc_lake.cdc.formats import parser_for

    lines = [
        '{"database":"shop","table":"a","type":"insert","ts":1795000001,"xid":7,"xoffset":2,'
        '"data":{"id":1}}',
        '{"database":"shop","table":"a","type":"update","ts":1795000001,"xid":7,"commit":true,'
        '"data":{"id":1}}',
        '{"database":"shop","table":"a","type":"insert","ts":5,"xid":9,"xoffset":0,'
        '"position":"mysql-bin.000003:1234","data":{"id":2}}',
        '{"database":"shop","table":"a","type":"table-alter","ts":5,"sql":"ALTER TABLE a"}',
        '{"database":"shop","table":"b","type":"insert","ts":5,"position":"mysql-bin.000004:77",'
        '"data":{"id":3}}',
        '{"database":"shop","table":"c","type":"insert","ts":5,"xoffset":1,"data":{"id":4}}',
    ]
    df = spark.createDataFrame([("f.json", ln) for ln in lines], "_file string, _line string")
    ev = parser_for("maxwell")(df)
    seqs = [r.seq for r in ev.collect()]
    assert seqs == ["V.0.001795000001.00000000000000000007.0000000002",
                    "V.0.001795000001.00000000000000000007.9999999999",
                    "V.1.0000000003.00000000000000001234.0000000000",
                    "V.0.000000000005.00000000000000000000.0000000000",
                    "V.1.0000000004.00000000000000000077.00#",
                    "V.0.000000000005.00000000000000000000.0000000001"], seqs
    from pyspark.sql import functions as F
    seen = survey(ev.withColumn("_target", F.col("tbl")), {"a", "b", "c"})
    assert seen.ordinal_tables == {"b"}


# ------------------------------------------------------------------------ exactness
def test_boolean_date_timestamp_values_are_never_stored_changed(spark, tmp_path):
    """Columns fixed by an earlier batch: boolean (JSON true/false), date ("2024-01-01"),
    timestamp. A later value the column would store changed is quarantined with the reason
    naming table, column, value and type; exact forms are stored."""
    cfg = _pipeline(tmp_path, "exact", {"t0": ""})

    def ev(i: int, **data: Any) -> str:
        return json.dumps({"database": "shop", "table": "t0", "type": "insert", "ts": 100 + i,
                           "xid": i, "xoffset": 0, "position": f"mysql-bin.000001:{1000 + i}",
                           "primary_key_columns": ["id"], "data": {"id": i, **data}})

    _land(cfg, "a.json", [ev(1, flag=True, d="2024-01-01", at="2024-01-01 10:30:00")])
    assert run_pipeline(cfg, spark=spark, run_id="r1")["status"] == "succeeded"
    dt = DeltaTable(str(cfg.tables["t0"].path))
    types = {f.name: f.type.type for f in dt.schema().fields if hasattr(f.type, "type")}
    assert (types["flag"], types["d"], types["at"]) == ("boolean", "date", "timestamp"), types

    _land(cfg, "b.json", [
        ev(2, flag=2),                                   # would be stored as true
        ev(3, flag="yes"),                               # would be stored as true
        ev(4, flag="true"), ev(5, flag=0), ev(6, flag=False), ev(7, flag=1),   # exact
        ev(8, d="2024-01-01 10:30:00"),                  # time dropped
        ev(9, d="2024-01-01T00:00:00"),                  # a time part: not a date
        ev(10, d="2024-02-29"),                          # exact
        ev(11, at="2024-01-01 10:30:00.1234567"),        # 100 ns dropped
        ev(12, at="2024-01-01 10:30:00.123456"),         # exact (microseconds)
        ev(13, d="not a date"),                          # not valid (existing reason)
        ev(14, at="9999-12-31T23:30:00-01:00"),          # year 10000 in UTC (tester)
        ev(15, at="0001-01-01T00:30:00+01:00"),          # year 0 in UTC
        ev(16, at="9999-12-31T23:59:59.999999Z"),        # exact: the last microsecond
        ev(17, at="0001-01-01T00:00:00Z"),               # exact: the first
        # a zone by name is no fixed offset (tester): PST read as Los Angeles (PDT that night),
        # CST as US Central, a repeated local hour resolved silently
        ev(18, at="2026-11-01 01:30:00 PST"),
        ev(19, at="2026-11-01 01:30:00 CST"),
        ev(20, at="2026-11-01 01:30:00 America/Los_Angeles"),
        ev(21, at="2026-11-01T01:30:00-08:00"),          # exact: an offset
        ev(22, at="2026-11-01 01:30:00 UTC"),            # exact: UTC by name
        ev(23, at="2026-11-01 01:30:00 GMT+08:00"),      # exact: an offset from GMT
    ])
    s2 = run_pipeline(cfg, spark=spark, run_id="r2")
    assert s2["status"] == "succeeded"
    rows = _rows(cfg.tables["t0"].path)
    assert set(rows) == {1, 4, 5, 6, 7, 10, 12, 16, 17, 21, 22, 23}, sorted(rows)
    assert [rows[i]["at"].replace(tzinfo=None) for i in (21, 22, 23)] == [
        datetime(2026, 11, 1, 9, 30), datetime(2026, 11, 1, 1, 30), datetime(2026, 10, 31, 17, 30)]
    assert [rows[i]["at"].replace(tzinfo=None) for i in (16, 17)] == [
        datetime(9999, 12, 31, 23, 59, 59, 999999), datetime(1, 1, 1)]
    assert [rows[i]["flag"] for i in (1, 4, 5, 6, 7)] == [True, True, False, False, True]
    assert rows[10]["d"] == date(2024, 2, 29)
    assert rows[12]["at"].replace(tzinfo=None) == datetime(2024, 1, 1, 10, 30, 0, 123456)
    reasons = {json.loads(r["raw_line"])["data"]["id"]: r["reason"] for r in _quarantine(cfg)}
    assert set(reasons) == {2, 3, 8, 9, 11, 13, 14, 15, 18, 19, 20}, reasons
    assert ('value "2026-11-01 01:30:00 PST" does not fit column type timestamp exactly' in reasons[18]
            and "named zone" in reasons[18]), reasons[18]
    assert ('table t0 column at: value "9999-12-31T23:30:00-01:00" does not fit column type '
            "timestamp exactly") in reasons[14], reasons[14]
    assert ("table t0 column flag: value 2 does not fit column type boolean exactly "
            "(would be stored as true)") in reasons[2]
    assert ('table t0 column flag: value "yes" does not fit column type boolean exactly '
            "(would be stored as true)") in reasons[3]
    assert ('table t0 column d: value "2024-01-01 10:30:00" does not fit column type date '
            "exactly (would be stored as 2024-01-01)") in reasons[8]
    assert ('table t0 column d: value "2024-01-01T00:00:00" does not fit column type date '
            "exactly (would be stored as 2024-01-01)") in reasons[9]
    assert ('table t0 column at: value "2024-01-01 10:30:00.1234567" does not fit column type '
            "timestamp exactly (would be stored as 2024-01-01 10:30:00.123456)") in reasons[11]
    assert 'column d: value "not a date" is not a valid date' in reasons[13]
