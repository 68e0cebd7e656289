"""A number with more than 38 significant digits in a double column is quarantined, not stored
rounded (tester, 2026-11-28: a MariaDB DECIMAL(65,0) captured as Maxwell JSON was stored as a
double, 99...9 with 65 digits as 1e65, exit 0). Spark parses such a number as a double before any
type applies (its decimal holds 38 digits), so the job checks the event's text.

Truth: Python's ``decimal`` counts each value's significant digits (> 38: quarantined naming the
column; otherwise stored as the nearest double, ``float(text)``); a JSON string holding such
digits after a quoted name (escaped JSON inside a string) is not a number and is stored as is.
Random values, seed printed on failure.
"""

from __future__ import annotations

import json
import random
from decimal import Decimal

from deltalake import DeltaTable
from job_helpers import land, pipeline

from cdc_lake.cdc.job import run_pipeline


def _line(i: int, typ: str, data: dict, raw_big: str | None = None) -> str:
    row = json.dumps({**data, "big": "__BIG__"} if raw_big is not None else data)
    if raw_big is not None:  # the number's text exactly as drawn (json would go through float)
        row = row.replace('"__BIG__"', raw_big)
    return ('{"database": "shop", "table": "orders", "type": "%s", "ts": %d, "xid": %d, '
            '"xoffset": 0, "position": "mysql-bin.000001:%d", "data": %s}'
            % (typ, 1795000000 + i, 100 + i, 1000 + i, row))


def _number(rng: random.Random) -> str:
    digits = rng.choice([rng.randint(1, 30), rng.randint(39, 65)])
    text = str(rng.randint(1, 9)) + "".join(str(rng.randint(0, 9)) for _ in range(digits - 1))
    point = rng.randint(0, len(text))
    if 0 < point < len(text) and rng.random() < 0.5:
        text = text[:point] + "." + text[point:]
    if rng.random() < 0.3:
        text = "0.000" + text.replace(".", "")
    return ("-" if rng.random() < 0.3 else "") + text


def _significant(text: str) -> int:
    return len(Decimal(text).as_tuple().digits)


def test_numbers_beyond_38_digits_are_quarantined_not_rounded(spark, tmp_path):
    seed = random.randrange(10**9)
    rng = random.Random(seed)
    cfg = pipeline(tmp_path)
    values = {i: _number(rng) for i in range(2, 40)}
    lines = [_line(1, "insert", {"id": 1, "status": "a"}, raw_big="1.5")]  # a double column
    lines += [_line(i, "insert", {"id": i, "status": f"s{i}"}, raw_big=v) for i, v in values.items()]
    big = "9" * rng.randint(39, 60)
    note = 'inner json: {"x": %s}' % big  # text, not a number
    lines.append(_line(50, "insert", {"id": 50, "status": note}, raw_big="2.5"))
    lines.append(_line(51, "insert", {"id": 51, "status": "gone"}, raw_big="3.5"))
    lines.append(_line(52, "delete", {"id": 51, "status": "gone"}, raw_big=big))  # a delete needs the key only
    land(tmp_path / "landing", "maxwell-1.json", *lines)
    summary = run_pipeline(cfg, spark=spark, run_id="r1")

    too_long = {i for i, v in values.items() if _significant(v) > 38}
    stored = {r["id"]: r for r in DeltaTable(str(cfg.tables["orders"].path)).to_pyarrow_table().to_pylist()}
    quarantined = DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().to_pylist()
    q_ids = {json.loads(r["raw_line"])["data"]["id"]: r["reason"] for r in quarantined}
    ctx = f"seed {seed}: {values}"
    assert set(q_ids) == too_long, ctx
    assert all("column big: a number with more than 38 significant digits" in r
               for r in q_ids.values()), (ctx, q_ids)
    assert set(stored) == {1, 50} | (set(values) - too_long), ctx
    for i in set(values) - too_long:
        assert stored[i]["big"] == float(values[i]), (ctx, i)
    assert stored[50]["status"] == note and stored[50]["big"] == 2.5
    assert summary["quarantined"] == len(too_long)
