"""Source column names the job must store as they are, or refuse out loud (never drop, never
crash): dots, blanks, punctuation and the job's own helper names in data and key columns (SCD1 with a
tombstone and a primary-key change, SCD2 across two batches), columns named like the job's
metadata columns (quarantined with the fix named), a case-only rename at the source (one column,
read from either spelling), plus the config and landing-name checks that stop a run before Spark.

One real job run (two micro-batches) serves the column-name cases; the truth for the dotted
tables is the independent reference model (tests/reference_model.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from reference_model import (RefConfig, ReferenceModel, assert_no_diff, assert_table_equals,
                             diff_scd2, read_delta_rows)

from cdc_lake.cdc.backlog import LandingFileNames
from cdc_lake.cdc.job import run_pipeline
from cdc_lake.config import ConfigError, load_pipeline

YAML = """pipeline: colnames
source: {format: maxwell, path: landing, database: shop}
storage: {root: lake}
engine: {name: deltalake}
spark: {conf: {spark.sql.shuffle.partitions: "2"}}
tables:
  dots: {keys: [k.id]}
  hist: {keys: [k.id], scd: 2}
  meta: {keys: [id]}
  renamed: {keys: [id]}
  tick: {keys: [id]}
  adjacent: {keys: [id]}
"""


def mw(i: int, table: str, typ: str, data: dict, old: dict | None = None) -> str:
    e = {"database": "shop", "table": table, "type": typ, "ts": 1795000000 + i, "xid": 100 + i,
         "xoffset": 0, "position": f"mysql-bin.000001:{1000 + i}", "data": data}
    if old is not None:
        e["old"] = old
    return json.dumps(e)


def land(landing: Path, name: str, lines: list[str]) -> None:
    tmp = landing / f".{name}.tmp"
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, landing / name)


def odd(k: int, n: int) -> dict:
    return {"k.id": k, "a.b": n, "x y,=(ü)": f"p{n}", "__rn": f"r{n}", "__tomb_seq": f"t{n}",
            "__src": n * 10}


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("colnames")
    landing = base / "landing"
    landing.mkdir()
    (base / "p.yaml").write_text(YAML, encoding="utf-8")
    land(landing, "a.json", [
        mw(1, "dots", "insert", odd(1, 10)), mw(2, "dots", "insert", odd(2, 20)),
        mw(3, "dots", "update", odd(1, 11), old={"a.b": 10}),
        mw(5, "dots", "delete", odd(2, 20)),
        mw(6, "hist", "insert", odd(1, 1)),
        mw(7, "meta", "insert", {"id": 1, "_cdc_op": "x", "v": "a"}),
        mw(8, "meta", "insert", {"id": 2, "_Is_Current": 1, "v": "b"}),
        mw(9, "renamed", "insert", {"id": 1, "Name": "a"}),
        mw(16, "tick", "insert", {"id": 1, "x`y": 1}),
        # two spellings sorting next to each other in one batch (Spark's case-insensitive
        # variant schema merge kept one; the other's value was stored as NULL: tester)
        mw(17, "adjacent", "insert", {"id": 1, "Amount": "x"}),
        mw(18, "adjacent", "insert", {"id": 2, "amount": "y"}),
    ])
    old = os.stat(landing / "a.json").st_mtime - 60  # a.json is the first file of the stream
    os.utime(landing / "a.json", (old, old))
    land(landing, "b.json", [
        mw(4, "dots", "update", odd(2, 21), old={"a.b": 20}),  # older than its delete: dropped
        mw(10, "dots", "insert", odd(3, 30)),
        mw(11, "dots", "update", odd(4, 30), old={"k.id": 3}),  # primary key 3 -> 4
        mw(12, "hist", "update", odd(1, 2), old={"a.b": 1}),
        mw(13, "renamed", "insert", {"id": 2, "name": "b"}),  # after ALTER ... CHANGE Name name
        mw(14, "renamed", "update", {"id": 1, "name": "a2"}, old={"name": "a"}),
        mw(15, "renamed", "insert", {"id": 3, "Name": "c", "name": "d"}),  # both: refused
    ])
    cfg = load_pipeline(base / "p.yaml")
    summary = run_pipeline(cfg, spark=spark, run_id="names", max_files_per_trigger=1)
    model = ReferenceModel(RefConfig.from_yaml(base / "p.yaml"))
    for f in ("a.json", "b.json"):
        model.add_file(landing / f)
    quarantine = read_delta_rows(cfg.quarantine_path)
    return {"cfg": cfg, "summary": summary, "model": model, "quarantine": quarantine}


def _reasons(lake, table: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [r["reason"] for r in lake["quarantine"] if r["source_table"] == table]


def test_dots_and_helper_names_are_stored_as_they_are(lake):  # type: ignore[no-untyped-def]
    """Before: UNRESOLVED_COLUMN `__a_a`.`b` (exit 1 on every retry)."""
    cfg, model = lake["cfg"], lake["model"]
    assert lake["summary"]["batches"] == 2
    assert _reasons(lake, "dots") == [] and _reasons(lake, "hist") == []
    dots = read_delta_rows(cfg.table_path("dots"))
    assert_table_equals(model.scd1("dots"), dots, ("k.id",))
    assert sorted(r["k.id"] for r in dots) == [1, 4]  # 2 deleted (late update ignored), 3 -> 4
    assert {r["__rn"] for r in dots} == {"r11", "r30"}
    assert_no_diff(diff_scd2(model.scd2("hist"), read_delta_rows(cfg.table_path("hist")),
                             ("k.id",), table="hist"))


def test_column_named_like_metadata_is_quarantined_not_dropped(lake):  # type: ignore[no-untyped-def]
    """Before: the source's ``_cdc_op`` value was silently replaced by the job's (exit 0). (A
    backtick in a name, which the Delta writers cannot reference yet, is quarantined too.)"""
    reasons = _reasons(lake, "meta")
    assert len(reasons) == 2, lake["quarantine"]
    assert all("table meta" in r and "['_Is_Current', '_cdc_op']" in r and "p.yaml" in r
               and "tables.meta.exclude_columns" in r for r in reasons), reasons
    assert read_delta_rows(lake["cfg"].table_path("meta")) == []
    [tick] = _reasons(lake, "tick")
    assert "['x`y']" in tick and "tables.tick.exclude_columns" in tick, tick


def test_case_only_rename_is_one_column(lake):  # type: ignore[no-untyped-def]
    """Before: AMBIGUOUS_REFERENCE on `name` (exit 1 on every retry)."""
    rows = read_delta_rows(lake["cfg"].table_path("renamed"))
    assert {r["id"]: r["Name"] for r in rows} == {1: "a2", 2: "b"}
    assert all("name" not in r for r in rows)  # one column, spelled as the table created it
    [reason] = _reasons(lake, "renamed")
    assert "['Name', 'name']" in reason and "differ only in case" in reason, reason


def test_case_spellings_next_to_each_other_in_one_batch_are_one_column(lake):  # type: ignore[no-untyped-def]
    rows = read_delta_rows(lake["cfg"].table_path("adjacent"))
    assert {r["id"]: r["Amount"] for r in rows} == {1: "x", 2: "y"}, rows
    assert all("amount" not in r for r in rows) and not _reasons(lake, "adjacent")


@pytest.mark.parametrize("tables, key, words", [
    ("  orders: {keys: [id], path: lake/_quarantine}", "tables.orders.path",
     "is storage.quarantine"),
    ("  _quarantine: {keys: [id]}", "tables._quarantine.path (default: storage.root/<table name>)",
     "is storage.quarantine"),
    ("  _tombstones: {keys: [id]}", "tables._tombstones.path (default: storage.root/<table name>)",
     "is storage.root/_tombstones (the tombstone tables) = "),
    ("  orders: {keys: [id], path: lake/_ddl_log/x}", "tables.orders.path",
     "lies inside storage.ddl_log"),
    ("  orders: {keys: [id], path: lake/_checkpoints}", "tables.orders.path",
     "contains storage.checkpoint"),
    ("  orders: {keys: [id], path: landing/t}", "tables.orders.path", "lies inside source.path"),
    # two tables: named with both keys and paths (was "two tables share one target path")
    ("  customers: {keys: [id]}\n  orders: {keys: [id], path: lake/customers}", "tables.orders.path",
     "is the path of tables.customers ("),
    ("  customers: {keys: [id]}\n  orders: {keys: [id], path: lake/customers/x}", "tables.orders.path",
     "lies inside the path of tables.customers ("),
])
def test_table_path_overlapping_the_pipelines_own_paths_is_refused(tmp_path, tables, key, words):
    """Before: accepted; the side-table append used the batch's transaction id first and the
    table's MERGE was then skipped as done (rows lost, exit 0)."""
    (tmp_path / "landing").mkdir()
    (tmp_path / "p.yaml").write_text(YAML.split("tables:")[0] + "tables:\n" + tables + "\n",
                                     encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_pipeline(tmp_path / "p.yaml")
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'p.yaml'}: {key}: ") and words in msg, msg
    assert "a path of its own" in msg, msg


def test_landing_file_with_colon_stops_before_spark(tmp_path, capsys):  # type: ignore[no-untyped-def]
    """Before: Hadoop's URISyntaxException on the file, exit 1 on every retry. Hidden names
    (Spark skips them) get one warning line."""
    (tmp_path / "landing").mkdir()
    (tmp_path / "p.yaml").write_text(YAML, encoding="utf-8")
    land(tmp_path / "landing", "orders_2026-11-26T10:00:00.json", [mw(1, "dots", "insert", odd(1, 1))])
    land(tmp_path / "landing", "_orders.json", [mw(2, "dots", "insert", odd(2, 2))])
    # the product's own state files (capture resume state and its lock, the demo's) are not
    # named: renaming them, as the warning advises, would break the capture's resume
    for own in (".maxwell-capture-state.json", ".maxwell-capture-state.json.lock",
                ".shop-capture-state.json", ".cdc-demo-state.json"):
        (tmp_path / "landing" / own).write_text("{}")
    cfg = load_pipeline(tmp_path / "p.yaml")
    with pytest.raises(LandingFileNames) as e:
        run_pipeline(cfg, spark=None, run_id="colon")  # raises before a Spark session starts
    assert isinstance(e.value, ConfigError)  # exit 2
    msg = str(e.value)
    assert "'orders_2026-11-26T10:00:00.json'" in msg and "Rename" in msg and "source.path" in msg
    warning = capsys.readouterr().out
    assert "1 landing file(s)" in warning and "_orders.json" in warning, warning
    assert not (tmp_path / "lake" / "dots").exists()
    # a full refresh reads every landed file too: the same stop, before a Spark session
    with pytest.raises(LandingFileNames):
        run_pipeline(cfg, spark=None, run_id="colon-full", full_refresh=True)
    assert not (tmp_path / "lake" / "dots").exists()
