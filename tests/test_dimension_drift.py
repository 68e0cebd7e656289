"""Dimension refresh: a snapshot value is never stored changed when a column's type drifts.

A CSV without ``schema:`` is inferred anew every day; a declared ``schema:`` type may not hold
the file's values. Either the table's column is widened losslessly (``int -> double``) and the
value stored as it is in the file, or the run stops with exit 3 naming file, column, values and
types, and writes nothing. Expected values are computed here from the snapshot files' text
(``decimal.Decimal``), not by ``cdc_lake``; the table is read back with delta-rs.
"""

from __future__ import annotations

import csv
import importlib.util
from decimal import Decimal, InvalidOperation
from pathlib import Path

import pytest
from deltalake import DeltaTable

REPO = Path(__file__).resolve().parents[1]
D1, D2 = "2026-01-01", "2026-01-02"


def _job():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("dimension_refresh", REPO / "spark_jobs" / "dimension_refresh.py")
    job = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(job)  # type: ignore[union-attr]
    return job


def _setup(tmp: Path, *, scd: int = 1, schema: str = "") -> Path:
    (tmp / "snaps").mkdir()
    f = tmp / "dim.yaml"
    f.write_text("kind: dimension\npipeline: weights\nsnapshots: {path: snaps, format: csv}\n"
                 f"keys: [id]\nscd: {scd}\n{schema}table: lake/weights\nengine: {{name: deltalake}}\n",
                 encoding="utf-8")
    return f


def _write(tmp: Path, day: str, text: str) -> Path:
    f = tmp / "snaps" / f"{day}.csv"
    f.write_text(text, encoding="utf-8")
    return f


def _csv(f: Path) -> dict[int, dict[str, str]]:
    with open(f, newline="", encoding="utf-8") as fh:
        return {int(r["id"]): r for r in csv.DictReader(fh)}


def _rows(tmp: Path) -> list[dict]:
    return DeltaTable(str(tmp / "lake" / "weights")).to_pyarrow_table().to_pylist()


def _exact(text: str, sql: str) -> bool:
    """Whether the CSV text ``text`` is held exactly by the Spark type ``sql`` (plain Python)."""
    try:
        d = Decimal(text)
    except InvalidOperation:
        return False
    if sql in ("int", "bigint"):
        bits = 32 if sql == "int" else 64
        return d == d.to_integral_value() and -(2 ** (bits - 1)) <= d < 2 ** (bits - 1)
    assert sql == "double"
    return Decimal(float(text)) == d


@pytest.mark.parametrize("scd", [1, 2])
def test_inferred_int_then_fraction_widens_and_stores_the_value(spark, tmp_path, capsys, scd):
    """Day 1 weight 1 (inferred int), day 2 1.5 (inferred double): the column becomes double and
    1.5 is stored (before: cast to the table's int, counted unchanged, 1 kept)."""
    job, yaml = _job(), _setup(tmp_path, scd=scd)
    f1 = _write(tmp_path, D1, "id,cat,weight\n1,A,1\n2,B,2\n")
    f2 = _write(tmp_path, D2, "id,cat,weight\n1,A,1.5\n2,B,2\n")
    assert job.main(["--pipeline", str(yaml), "--date", D1]) == 0
    assert job.main(["--pipeline", str(yaml), "--date", D2]) == 0
    out = capsys.readouterr().out
    day1 = {k: float(Decimal(r["weight"])) for k, r in _csv(f1).items()}
    day2 = {k: float(Decimal(r["weight"])) for k, r in _csv(f2).items()}
    changed = {k for k in day2 if day2[k] != day1[k]}
    assert changed == {1}, "the fixture changes key 1 only"
    rows = _rows(tmp_path)
    if scd == 1:
        got = {r["id"]: (r["weight"], str(r["_snapshot_date"])) for r in rows}
        assert got == {k: (v, D2 if k in changed else D1) for k, v in day2.items()}, got
    else:
        got = {(r["id"], r["weight"], r["_is_current"]) for r in rows}
        want = {(k, v, True) for k, v in day2.items()} | {(k, day1[k], False) for k in changed}
        assert got == want, got
    assert f'"updated": {len(changed)}' in out and f'"unchanged": {len(day2) - len(changed)}' in out, out
    assert "weight int -> double" in out and '"widened": {"weight": "int -> double"}' in out, out
    dt = DeltaTable(str(tmp_path / "lake" / "weights"))
    assert dt.transaction_version("dimension-weights") == 20260102
    assert dt.metadata().configuration.get("delta.enableChangeDataFeed") == "true"


CASES = {
    # name: (schema line, day-1 text, day-2 text, the table's type, why)
    "inferred_text_into_int": ("", "id,cat,weight\n1,A,1\n2,B,2\n", "id,cat,weight\n1,A,1\n2,B,heavy\n",
                               "int", "no lossless widening from int to string"),
    "inferred_fraction_into_bigint": ("", "id,cat,weight\n1,A,3000000000\n2,B,2\n",
                                      "id,cat,weight\n1,A,3000000000\n2,B,1.5\n", "bigint",
                                      "bigint -> double is not lossless (2^53)"),
    "declared_int": ("schema: {id: int, cat: string, weight: int}\n", "id,cat,weight\n1,A,1\n2,B,2\n",
                     "id,cat,weight\n1,A,1.5\n2,B,heavy\n3,C,7\n", "int", "declared type"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_value_the_column_cannot_hold_stops_the_run_and_writes_nothing(spark, tmp_path, capsys, case):
    schema, text1, text2, sql, _why = CASES[case]
    job, yaml = _job(), _setup(tmp_path, schema=schema)
    _write(tmp_path, D1, text1)
    f2 = _write(tmp_path, D2, text2)
    assert job.main(["--pipeline", str(yaml), "--date", D1]) == 0
    capsys.readouterr()
    path = str(tmp_path / "lake" / "weights")
    before_version, before_rows = DeltaTable(path).version(), _rows(tmp_path)
    state = tmp_path / "lake" / "_checkpoints" / "weights" / "last_applied.json"
    before_state = state.read_text(encoding="utf-8")

    assert job.main(["--pipeline", str(yaml), "--date", D2]) == 3
    err = capsys.readouterr().err
    bad = [r["weight"] for r in _csv(f2).values() if not _exact(r["weight"], sql)]
    assert bad, "the fixture has a value the type cannot hold"
    assert "INVALID SNAPSHOT" in err and str(f2) in err and "'weight'" in err, err
    assert f"{len(bad)} value(s)" in err and f"type {sql}" in err, err
    for v in bad:
        assert repr(v) in err, (v, err)
    assert "schema:" in err and str(yaml) in err and "nothing was written" in err, err
    assert "Traceback" not in err, err
    assert DeltaTable(path).version() == before_version, "nothing written (no widening, no MERGE)"
    assert _rows(tmp_path) == before_rows
    assert state.read_text(encoding="utf-8") == before_state
    assert DeltaTable(path).transaction_version("dimension-weights") == 20260101


def test_text_column_stays_text_when_a_day_looks_numeric(spark, tmp_path):
    """A column inferred string on day 1 ('A1', '007') and all digits on day 2 ('007', '010'):
    stored as the file's text, not as 7 and 10."""
    job, yaml = _job(), _setup(tmp_path)
    _write(tmp_path, D1, "id,cat,weight\n1,A1,1\n2,007,2\n")
    f2 = _write(tmp_path, D2, "id,cat,weight\n1,007,1\n2,010,2\n")
    assert job.main(["--pipeline", str(yaml), "--date", D1]) == 0
    assert job.main(["--pipeline", str(yaml), "--date", D2]) == 0
    assert {r["id"]: r["cat"] for r in _rows(tmp_path)} == {k: r["cat"] for k, r in _csv(f2).items()}
