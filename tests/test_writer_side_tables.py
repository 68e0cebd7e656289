"""Quarantine and DDL log (issue 6 items 1 and 6): a fixed, nullable schema created up front, and
appends that are idempotent across checkpoint rebuilds.

Truth is counted by hand from the lines each test lands: which lines are bad, how many DDL
events — never from the writer's own code.
"""

from __future__ import annotations

import json
import shutil

from deltalake import DeltaTable
from job_helpers import event, land, pipeline, rows

from cdc_lake.cdc.job import run_pipeline
from cdc_lake.cdc.side_tables import QUARANTINE


def _missing_key(i: int) -> str:
    return json.dumps({"database": "shop", "table": "orders", "type": "insert", "ts": 1795000000 + i,
                       "xid": 100 + i, "xoffset": 0, "position": f"mysql-bin.000001:{1000 + i}",
                       "data": {"status": f"no id {i}"}})


def _ddl(i: int, sql: str) -> str:
    return json.dumps({"type": "table-alter", "database": "shop", "table": "orders", "sql": sql,
                       "ts": 1795000000 + i, "position": f"mysql-bin.000001:{1000 + i}"})


def _table(path) -> list[dict]:  # type: ignore[no-untyped-def]
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def test_malformed_line_after_missing_key_rejects_is_written(spark, tmp_path):
    """Run 1 rejects only rows with a table (missing key); run 2 brings a malformed line (no
    table): before the fix its NOT NULL source_table made every later run fail on that batch."""
    cfg = pipeline(tmp_path)
    land(cfg.landing_path, "a.json", event(1), _missing_key(2), _missing_key(3))
    land_later = [("b.json", ["{not json at all", event(4)]),
                  ("c.json", [event(5), "[1, 2", _missing_key(6)])]
    results = [run_pipeline(cfg, spark=spark, run_id="r1")["status"]]
    for name, lines in land_later:
        land(cfg.landing_path, name, *lines)
        results.append(run_pipeline(cfg, spark=spark, run_id=f"r_{name[0]}")["status"])

    assert results == ["succeeded"] * 3
    assert rows(cfg.tables["orders"].path) == {1: "s1", 4: "s4", 5: "s5"}
    q = _table(cfg.quarantine_path)
    assert sorted(r["raw_line"] for r in q) == sorted(
        [_missing_key(2), _missing_key(3), "{not json at all", "[1, 2", _missing_key(6)])
    assert {r["raw_line"]: r["source_table"] for r in q}["{not json at all"] is None
    schema = DeltaTable(str(cfg.quarantine_path)).schema()
    assert [(f.name, f.nullable) for f in schema.fields] == [(f.name, True) for f in QUARANTINE.schema.fields]


def test_quarantine_and_ddl_log_survive_a_checkpoint_reset_without_duplicates(spark, tmp_path):
    """Run, delete the checkpoint, run again: the re-ingest adds no quarantine or DDL rows."""
    cfg = pipeline(tmp_path)
    bad = ["{oops", _missing_key(3), "{oops", event(9).replace('"insert"', '"frobnicate"')]
    land(cfg.landing_path, "a.json", event(1), bad[0], bad[1], _ddl(5, "ALTER TABLE orders ADD x int"))
    land(cfg.landing_path, "b.json", event(2), bad[2], bad[3], _ddl(6, "ALTER TABLE orders ADD y int"))
    first = run_pipeline(cfg, spark=spark, run_id="gen1")
    assert first["status"] == "succeeded"
    q1, d1 = _table(cfg.quarantine_path), _table(cfg.ddl_log_path)
    assert len(q1) == 4 and sorted(r["raw_line"] for r in q1) == sorted(bad)  # "{oops" twice: 2 rows
    assert len(d1) == 2

    shutil.rmtree(cfg.checkpoint_path)
    again = run_pipeline(cfg, spark=spark, run_id="gen2")

    assert again["status"] == "succeeded"
    q2, d2 = _table(cfg.quarantine_path), _table(cfg.ddl_log_path)
    assert len(q2) == 4, [r["raw_line"] for r in q2]
    assert len(d2) == 2, d2
    assert {r["run_id"] for r in q2} == {"gen1"} and {r["run_id"] for r in d2} == {"gen1"}
    assert again["quarantined"] == 0 and again["ddl_events"] == 0
    assert rows(cfg.tables["orders"].path) == {1: "s1", 2: "s2"}

    # A new bad line after the reset is still recorded (once).
    land(cfg.landing_path, "c.json", "{oops", event(7))
    third = run_pipeline(cfg, spark=spark, run_id="gen2b")
    assert third["quarantined"] == 1 and len(_table(cfg.quarantine_path)) == 5


def test_append_new_is_a_multiset_difference_for_frames_and_computed_rows(spark, tmp_path):
    """``append_new`` adds the n-th copy of a natural key only when the table holds fewer than n,
    by the same rule whether the rows are a DataFrame (Spark join: the delta-spark path) or
    already computed Arrow (delta-rs lookup); a null ``source_file`` is a key value like others.
    Expected tables are written out by hand."""
    from cdc_lake.cdc.side_tables import append_new, conform, ensure
    from cdc_lake.engines import Computed, Txn, select_engine

    engine = select_engine(spark, "deltalake")
    cols = ["source_file", "raw_line", "reason", "pipeline"]
    first = [("f1", "x", "r", "p"), ("f1", "x", "r", "p"), ("f2", "y", "r", "p"), (None, "z", "r", "p")]
    # again: 3 copies of f1/x (table holds 2 -> 1 new), f2/y held, null/z held once -> 1 new,
    # f3/w new, and the same line under another pipeline is another key
    again = [("f1", "x", "r2", "p"), ("f1", "x", "r2", "p"), ("f1", "x", "r2", "p"), ("f2", "y", "r", "p"),
             (None, "z", "r", "p"), (None, "z", "r", "p"), ("f3", "w", "r", "p"), ("f2", "y", "r", "q")]
    expected = sorted(first + [("f1", "x", "r2", "p"), (None, "z", "r", "p"), ("f3", "w", "r", "p"),
                               ("f2", "y", "r", "q")], key=str)
    results = []
    for kind in ("frame", "computed"):
        path = str(tmp_path / kind)
        ensure(engine, path, QUARANTINE)
        for n, batch in enumerate((first, again, again)):  # the third is a re-delivery: adds none
            df = spark.createDataFrame(batch, ", ".join(f"{c} string" for c in cols))
            df = conform(df, QUARANTINE)
            rows_in = Computed(df.toArrow(), df.schema) if kind == "computed" else df
            append_new(engine, path, rows_in, QUARANTINE, txn=Txn(f"app-{kind}-{n}", n))
        got = sorted(((r["source_file"], r["raw_line"], r["reason"], r["pipeline"]) for r in _table(path)),
                     key=str)
        assert got == expected, (kind, got)
        results.append(got)
    assert results[0] == results[1]
