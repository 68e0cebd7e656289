"""Dimension refresh (``kind: dimension``, issue 7): daily full snapshots -> a Delta dimension.

Truth is computed independently in plain Python from the snapshot rows the test generates
(:func:`expect_scd1` / :func:`expect_scd2`, no import from ``cdc_lake.dimensions``) and compared
with the table read back through delta-rs (not Spark). Random histories use ``random.Random``
with a fresh seed per run, printed in every assertion message; ``DIM_SEED=<n>`` replays one.
"""

from __future__ import annotations

import csv
import os
import random
from datetime import date as Date
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from cdc_lake.config import ConfigError, load_pipeline

REPO = Path(__file__).resolve().parents[1]
SLOW = os.environ.get("CDC_SLOW") == "1"
DAY0 = Date(2026, 1, 1)


# --------------------------------------------------------------------------- inputs


def _yaml(tmp: Path, *, scd: int, fmt: str, engine: str, schema: bool, extra: str = "") -> Path:
    f = tmp / "dim.yaml"
    schema_line = "schema: {product_id: int, category: string}\n" if schema else ""
    f.write_text(
        "kind: dimension\npipeline: product_categories\nschedule: {cron: \"0 2 * * *\"}\n"
        f"snapshots: {{path: snaps, format: {fmt}}}\nkeys: [product_id]\nscd: {scd}\n"
        f"{schema_line}table: lake/dims/product_categories\nengine: {{name: {engine}}}\n{extra}",
        encoding="utf-8")
    return f


def _declared_csv(tmp: Path, name: str, schema: str) -> Path:
    """An SCD1 CSV dimension pipeline ``name`` keyed by product_id with ``schema:`` declared;
    its snapshots go to ``<tmp>/snaps`` (created)."""
    (tmp / "snaps").mkdir()
    f = tmp / "dim.yaml"
    f.write_text(f"kind: dimension\npipeline: {name}\nsnapshots: {{path: snaps, format: csv}}\n"
                 f"keys: [product_id]\nscd: 1\nschema: {schema}\n"
                 f"table: lake/{name}\nengine: {{name: deltalake}}\n", encoding="utf-8")
    return f


def _write_snapshot(folder: Path, fmt: str, day: Date, rows: dict[int, dict],
                    columns: tuple[str, ...] = ()) -> None:
    """``columns``: the export's columns besides the rows' own (an export of no rows still has
    its header / Parquet schema; CI seed: a random day with every row deleted wrote a Parquet
    file without ``category``, which the refresh rightly refused as a lost column)."""
    folder.mkdir(parents=True, exist_ok=True)
    cols = ["product_id", *sorted({c for r in rows.values() for c in r} | set(columns))]
    if fmt == "csv":
        with open(folder / f"{day.isoformat()}.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(cols)
            for k in sorted(rows):
                w.writerow([k, *[rows[k].get(c, "") for c in cols[1:]]])
    else:
        data = {"product_id": pa.array(sorted(rows), pa.int64())}
        for c in cols[1:]:
            data[c] = pa.array([rows[k].get(c) for k in sorted(rows)], pa.string())
        pq.write_table(pa.table(data), folder / f"{day.isoformat()}.parquet")


def random_snapshots(rng: random.Random, days: int, *, drift_day: int | None) -> list[dict[int, dict]]:
    """Per day a full snapshot {product_id: {column: value}}: inserts, changes, deletes, re-appearances,
    unicode; from ``drift_day`` on a new column ``tier`` (sometimes NULL)."""
    cats = ["toys", "books", "garden", "Küche", "électronique", "食品"]
    cur = {k: {"category": rng.choice(cats)} for k in range(1, rng.randint(4, 9))}
    out = []
    for d in range(days):
        nxt = {k: dict(v) for k, v in cur.items()}
        for k in list(nxt):
            r = rng.random()
            if r < 0.2:
                del nxt[k]
            elif r < 0.5:
                nxt[k]["category"] = rng.choice(cats)
        for k in rng.sample(range(1, 14), rng.randint(0, 3)):
            nxt.setdefault(k, {"category": rng.choice(cats)})
        if drift_day is not None and d >= drift_day:
            for v in nxt.values():
                v.setdefault("tier", rng.choice(["gold", "silver", None]))
                if rng.random() < 0.3:
                    v["tier"] = rng.choice(["gold", "silver", None])
        out.append(nxt if d else cur)
        cur = nxt
    return out


# --------------------------------------------------------------------------- independent truth


def _eff(applied: list[tuple[Date, dict[int, dict]]]) -> list[tuple[Date, dict[int, dict]]]:
    """The refreshes that take effect: strictly increasing dates (older and repeats change nothing)."""
    out: list[tuple[Date, dict[int, dict]]] = []
    for day, snap in applied:
        if not out or day > out[-1][0]:
            out.append((day, snap))
    return out


def _norm(v: dict, cols: list[str]) -> tuple:
    return tuple(v.get(c) or None for c in cols)  # CSV: empty cell = NULL


def expect_scd1(applied, cols):  # type: ignore[no-untyped-def]
    """{key: (attrs..., date the row last changed)}"""
    table: dict[int, tuple] = {}
    for day, snap in _eff(applied):
        new = {}
        for k, v in snap.items():
            attrs = _norm(v, cols)
            old = table.get(k)
            new[k] = old if old is not None and old[:-1] == attrs else (*attrs, day)
        table = new
    return table


def expect_scd2(applied, cols):  # type: ignore[no-untyped-def]
    """set of (key, attrs..., valid_from, valid_to|None, is_current)"""
    def ts(d: Date) -> datetime:
        return datetime(d.year, d.month, d.day, tzinfo=timezone.utc)

    closed: set[tuple] = set()
    current: dict[int, tuple] = {}  # key -> (attrs, valid_from)
    for day, snap in _eff(applied):
        for k in list(current):
            attrs, since = current[k]
            if k not in snap or _norm(snap[k], cols) != attrs:
                closed.add((k, *attrs, since, ts(day), False))
                del current[k]
        for k, v in snap.items():
            if k not in current:
                current[k] = (_norm(v, cols), ts(day))
    return closed | {(k, *a, since, None, True) for k, (a, since) in current.items()}


def table_rows(path: Path, scd: int, cols: list[str]):  # type: ignore[no-untyped-def]
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    if scd == 1:
        return {r["product_id"]: (*[r.get(c) for c in cols], r["_snapshot_date"]) for r in rows}
    return {(r["product_id"], *[r.get(c) for c in cols], r["_valid_from"], r["_valid_to"],
             r["_is_current"]) for r in rows}


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("scd,fmt", [(1, "csv"), (2, "parquet")])
def test_random_history_matches_independent_model(spark, engine_name, tmp_path, scd, fmt):
    """Insert/update/delete (SCD1) or close (SCD2), idempotent per date, no rollback by an older
    date, a new snapshot column flows through (parquet, no explicit schema), CDF on."""
    from cdc_lake.dimensions.refresh import run_refresh

    seed = int(os.environ.get("DIM_SEED", random.randrange(10**6)))
    print(f"DIM_SEED={seed}")  # shown with the failure; replay: DIM_SEED=<n>
    rng = random.Random(seed)
    days = 6 if SLOW else 4
    drift = 2 if fmt == "parquet" else None
    snaps = random_snapshots(rng, days, drift_day=drift)
    cfg = load_pipeline(_yaml(tmp_path, scd=scd, fmt=fmt, engine=engine_name, schema=fmt == "csv"))
    for d, snap in enumerate(snaps):
        cols = ("category",) + (("tier",) if drift is not None and d >= drift else ())
        _write_snapshot(cfg.snapshots.path, fmt, DAY0 + timedelta(d), snap, cols)
    # apply order: forwards, with an older date and a repeated date mixed in (a backfill racing
    # the schedule), and one date skipped
    order = [0, 1, 0, 1, *range(2, days)]
    order.remove(days - 2) if days > 4 else None
    cols = ["category"] + (["tier"] if drift is not None else [])
    applied: list[tuple[Date, dict]] = []
    written: Date | None = None  # the last date whose refresh committed to the table
    for i, d in enumerate(order):
        day = DAY0 + timedelta(d)
        before = DeltaTable(str(cfg.table)).version() if cfg.table.exists() else None
        s = run_refresh(cfg, date=day.isoformat(), spark=spark, run_id=f"r{i}")
        applied.append((day, snaps[d]))
        ctx = f"seed={seed} step {i} date {day} order {order} summary {s}"
        newest = max(a for a, _ in applied[:-1]) if applied[:-1] else None
        if newest is not None and day < newest:
            assert s["status"] == "skipped_older_date", ctx
            assert DeltaTable(str(cfg.table)).version() == before, ctx
        elif newest == day:
            assert s["status"] == "already_applied" and s["skipped_writes"] == 1, ctx
            assert DeltaTable(str(cfg.table)).version() == before, ctx
        else:
            assert s["status"] == "succeeded", ctx
            if DeltaTable(str(cfg.table)).version() != before:
                written = day  # a snapshot equal to the table writes no commit (state file only)
        assert s["last_applied_date"] == max(a for a, _ in applied).isoformat(), ctx
        want = expect_scd1(applied, cols) if scd == 1 else expect_scd2(applied, cols)
        got = table_rows(cfg.table, scd, cols)
        assert got == want, ctx
    dt = DeltaTable(str(cfg.table))
    assert dt.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    assert written is not None and dt.transaction_version("dimension-product_categories") == int(
        written.strftime("%Y%m%d")), f"seed={seed} order {order}: the table's txn version"
    if scd == 2:
        cur = [r for r in dt.to_pyarrow_table().to_pylist() if r["_is_current"]]
        assert len(cur) == len({r["product_id"] for r in cur}), f"seed={seed}: one current row per key"


def test_cli_exit_codes_and_messages(spark, tmp_path, capsys):
    """66 missing snapshot (names the expected path), 3 invalid snapshot, 2 bad date/config,
    75 locked; a snapshot that lost a table column is refused instead of keeping stale values."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dimension_refresh", REPO / "spark_jobs" / "dimension_refresh.py")
    job = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(job)  # type: ignore[union-attr]
    yaml = _yaml(tmp_path, scd=1, fmt="csv", engine="deltalake", schema=False)
    snaps = tmp_path / "snaps"

    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-01", "--run-id", "miss"]) == 66
    err = capsys.readouterr().err
    assert "SNAPSHOT MISSING" in err and str(snaps / "2026-01-01.csv") in err, err
    runs = load_pipeline(yaml).runs_path / load_pipeline(yaml).name

    def recorded(run_id: str) -> dict:  # a failed run is on record too (docs tester: none was)
        import json

        return json.loads((runs / f"{run_id}.json").read_text())

    assert recorded("miss")["status"] == "failed" and "SnapshotMissing" in recorded("miss")["error"]
    assert json_latest(runs)["run_id"] == "miss"

    assert job.main(["--pipeline", str(yaml), "--date", "2026-13-01"]) == 2
    assert "2026-13-01" in capsys.readouterr().err

    _write_snapshot(snaps, "csv", DAY0, {1: {"category": "a", "brand": "x"}, 2: {"category": "b", "brand": "y"}})
    (snaps / "2026-01-02.csv").write_text("product_id,category,brand\n1,a,x\n1,b,y\n", encoding="utf-8")
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-01", "--run-id", "ok"]) == 0
    out = capsys.readouterr().out
    assert "CDC_RUN_SUMMARY" in out and '"status": "succeeded"' in out
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-02", "--run-id", "dup"]) == 3
    assert "duplicate keys" in capsys.readouterr().err
    assert recorded("dup")["status"] == "failed" and "duplicate keys" in recorded("dup")["error"]
    assert recorded("dup")["date"] == "2026-01-02" and json_latest(runs)["run_id"] == "dup"

    (snaps / "2026-01-03.csv").write_text("product_id,category\n1,a\n", encoding="utf-8")
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-03"]) == 3
    err = capsys.readouterr().err
    assert "['brand']" in err and "missing from the snapshot" in err, err

    cfg = load_pipeline(yaml)
    from cdc_lake.locks import pipeline_lock

    with pipeline_lock(cfg) as lock:
        lock.acquire("holder_run")
        assert job.main(["--pipeline", str(yaml), "--date", "2026-01-03"]) == 75
        assert "holder_run" in capsys.readouterr().err
    assert {r["product_id"]: r["category"] for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()} \
        == {1: "a", 2: "b"}, "refused runs changed nothing"

    # Tester: the state file truncated let an older date roll the table back; the table's newest
    # commit removed counted the date as applied (an empty table, exit 0). Both: exit 3 now.
    from cdc_lake.dimensions.refresh import STATE_FILE

    state = cfg.checkpoint_path / STATE_FILE
    state.write_text(state.read_text()[:12])
    assert job.main(["--pipeline", str(yaml), "--date", "2025-12-31"]) == 3
    err = capsys.readouterr().err
    assert "NEEDS RECOVERY" in err and str(state) in err and "truncated or corrupt" in err, err
    state.unlink()  # its recovery: moved aside, the newest applied date re-run records it again
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-01"]) == 0
    assert '"status": "already_applied"' in capsys.readouterr().out and state.is_file()
    newest = sorted((cfg.table / "_delta_log").glob("*.json"))[-1]
    newest.unlink()
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-01"]) == 3
    err = capsys.readouterr().err
    assert "NEEDS RECOVERY" in err and str(cfg.table) in err and "commits were lost" in err, err
    newest = sorted((cfg.table / "_delta_log").glob("*.json"))[-1]
    newest.write_bytes(newest.read_bytes()[:30])  # a truncated commit: was exit 1, a traceback
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-01"]) == 3
    err = capsys.readouterr().err
    assert "NEEDS RECOVERY" in err and "cannot be read" in err and str(cfg.table) in err, err[-800:]


@pytest.mark.parametrize("patch,key,words", [
    ({"schedule": "{assets: [file:///x]}"}, "schedule", "logical date"),
    ({"snapshots": "{path: s, format: csv, pattern: \"snap.csv\"}"}, "snapshots.pattern", "{date}"),
    ({"snapshots": "{path: s, format: xlsx}"}, "snapshots.format", "csv, parquet"),
    ({"snapshots": "{path: s, format: csv, pattern: \"{date}}.csv\"}"}, "snapshots.pattern", "brace"),
    ({"snapshots": "{path: s, format: csv, pattern: \"_{date}.csv\"}"}, "snapshots.pattern", "hidden"),
    ({"snapshots": "{path: s, format: csv, pattern: \".{date}.csv\"}"}, "snapshots.pattern", "hidden"),
    ({"schema": "{category: string}"}, "schema", "key columns"),
    ({"schema": "{product_id: int, w: decimal(10,2)}"}, "schema.w", "YAML split a type at its comma"),
    ({"schema": "{product_id: int, _Is_Current: boolean}"}, "schema", "maintains"),
    ({"scd": "3"}, "scd", "1 or 2"),
    ({"keys": "[]"}, "keys", "empty"),
    ({"colour": "red"}, "colour", "unknown key"),
])
def test_config_errors_name_file_key_and_fix(tmp_path, patch, key, words):
    base = {"kind": "dimension", "pipeline": "pc", "schedule": "\"@daily\"",
            "snapshots": "{path: s, format: csv}", "keys": "[product_id]", "table": "t"}
    base.update(patch)
    f = tmp_path / "bad.yaml"
    f.write_text("".join(f"{k}: {v}\n" for k, v in base.items()), encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_pipeline(f)
    assert e.value.key == key and words in str(e.value) and str(f) in str(e.value), str(e.value)


def test_cron_mapping_schedule_and_defaults(tmp_path):
    cfg = load_pipeline(_yaml(tmp_path, scd=2, fmt="parquet", engine="auto", schema=False))
    assert cfg.kind == "dimension" and cfg.schedule.kind == "cron" and cfg.schedule.cron == "0 2 * * *"
    assert cfg.snapshot_file("2026-01-02") == tmp_path / "snaps" / "2026-01-02.parquet"
    assert cfg.checkpoint_path == tmp_path / "lake" / "dims" / "_checkpoints" / "product_categories"
    assert cfg.runs_path == tmp_path / "lake" / "dims" / "_runs"


@pytest.mark.parametrize("scd,column", [(1, "_Snapshot_Date"), (2, "_is_current")])
def test_file_column_named_like_a_job_column_is_an_invalid_snapshot(spark, tmp_path, capsys, scd, column):
    """Without ``schema:`` the header comes from the file: a column the job maintains itself
    (any case) is exit 3 naming file, column and fix, nothing written (was a delta-rs
    'Duplicate field name' traceback, exit 1)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dimension_refresh", REPO / "spark_jobs" / "dimension_refresh.py")
    job = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(job)  # type: ignore[union-attr]
    yaml = _yaml(tmp_path, scd=scd, fmt="csv", engine="deltalake", schema=False)
    f = tmp_path / "snaps" / "2026-01-01.csv"
    f.parent.mkdir()
    f.write_text(f"product_id,{column},category\n1,false,a\n", encoding="utf-8")
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-01"]) == 3
    err = capsys.readouterr().err
    assert "INVALID SNAPSHOT" in err and str(f) in err and repr(column) in err and "Rename" in err, err
    assert "Traceback" not in err, err
    cfg = load_pipeline(yaml)
    assert not cfg.table.exists() and not (cfg.checkpoint_path / "last_applied.json").exists()


@pytest.mark.parametrize("scd", [1, 2])
def test_key_and_column_with_dots_in_their_names(spark, tmp_path, scd):
    """A key ``p.id`` is one column, not field ``id`` of ``p`` (was UNRESOLVED_COLUMN): insert,
    update and delete/close work with dotted key and column names."""
    from cdc_lake.dimensions.refresh import run_refresh

    (tmp_path / "snaps").mkdir()
    yaml = tmp_path / "dim.yaml"
    yaml.write_text("kind: dimension\npipeline: dotted\nsnapshots: {path: snaps, format: csv}\n"
                    f"keys: [\"p.id\"]\nscd: {scd}\ntable: lake/dotted\nengine: {{name: deltalake}}\n",
                    encoding="utf-8")
    days = {"2026-01-01": "p.id,a.b\n1,x\n2,y\n", "2026-01-02": "p.id,a.b\n1,z\n3,w\n"}
    for d, text in days.items():
        (tmp_path / "snaps" / f"{d}.csv").write_text(text, encoding="utf-8")
    cfg = load_pipeline(yaml)
    s1 = run_refresh(cfg, date="2026-01-01", spark=spark, run_id="d1")
    s2 = run_refresh(cfg, date="2026-01-02", spark=spark, run_id="d2")
    assert (s1["status"], s1["inserted"]) == ("succeeded", 2), s1
    assert (s2["status"], s2["inserted"], s2["updated"], s2["deleted"]) == ("succeeded", 1, 1, 1), s2
    rows = DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()
    if scd == 1:
        assert {r["p.id"]: r["a.b"] for r in rows} == {1: "z", 3: "w"}, rows
    else:
        assert {(r["p.id"], r["a.b"], r["_is_current"]) for r in rows} == {
            (1, "x", False), (1, "z", True), (2, "y", False), (3, "w", True)}, rows


def test_backtick_in_a_column_name_is_escaped(spark):
    """The snapshot checks and the diff quote names with a backtick inside (doubled). (Spark
    side only: delta-rs' MERGE itself does not take such names.)"""
    from cdc_lake.dimensions.diff import check_snapshot, scd1_changes

    snap = spark.createDataFrame([(1, "z"), (3, "w")], "`k``1` int, `a.b``c` string")
    table = spark.createDataFrame([(1, "x", DAY0), (2, "y", DAY0)],
                                  "`k``1` int, `a.b``c` string, _snapshot_date date")
    assert check_snapshot(snap, ("k`1",), "snap") == 2
    changes = scd1_changes(snap, table, ("k`1",), "2026-01-02", "snap")
    try:
        assert changes.counts == {"inserted": 1, "updated": 1, "deleted": 1, "unchanged": 0}
        got = {(r["k`1"], r["a.b`c"], r["_snapshot_date"]) for r in changes.source.collect()}
        assert got == {(1, "z", Date(2026, 1, 2)), (3, "w", Date(2026, 1, 2)), (2, None, None)}, got
    finally:
        changes.release()


def test_declared_schema_takes_csv_columns_by_header_name(spark, tmp_path):
    """With ``schema:`` the CSV columns were applied by position, the header ignored (Spark's
    reader with a schema): an export that swapped two string columns was stored swapped, exit 0.
    Now by header name, any order, other columns ignored; a schema column missing from the
    header is an invalid snapshot naming it; a header naming one column twice (any case) too."""
    from cdc_lake.dimensions.refresh import SnapshotInvalid, run_refresh

    yaml = _declared_csv(tmp_path, "byname", "{product_id: bigint, category: string, colour: string}")
    days = {"2026-01-01": "product_id,category,colour\n1,toys,red\n2,books,blue\n",
            "2026-01-02": "colour,extra,product_id,category\nred,e,1,toys\ngreen,e,2,books\n"}
    for d, text in days.items():
        (tmp_path / "snaps" / f"{d}.csv").write_text(text, encoding="utf-8")
    cfg = load_pipeline(yaml)
    for d in days:
        assert run_refresh(cfg, date=d, spark=spark, run_id=d)["status"] == "succeeded"
    rows = DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()
    assert {r["product_id"]: (r["category"], r["colour"]) for r in rows} == {
        1: ("toys", "red"), 2: ("books", "green")}, rows
    assert "extra" not in rows[0]

    bad = {"2026-01-03": ("product_id,category\n1,toys\n", "['colour']"),
           "2026-01-04": ("product_id,Category,colour,category\n1,a,red,b\n", "'Category' twice")}
    for d, (text, words) in bad.items():
        (tmp_path / "snaps" / f"{d}.csv").write_text(text, encoding="utf-8")
        with pytest.raises(SnapshotInvalid) as e:
            run_refresh(cfg, date=d, spark=spark, run_id=d)
        assert words in str(e.value) and f"{d}.csv" in str(e.value), str(e.value)
    assert DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist() == rows


def test_snapshot_shapes_a_tester_met(spark, tmp_path):
    """Tester, 2026-11-27: a declared ``decimal(10,2)`` stored 2.0000000000000000001 as 2.00
    (exit 0: the check compared as decimal(38,18), which rounds past 18 places); a quoted value
    with a line break failed with exit 1; a map column was accepted on day 1 and every later
    date failed in the MERGE (exit 1); an export folder named like the file was "missing"
    (exit 66, retried for ever); a ``.csv.gz`` failed the header check (UnicodeDecodeError)."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    from cdc_lake.dimensions.refresh import SnapshotInvalid, run_refresh

    snaps = tmp_path / "snaps"
    snaps.mkdir()
    yaml = tmp_path / "dim.yaml"
    yaml.write_text("kind: dimension\npipeline: shapes\nsnapshots: {path: snaps, format: csv, "
                    "pattern: '{date}.csv.gz'}\nkeys: [id]\nscd: 1\n"
                    "schema: {id: bigint, price: 'decimal(10,2)', note: string}\n"
                    "table: lake/shapes\nengine: {name: deltalake}\n", encoding="utf-8")
    cfg = load_pipeline(yaml)

    def day(d: str, text: str) -> None:
        (snaps / f"{d}.csv.gz").write_bytes(gzip.compress(text.encode("utf-8")))

    day("2026-01-01", 'id,price,note\n1,2.50,"two\nlines"\n2,0.10,plain\n')
    assert run_refresh(cfg, date="2026-01-01", spark=spark, run_id="d1")["status"] == "succeeded"
    rows = {r["id"]: (str(r["price"]), r["note"])
            for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()}
    assert rows == {1: ("2.50", "two\nlines"), 2: ("0.10", "plain")}, rows
    for d, price in (("2026-01-02", "2.0000000000000000001"), ("2026-01-03", "1e-20")):
        day(d, f"id,price,note\n1,{price},x\n")
        with pytest.raises(SnapshotInvalid) as e:
            run_refresh(cfg, date=d, spark=spark, run_id=d)
        assert "'price'" in str(e.value) and price in str(e.value), str(e.value)
    (snaps / "2026-01-04.csv.gz").mkdir()
    with pytest.raises(SnapshotInvalid, match="is a directory"):
        run_refresh(cfg, date="2026-01-04", spark=spark, run_id="d4")

    pyaml = tmp_path / "maps.yaml"
    pyaml.write_text("kind: dimension\npipeline: maps\nsnapshots: {path: psnaps, format: parquet}\n"
                     "keys: [id]\nscd: 1\ntable: lake/maps\nengine: {name: deltalake}\n",
                     encoding="utf-8")
    (tmp_path / "psnaps").mkdir()
    pq.write_table(pa.table({"id": [1], "m": pa.array([{"a": 1}], pa.map_(pa.string(), pa.int64()))}),
                   tmp_path / "psnaps" / "2026-01-01.parquet")
    with pytest.raises(SnapshotInvalid, match=r"\['m'\] hold maps"):
        run_refresh(load_pipeline(pyaml), date="2026-01-01", spark=spark, run_id="m1")


def test_maintenance_of_a_dimension_compacts_its_table_and_leaves_a_damaged_one_alone(spark, tmp_path):
    """``maintenance:`` in a dimension YAML (refused as an unknown key before): a
    ``<pipeline>__maintenance`` DAG; maintenance vacuums the files the daily MERGEs left and
    writes a Delta checkpoint without changing a row, and
    a table whose newest commit was removed behind the refresh's record is left alone (exit 3)."""
    from cdc_lake.airflow.dag_factory import build_dags
    from cdc_lake.dimensions.refresh import run_refresh
    from cdc_lake.maintenance import main as maintenance_main
    from cdc_lake.maintenance import run_maintenance

    yaml = _yaml(tmp_path, scd=2, fmt="csv", engine="deltalake", schema=True,
                 extra="maintenance: {schedule: '@weekly', vacuum_retention_hours: 0}\n")
    cfg = load_pipeline(yaml)
    assert cfg.maintenance is not None and cfg.maintenance.schedule == "@weekly"
    rng = random.Random(5)
    for i, rows in enumerate(random_snapshots(rng, 4, drift_day=None)):
        _write_snapshot(tmp_path / "snaps", "csv", DAY0 + timedelta(days=i), rows)
        assert run_refresh(cfg, date=(DAY0 + timedelta(days=i)).isoformat(), spark=spark,
                           run_id=f"m{i}")["status"] == "succeeded"
    before = DeltaTable(str(cfg.table))
    rows_before = sorted(map(str, before.to_pyarrow_table().to_pylist()))
    on_disk = len(list(cfg.table.glob("*.parquet")))  # each refresh's MERGE rewrote the file
    assert on_disk > 1

    assert "product_categories__maintenance" in build_dags(tmp_path)
    report = run_maintenance(cfg, pipelines=[cfg])
    t = report["tables"]["table"]
    assert report["failed"] == [] and t["status"] == "ok", report
    after = DeltaTable(str(cfg.table))
    assert t["vacuum"]["files_removed"] == on_disk - 1 and t["files_after"] == 1, t
    assert len(list(cfg.table.glob("*.parquet"))) == 1 and after.file_uris()
    assert list((cfg.table / "_delta_log").glob("*.checkpoint.parquet")), "a Delta checkpoint"
    assert sorted(map(str, after.to_pyarrow_table().to_pylist())) == rows_before

    # the refresh's record says version N; the log now ends below it: not maintained, exit 3
    left = after.version()
    _write_snapshot(tmp_path / "snaps", "csv", DAY0 + timedelta(days=9), {1: {"category": "z"}})
    assert run_refresh(cfg, date=(DAY0 + timedelta(days=9)).isoformat(), spark=spark,
                       run_id="m9")["status"] == "succeeded"
    newest = sorted((cfg.table / "_delta_log").glob("*.json"))[-1]
    assert int(newest.name[:20]) == left + 1
    newest.unlink()
    assert maintenance_main(["--pipeline", str(yaml)]) == 3
    report = run_maintenance(cfg, pipelines=[cfg])
    t = report["tables"]["table"]
    assert t["status"] == "changed_behind" and f"left it at version {left + 1}" in t["error"], t
    assert "apply the snapshots again" in t["recovery"], t
    assert DeltaTable(str(cfg.table)).version() == left  # maintenance committed nothing


def json_latest(runs: Path) -> dict:
    import json

    return json.loads((runs / "latest.json").read_text())


def test_declared_timestamps_and_dates_outside_years_1_to_9999_are_an_invalid_snapshot(spark, tmp_path):
    """A declared timestamp column read from text with an offset can leave years 1-9999 in UTC
    ("9999-12-31T23:30:00-01:00" is the year 10000), which no reader of the table could load
    (the CDC kind quarantines such values): an invalid snapshot naming the column, nothing
    written. The range's own ends are stored."""
    from cdc_lake.dimensions.refresh import SnapshotInvalid, run_refresh

    yaml = _declared_csv(tmp_path, "ranges", "{product_id: bigint, seen: timestamp, since: date}")
    (tmp_path / "snaps" / "2026-01-01.csv").write_text(
        "product_id,seen,since\n1,9999-12-31T23:59:59.999999Z,9999-12-31\n"
        "2,0001-01-01T00:00:00Z,0001-01-01\n", encoding="utf-8")
    (tmp_path / "snaps" / "2026-01-02.csv").write_text(
        "product_id,seen,since\n1,9999-12-31T23:30:00-01:00,2026-01-01\n", encoding="utf-8")
    cfg = load_pipeline(yaml)
    assert run_refresh(cfg, date="2026-01-01", spark=spark, run_id="ok")["status"] == "succeeded"
    rows = {r["product_id"]: r for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()}
    assert rows[1]["seen"].year == 9999 and rows[2]["since"] == Date(1, 1, 1), rows
    version = DeltaTable(str(cfg.table)).version()
    with pytest.raises(SnapshotInvalid) as e:
        run_refresh(cfg, date="2026-01-02", spark=spark, run_id="bad")
    assert "column 'seen'" in str(e.value) and "timestamp" in str(e.value), str(e.value)
    assert DeltaTable(str(cfg.table)).version() == version, "nothing written"
    # a time of day under a declared date was dropped (stored 2026-01-01, exit 0; tester K)
    (tmp_path / "snaps" / "2026-01-03.csv").write_text(
        "product_id,seen,since\n1,2026-01-01T00:00:00Z,2026-01-01 13:45:00\n"
        "2,2026-01-01T00:00:00Z,2026-01-02 00:00:00\n", encoding="utf-8")
    with pytest.raises(SnapshotInvalid) as e:
        run_refresh(cfg, date="2026-01-03", spark=spark, run_id="time")
    assert "column 'since': 1 value(s)" in str(e.value) and "2026-01-01 13:45:00" in str(e.value), str(e.value)
    assert DeltaTable(str(cfg.table)).version() == version, "nothing written"


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_undeclared_timestamps_and_dates_outside_years_1_to_9999_are_an_invalid_snapshot(
        spark, tmp_path, fmt):
    """Without ``schema:`` the types come from the file: a Parquet export holds timestamps and
    dates past the year 9999 as they are, and Spark infers a CSV's offset text as a timestamp
    ("9999-12-31T23:30:00-01:00" is the year 10000 in UTC). Stored, no reader of the table
    could load them back: an invalid snapshot naming the column, nothing written."""
    from cdc_lake.dimensions.refresh import SnapshotInvalid, run_refresh

    (tmp_path / "snaps").mkdir()
    yaml = tmp_path / "dim.yaml"
    yaml.write_text(f"kind: dimension\npipeline: far\nsnapshots: {{path: snaps, format: {fmt}}}\n"
                    "keys: [product_id]\nscd: 1\ntable: lake/far\nengine: {name: deltalake}\n",
                    encoding="utf-8")
    last = 253_402_300_799_999_999  # 9999-12-31 23:59:59.999999 UTC, in microseconds

    def land(day: str, seen: list[int], since: list[int], text: list[str]) -> None:
        if fmt == "parquet":
            pq.write_table(pa.table({
                "product_id": pa.array(range(1, len(seen) + 1), pa.int64()),
                "seen": pa.array(seen, pa.timestamp("us", tz="UTC")),
                "since": pa.array(since, pa.date32())}), tmp_path / "snaps" / f"{day}.parquet")
        else:
            (tmp_path / "snaps" / f"{day}.csv").write_text("product_id,seen\n" + "".join(
                f"{i},{t}\n" for i, t in enumerate(text, 1)), encoding="utf-8")

    land("2026-01-01", [last, -62_135_596_800_000_000], [2_932_896, -719_162],
         ["9999-12-31T23:59:59.999999Z", "0001-01-01T00:00:00Z"])
    cfg = load_pipeline(yaml)
    assert run_refresh(cfg, date="2026-01-01", spark=spark, run_id="ok")["status"] == "succeeded"
    rows = DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()  # the range's ends load
    assert sorted(r["seen"].year for r in rows) == [1, 9999], rows
    version = DeltaTable(str(cfg.table)).version()
    for column, bad in (("seen", ([last + 1, 0], [0, 0], ["9999-12-31T23:30:00-01:00", "2026-01-01T00:00:00Z"])),
                        ("since", ([0, 0], [0, 2_932_897], []))):
        if fmt == "csv" and column == "since":
            continue
        land("2026-01-02", *bad)
        with pytest.raises(SnapshotInvalid) as e:
            run_refresh(cfg, date="2026-01-02", spark=spark, run_id=f"bad-{column}")
        assert f"column {column!r}: 1 value(s) outside years 1-9999" in str(e.value), str(e.value)
        assert DeltaTable(str(cfg.table)).version() == version, "nothing written"


# --------------------------------------------------------------------------- tester, 2026-11-29


def _job():  # type: ignore[no-untyped-def]
    """spark_jobs/dimension_refresh.py as a module (its ``main`` returns the exit code)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dimension_refresh", REPO / "spark_jobs" / "dimension_refresh.py")
    job = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(job)  # type: ignore[union-attr]
    return job


def _pipeline(tmp: Path, name: str, fmt: str = "csv", schema: str = "") -> Path:
    """An SCD1 dimension pipeline ``name`` keyed by product_id (``schema:`` line optional);
    snapshots in ``<tmp>/snaps`` (created)."""
    (tmp / "snaps").mkdir(exist_ok=True)
    f = tmp / "dim.yaml"
    f.write_text(f"kind: dimension\npipeline: {name}\nsnapshots: {{path: snaps, format: {fmt}}}\n"
                 f"keys: [product_id]\nscd: 1\n{schema}table: lake/{name}\n"
                 "engine: {name: deltalake}\n", encoding="utf-8")
    return f


def _rfc4180(rows: list[list[str | None]], eol: str = "\r\n") -> str:
    """CSV text by RFC 4180, written here by hand: every text quoted (a quote inside doubled),
    None an unquoted empty field; records end with ``eol``."""
    def field(v: str | None) -> str:
        return "" if v is None else '"' + v.replace('"', '""') + '"'

    return "".join(",".join(field(v) for v in r) + eol for r in rows)


@pytest.mark.parametrize("declared,eol", [(False, "\r\n"), (True, "\r\n"), (False, "\n")])
def test_csv_quotes_are_read_as_rfc_4180_and_a_quoted_empty_field_is_empty_text(spark, tmp_path,
                                                                                 declared, eol):
    '''Tester: a quoted field holding say ""hi"" (two quotes for one) was stored with the
    enclosing and doubled quotes kept (Spark's escape is a backslash), and a quoted empty field as
    NULL. Truth: Python's csv module reads the same file; an unquoted empty field is NULL, a
    quoted one the empty string (text columns), and in a number column a quoted empty field is
    NULL too (there is no empty number). A line break inside a quoted value is kept as written:
    CRLF in a CRLF file was stored as LF (tester, 2026-11-29).'''
    from cdc_lake.dimensions.refresh import run_refresh

    values = {1: ['say "hi"', "", "7"], 2: ["a,b", None, ""], 3: ['"', '""', None],
              4: ["two\nlines", " padded ", "8"], 5: ["back\\slash \\", "x", "9"],
              6: ["crlf\r\ninside", "a\r\n\r\nb", "10"]}
    header = ["product_id", "note", "extra", "qty"]
    text = _rfc4180([header] + [[str(k), *v] for k, v in values.items()], eol)
    yaml = _pipeline(tmp_path, "quotes", schema="schema: {product_id: bigint, note: string, "
                     "extra: string, qty: int}\n" if declared else "")
    f = tmp_path / "snaps" / "2026-01-01.csv"
    f.write_bytes(text.encode("utf-8"))
    with open(f, newline="", encoding="utf-8") as fh:
        parsed = list(csv.reader(fh))
    assert parsed[0] == header and {int(r[0]): r[1:] for r in parsed[1:]} == {
        k: [x or "" for x in v] for k, v in values.items()}, "Python's csv reads the values back"
    cfg = load_pipeline(yaml)
    assert run_refresh(cfg, date="2026-01-01", spark=spark, run_id="q1")["status"] == "succeeded"
    got = {r["product_id"]: [r["note"], r["extra"], r["qty"]]
           for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()}
    want = {k: [note, extra, int(qty) if qty else None] for k, (note, extra, qty) in values.items()}
    assert got == want, got


_GOOD = "product_id,category\r\n1,Books\r\n2,\"Toys\r\n& games\"\r\n3,Garden\r\n"


@pytest.mark.parametrize("text,says", [
    ("product_id,category\r\n1,Books\n2,Toys\r\n3,Garden\r\n", "records end with CRLF (3) and with LF (1)"),
    ("product_id,category\n1,A\r\n2,B\r\n", "records end with CRLF (2) and with LF (1)"),
    ("product_id,category\n1,Books\n2,Toys,extra\n3,Garden\n", "line 3 has 3 field(s), the first one (line 1) 2"),
    ("product_id,category\n1,Books\n2\n", "line 3 has 1 field(s)"),
    ("product_id,category\n1,Books\n2,\"5 inch screen\n3,Garden\n4,Tools\n",
     "not valid CSV in the record starting on line 3 (read up to line 5)"),  # open quote
    ("product_id,category\n1,\"ab\"cd\n", "not valid CSV in the record starting on line 2:"),
    ("product_id,category\n1,Caf\xe9\n".encode("latin-1"), "not UTF-8 text: line 2, byte 25 of the file (b'1,Caf\\xe9\\n'"),
    ("", "the file is empty (0 bytes"),
    (_GOOD, None),  # a CRLF inside a quoted value of a CRLF file is a value, not a record end
    (_GOOD.replace("\r\n", "\n"), None),
    ("\ufeffproduct_id,category\n1,A\n\n", None),  # BOM, blank last line
], ids=["lf_in_crlf", "crlf_in_lf", "field_too_many", "field_missing", "open_quote", "stray_quote",
        "latin1", "empty", "crlf_in_value", "lf_in_value", "bom_blank_line"])
def test_a_csv_file_is_checked_by_rfc_4180_before_spark_reads_it(tmp_path, text, says):
    """Testers J and K: Spark's reader took an open quote as one value running to the end of the
    file (every key after it deleted, exit 0), stored Latin-1 bytes as U+FFFD, kept a ``\r`` in
    the last column of a file whose line ends changed, and failed ragged rows with exit 1. Each
    is now an invalid snapshot naming file and line (truth: the cases are written by hand; the
    good files are also read back by Python's csv module)."""
    from cdc_lake.dimensions.csv_check import check_csv_file
    from cdc_lake.dimensions.refresh import SnapshotInvalid

    f = tmp_path / "2026-01-01.csv"
    f.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    if says is None:
        check_csv_file(f, delimiter=",")
        with open(f, newline="", encoding="utf-8-sig") as fh:
            assert [r for r in csv.reader(fh) if r][0] == ["product_id", "category"]
        return
    with pytest.raises(SnapshotInvalid) as e:
        check_csv_file(f, delimiter=",")
    assert str(f) in str(e.value) and says in str(e.value) and "nothing was written" in str(e.value), str(e.value)


def test_an_open_quote_deletes_nothing_and_a_tab_delimiter_is_taken(spark, tmp_path):
    """Tester K: ``3,"5 inch screen`` (a quote left open) made the refresh delete keys 4..10 with
    exit 0; a tab delimiter was refused as "expected a non-empty string"."""
    from cdc_lake.dimensions.refresh import SnapshotInvalid, run_refresh

    yaml = _pipeline(tmp_path, "quote", schema="schema: {product_id: bigint, category: string}\n")
    yaml.write_text(yaml.read_text().replace("format: csv}", "format: csv, delimiter: \"\\t\"}"))
    cfg = load_pipeline(yaml)
    assert cfg.snapshots.delimiter == "\t"
    rows = [f"{i}\tc{i}" for i in range(1, 11)]
    (tmp_path / "snaps" / "2026-01-01.csv").write_text("product_id\tcategory\n" + "\n".join(rows) + "\n")
    assert run_refresh(cfg, date="2026-01-01", spark=spark, run_id="q1")["status"] == "succeeded"
    rows[2] = '3\t"5 inch screen'
    (tmp_path / "snaps" / "2026-01-02.csv").write_text("product_id\tcategory\n" + "\n".join(rows) + "\n")
    with pytest.raises(SnapshotInvalid, match="not valid CSV"):
        run_refresh(cfg, date="2026-01-02", spark=spark, run_id="q2")
    got = {r["product_id"]: r["category"] for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()}
    assert got == {i: f"c{i}" for i in range(1, 11)}


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_snapshot_file_name_with_glob_characters_is_read_literally(spark, tmp_path, fmt):
    """Tester M: pattern ``cats[1]_{date}.csv`` loaded the decoy ``cats1_<date>.csv`` next to it
    (Spark read the path as a glob), exit 0; on a later day the refresh would have deleted every
    key the decoy lacks."""
    from cdc_lake.dimensions.refresh import run_refresh

    yaml = _pipeline(tmp_path, "globs", fmt=fmt)
    yaml.write_text(yaml.read_text().replace(f"format: {fmt}}}", f"format: {fmt}, pattern: \"c*[1]_{{date}}.{fmt}\"}}"))
    cfg = load_pipeline(yaml)
    real = {i: f"c{i}" for i in (1, 2, 3)}
    for name, rows in ((f"c*[1]_2026-01-01.{fmt}", real), (f"cX1_2026-01-01.{fmt}", {9: "WRONG"})):
        f = tmp_path / "snaps" / name
        if fmt == "csv":
            f.write_text("product_id,category\n" + "".join(f"{k},{v}\n" for k, v in rows.items()))
        else:
            pq.write_table(pa.table({"product_id": list(rows), "category": list(rows.values())}), f)
    assert run_refresh(cfg, date="2026-01-01", spark=spark, run_id="g1")["status"] == "succeeded"
    got = {r["product_id"]: r["category"] for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()}
    assert got == real


def test_parquet_text_that_is_not_utf8_is_refused_and_the_table_stays_readable(spark, tmp_path):
    """Tester K: a Parquet ``binary`` column (no UTF8 annotation) holding ``b"Caf\\xe9"`` went
    into the table's ``string`` column with exit 0, and the table could no longer be read by
    anyone (every later refresh exit 1); a UTF8-annotated column with such bytes likewise. Now an
    invalid snapshot naming the column and the bytes; nothing is written."""
    import pyarrow.parquet as pq

    from cdc_lake.dimensions.refresh import SnapshotInvalid, run_refresh

    cfg = load_pipeline(_pipeline(tmp_path, "utf", fmt="parquet"))
    snaps = tmp_path / "snaps"
    ids = pa.array([1, 2], pa.int64())
    nulls = pa.array([None, None], pa.null())  # all NULL: Spark reads the column as int
    pq.write_table(pa.table({"product_id": ids, "w": ["ok", "fine"], "n": nulls}),
                   snaps / "2026-01-01.parquet")
    assert run_refresh(cfg, date="2026-01-01", spark=spark, run_id="u1")["status"] == "succeeded"
    raw = pa.array([b"Caf\xe9", b"plain"], pa.binary())
    for day, w in (("2026-01-02", raw), ("2026-01-03", raw.view(pa.string()))):  # binary; bad string
        pq.write_table(pa.table({"product_id": ids, "w": w, "n": nulls}), snaps / f"{day}.parquet")
        with pytest.raises(SnapshotInvalid) as e:
            run_refresh(cfg, date=day, spark=spark, run_id=f"u{day}")
        assert "['w'] hold text that is not UTF-8" in str(e.value) and "436166E9" in str(e.value), str(e.value)
    got = {r["product_id"]: r["w"] for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()}
    assert got == {1: "ok", 2: "fine"}
    # the all-NULL column was created as text, so later text fills it (it was int: exit 3; tester K)
    assert DeltaTable(str(cfg.table)).schema().to_arrow().field("n").type in (pa.string(), pa.large_string(),
                                                                           pa.string_view())
    pq.write_table(pa.table({"product_id": ids, "w": ["ok", "fine"], "n": ["a", None]}),
                   snaps / "2026-01-04.parquet")
    assert run_refresh(cfg, date="2026-01-04", spark=spark, run_id="u4")["status"] == "succeeded"
    got = {r["product_id"]: r["n"] for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()}
    assert got == {1: "a", 2: None}


def test_a_parquet_file_naming_a_column_twice_in_two_cases_is_an_invalid_snapshot(spark, tmp_path):
    """``Name`` and ``name`` in one Parquet file: Spark's read failed (``COLUMN_ALREADY_EXISTS``,
    exit 1, retried in vain). Now exit 3 naming the file and both spellings; nothing written."""
    import pyarrow.parquet as pq

    from cdc_lake.dimensions.refresh import SnapshotInvalid, run_refresh

    cfg = load_pipeline(_pipeline(tmp_path, "twice", fmt="parquet"))
    f = tmp_path / "snaps" / "2026-01-01.parquet"
    pq.write_table(pa.table({"product_id": [1], "Name": ["a"], "name": ["b"]}), f)
    with pytest.raises(SnapshotInvalid) as e:
        run_refresh(cfg, date="2026-01-01", spark=spark, run_id="t1")
    assert str(e.value).startswith(f"{f}: the snapshot names the column 'Name' twice (as 'name' too"), e.value
    assert not cfg.table.exists()


def test_a_parquet_struct_gaining_or_losing_a_field_is_an_invalid_snapshot(spark, tmp_path):
    """A Parquet export whose struct column gained a field (``struct<a>`` -> ``struct<a,b>``)
    failed the refresh in Spark's value check (``DATATYPE_MISMATCH.CAST_WITHOUT_SUGGESTION``,
    exit 1, which Airflow retries in vain). Now an invalid snapshot (exit 3) naming the file,
    the column and both types; nothing is written; the next export of the table's shape is
    applied."""
    import pyarrow.parquet as pq

    from cdc_lake.dimensions.refresh import SnapshotInvalid, run_refresh

    cfg = load_pipeline(_pipeline(tmp_path, "nested", fmt="parquet"))
    snaps, ids = tmp_path / "snaps", pa.array([1, 2], pa.int64())
    pq.write_table(pa.table({"product_id": ids, "s": [{"a": 1}, {"a": 2}]}), snaps / "2026-01-01.parquet")
    assert run_refresh(cfg, date="2026-01-01", spark=spark, run_id="n1")["status"] == "succeeded"
    before = DeltaTable(str(cfg.table)).version()
    for day, s in (("2026-01-02", [{"a": 1, "b": "x"}, {"a": 3, "b": None}]), ("2026-01-03", [{"c": 1}, {"c": 2}])):  # gained; renamed
        f = snaps / f"{day}.parquet"
        pq.write_table(pa.table({"product_id": ids, "s": s}), f)
        with pytest.raises(SnapshotInvalid) as e:
            run_refresh(cfg, date=day, spark=spark, run_id=f"n{day}")
        msg = str(e.value)
        assert msg.startswith(f"{f}: column 's' is struct<") and "struct<a:bigint>" in msg, msg
        assert "nothing was written" in msg, msg
        assert DeltaTable(str(cfg.table)).version() == before
    pq.write_table(pa.table({"product_id": ids, "s": [{"a": 5}, None]}), snaps / "2026-01-04.parquet")
    assert run_refresh(cfg, date="2026-01-04", spark=spark, run_id="n4")["status"] == "succeeded"
    got = {r["product_id"]: r["s"] for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()}
    assert got == {1: {"a": 5}, 2: None}


@pytest.mark.parametrize("scd", [1, 2])
def test_a_snapshot_refused_by_the_delete_limit_does_not_widen_the_table(spark, tmp_path, scd):
    """Tester K: a cut-off export (``0,1.5``) refused by ``max_deleted_fraction`` said "nothing
    was written" but had committed the widening of ``w`` int -> double first. The limit is now
    checked on the diff before any commit; the complete file then widens and applies."""
    from cdc_lake.dimensions.refresh import SnapshotInvalid, run_refresh

    yaml = _pipeline(tmp_path, "cut")
    yaml.write_text(yaml.read_text().replace("format: csv}", "format: csv, max_deleted_fraction: 0.2}")
                    .replace("scd: 1", f"scd: {scd}"))
    cfg = load_pipeline(yaml)
    snaps = tmp_path / "snaps"
    (snaps / "2026-01-01.csv").write_text("product_id,w\n" + "".join(f"{i},{i}\n" for i in range(10)))
    assert run_refresh(cfg, date="2026-01-01", spark=spark, run_id="c1")["status"] == "succeeded"
    before = DeltaTable(str(cfg.table))
    version, schema = before.version(), str(before.schema().to_arrow())
    (snaps / "2026-01-02.csv").write_text("product_id,w\n0,1.5\n")
    with pytest.raises(SnapshotInvalid, match="would delete 9 of the table's 10"):
        run_refresh(cfg, date="2026-01-02", spark=spark, run_id="c2")
    after = DeltaTable(str(cfg.table))
    assert (after.version(), str(after.schema().to_arrow())) == (version, schema)
    (snaps / "2026-01-02.csv").write_text("product_id,w\n0,1.5\n" + "".join(f"{i},{i}\n" for i in range(1, 10)))
    summary = run_refresh(cfg, date="2026-01-02", spark=spark, run_id="c3")
    assert summary["status"] == "succeeded" and summary["widened"] == {"w": "int -> double"}, summary
    rows = DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()
    current = {r["product_id"]: r["w"] for r in rows if scd == 1 or r["_is_current"]}
    assert current == {0: 1.5, **{i: float(i) for i in range(1, 10)}}


def test_spark_csv_parse_failure_is_an_invalid_snapshot(tmp_path):
    """The backstop behind the file check: Spark's FAILFAST ``MALFORMED_CSV_RECORD`` (it was
    exit 1, retried, with a Java stack tail; tester J) becomes an invalid snapshot naming the file
    and the record; another error stays what it is."""
    from cdc_lake.dimensions.snapshot import malformed_csv

    cfg = load_pipeline(_pipeline(tmp_path, "eol"))
    f = tmp_path / "snaps" / "2026-01-01.csv"
    f.write_bytes(b"product_id,category\r\n1,Books\n2,Toys\r\n")
    err = RuntimeError("An error occurred while calling o128.collectToPython.\n: org.apache.spark."
                       "SparkRuntimeException: [MALFORMED_CSV_RECORD] Malformed CSV record: 1,Books\n2,Toys"
                       " SQLSTATE: KD000\n\tat org.apache.spark.sql.errors...")
    bad = malformed_csv(cfg, f, err)
    assert bad is not None and str(f) in str(bad) and "'1,Books\\n2,Toys'" in str(bad), str(bad)
    assert "first line ends with CRLF" in str(bad)
    assert malformed_csv(cfg, f, RuntimeError("[PATH_NOT_FOUND] ...")) is None


def _fraction_beyond_micros(text: str) -> bool:
    """Whether timestamp text has a non-zero fraction digit past the 6th (plain Python)."""
    import re

    m = re.search(r":\d\d\.(\d+)", text)
    return bool(m) and m.group(1)[6:].strip("0") != ""


def _micros_datetime(text: str) -> datetime:
    """``YYYY-MM-DD HH:MM:SS[.f...]`` whose digits past the 6th are zeros, as a datetime."""
    base, _, frac = text.partition(".")
    assert frac[6:].strip("0") == "", text
    return datetime.strptime(base, "%Y-%m-%d %H:%M:%S") + timedelta(microseconds=int((frac + "000000")[:6]))


@pytest.mark.parametrize("declared", [False, True])
def test_timestamp_digits_beyond_microseconds_are_an_invalid_snapshot(spark, tmp_path, capsys, declared):
    """Tester: ``10:00:00.1234567`` was stored as ``10:00:00.123456`` and ``10:00:00.0000009`` as
    ``10:00:00`` (exit 0), with inferred types and with ``schema: {seen: timestamp}``. Now exit 3
    naming file, column and values, nothing written; trailing zeros (``.1234560``) are exact and
    stored. Inferred types are checked like declared ones: a decimal text a double would round
    (18 significant digits) is refused too, with the fix to declare the column in ``schema:``."""
    from decimal import Decimal

    job = _job()
    yaml = _pipeline(tmp_path, "stamps", schema="schema: {product_id: bigint, seen: timestamp, "
                     "w: string}\n" if declared else "")
    day1 = {1: ("2026-01-01 10:00:00.1234560", "1.5"), 2: ("2026-01-01 10:00:00", "2.25")}
    day2 = {1: ("2026-01-01 10:00:00.1234567", "1.5"), 2: ("2026-01-01 10:00:00.0000009", "2.25"),
            3: ("2026-01-01 10:00:00.123456000", "1.00000000000000001")}
    for day, rows in (("2026-01-01", day1), ("2026-01-02", day2)):
        (tmp_path / "snaps" / f"{day}.csv").write_text("product_id,seen,w\n" + "".join(
            f"{k},{s},{w}\n" for k, (s, w) in rows.items()), encoding="utf-8")
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-01"]) == 0
    cfg = load_pipeline(yaml)
    rows = DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()
    assert {r["product_id"]: r["seen"].replace(tzinfo=None) for r in rows} == {
        k: _micros_datetime(s) for k, (s, _) in day1.items()}, rows
    version = DeltaTable(str(cfg.table)).version()
    capsys.readouterr()

    f2 = tmp_path / "snaps" / "2026-01-02.csv"
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-02"]) == 3
    err = capsys.readouterr().err
    bad = [s for s, _ in day2.values() if _fraction_beyond_micros(s)]
    assert len(bad) == 2 and "INVALID SNAPSHOT" in err and str(f2) in err, err
    assert f"column 'seen': {len(bad)} value(s) with a non-zero digit beyond microseconds" in err, err
    assert all(repr(s) in err for s in bad) and "Traceback" not in err, err
    rounded = [w for _, w in day2.values() if Decimal(float(w)) != Decimal(w)]
    if declared:  # w is declared string: its text is kept
        assert "'w'" not in err, err
    else:
        assert rounded == ["1.00000000000000001"] and "column 'w': 1 value(s)" in err, err
        assert repr(rounded[0]) in err and "type double" in err, err
        assert "declare the columns in `schema:`" in err and "string keeps the text" in err, err
    assert DeltaTable(str(cfg.table)).version() == version, "nothing written"


def test_parquet_nanosecond_timestamps_are_read_when_whole_microseconds(spark, tmp_path, capsys):
    """Tester: a Parquet snapshot with nanosecond timestamps (pandas' default unit) failed with
    Spark's PARQUET_TYPE_ILLEGAL traceback, exit 1 (retried by Airflow for ever). Whole
    microseconds are stored (UTC-adjusted as timestamp, local as timestamp_ntz); a non-zero
    nanosecond digit is exit 3 naming file, column and value, nothing written; nanoseconds
    nested in a struct are refused before Spark reads the file. Truth: the file's own int64
    nanoseconds, read with pyarrow."""
    from datetime import timezone as tz

    job = _job()
    yaml = _pipeline(tmp_path, "nanos", fmt="parquet")
    snaps = tmp_path / "snaps"
    good = [1_700_000_000_123_456_000, -1_000, None, 0]

    def land(day: str, at: list, local: list, **extra) -> Path:  # type: ignore[no-untyped-def]
        f = snaps / f"{day}.parquet"
        pq.write_table(pa.table({"product_id": pa.array(range(1, len(at) + 1), pa.int64()),
                                 "at": pa.array(at, pa.timestamp("ns", tz="UTC")),
                                 "local": pa.array(local, pa.timestamp("ns")), **extra}), f)
        return f

    f1 = land("2026-01-01", good, list(reversed(good)))
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-01"]) == 0
    back = pq.read_table(f1)
    nanos = {c: back.column(c).cast(pa.int64()).to_pylist() for c in ("at", "local")}

    def as_datetime(ns: int | None, utc: bool) -> datetime | None:
        if ns is None:
            return None
        assert ns % 1000 == 0
        t = datetime(1970, 1, 1) + timedelta(microseconds=ns // 1000)
        return t.replace(tzinfo=tz.utc) if utc else t

    cfg = load_pipeline(yaml)
    dt = DeltaTable(str(cfg.table))
    got = {r["product_id"]: (r["at"], r["local"]) for r in dt.to_pyarrow_table().to_pylist()}
    assert got == {k: (as_datetime(a, True), as_datetime(b, False)) for k, a, b in
                   zip(back.column("product_id").to_pylist(), nanos["at"], nanos["local"])}, got
    types = {f.name: f.type.type for f in dt.schema().fields}
    assert (types["at"], types["local"]) == ("timestamp", "timestamp_ntz"), types
    version = dt.version()
    capsys.readouterr()

    f2 = land("2026-01-02", [1_700_000_000_123_456_789, 0], [5, 1_000])
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-02"]) == 3
    err = capsys.readouterr().err
    for column, ns, text in (("at", 1_700_000_000_123_456_789, "2023-11-14T22:13:20.123456789Z"),
                             ("local", 5, "1970-01-01T00:00:00.000000005")):
        assert ns % 1000 and datetime(1970, 1, 1) + timedelta(seconds=ns // 10**9) == \
            datetime.fromisoformat(text.rstrip("Z")[:19]), "the fixture's text is the value"
        assert f"column {column!r}: 1 value(s) with a non-zero digit beyond microseconds" in err, err
        assert repr(text) in err, err
    assert "INVALID SNAPSHOT" in err and str(f2) in err and "microseconds" in err, err
    assert "Traceback" not in err and "PARQUET_TYPE_ILLEGAL" not in err, err
    f3 = land("2026-01-03", [0], [0], nested=pa.array([{"t": 1}], pa.struct([("t", pa.timestamp("ns"))])))
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-03"]) == 3
    err = capsys.readouterr().err
    assert str(f3) in err and "['nested']" in err and "Traceback" not in err, err
    assert DeltaTable(str(cfg.table)).version() == version, "nothing written"


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_column_renamed_only_in_case_is_the_same_column(spark, tmp_path, capsys, fmt):
    """Tester: a header ``Name`` on day 1 and ``name`` on day 2 was refused as "column(s)
    ['Name'] ... missing from the snapshot". Spark and Delta resolve names case-insensitively:
    it is the same column, stored under the table's spelling, and the run says so."""
    job = _job()
    yaml = _pipeline(tmp_path, "spelling", fmt=fmt)
    days = {"2026-01-01": (["product_id", "Name"], [["1", "a"], ["2", "b"]]),
            "2026-01-02": (["Product_ID", "name"], [["1", "a"], ["2", "c"], ["3", "d"]])}
    for day, (header, rows) in days.items():
        if fmt == "csv":
            with open(tmp_path / "snaps" / f"{day}.csv", "w", newline="", encoding="utf-8") as fh:
                csv.writer(fh).writerows([header, *rows])
        else:
            pq.write_table(pa.table({header[0]: pa.array([int(r[0]) for r in rows], pa.int64()),
                                     header[1]: [r[1] for r in rows]}),
                           tmp_path / "snaps" / f"{day}.parquet")
        assert job.main(["--pipeline", str(yaml), "--date", day]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "column 'name' is the table's 'Name'" in out, out
    rows = DeltaTable(str(load_pipeline(yaml).table)).to_pyarrow_table().to_pylist()
    assert {r["product_id"]: (r["Name"], str(r["_snapshot_date"])) for r in rows} == {
        1: ("a", "2026-01-01"), 2: ("c", "2026-01-02"), 3: ("d", "2026-01-02")}, rows
    assert set(rows[0]) == {"product_id", "Name", "_snapshot_date"}, rows


@pytest.mark.parametrize("scd", [1, 2])
def test_a_snapshot_deleting_more_than_max_deleted_fraction_is_refused(spark, tmp_path, scd):
    """Tester, 2026-11-29: a header-only (or cut-off) export deletes every row it lacks, exit 0.
    With ``snapshots.max_deleted_fraction`` such a snapshot is an invalid snapshot (exit 3)
    naming the counts, nothing written; deletes within the limit are applied."""
    from cdc_lake.dimensions.refresh import SnapshotInvalid, run_refresh

    yaml = tmp_path / "dim.yaml"
    yaml.write_text("kind: dimension\npipeline: guard\nsnapshots: {path: snaps, format: csv, "
                    "max_deleted_fraction: 0.5}\nkeys: [product_id]\n"
                    f"scd: {scd}\ntable: lake/guard\nengine: {{name: deltalake}}\n", encoding="utf-8")
    cfg = load_pipeline(yaml)
    day = [DAY0 + timedelta(days=i) for i in range(3)]
    _write_snapshot(tmp_path / "snaps", "csv", day[0], {k: {"category": f"c{k}"} for k in (1, 2, 3, 4)})
    _write_snapshot(tmp_path / "snaps", "csv", day[1], {1: {"category": "c1"}})  # 3 of 4 gone
    _write_snapshot(tmp_path / "snaps", "csv", day[2], {k: {"category": f"c{k}"} for k in (1, 2, 3)})
    assert run_refresh(cfg, date=day[0].isoformat(), spark=spark, run_id="d0")["status"] == "succeeded"
    version = DeltaTable(str(cfg.table)).version()
    with pytest.raises(SnapshotInvalid) as e:
        run_refresh(cfg, date=day[1].isoformat(), spark=spark, run_id="d1")
    assert "would delete 3 of the table's 4 current row(s) (75.0%)" in str(e.value), str(e.value)
    assert "max_deleted_fraction 0.5" in str(e.value), str(e.value)
    assert DeltaTable(str(cfg.table)).version() == version, "nothing written"
    s = run_refresh(cfg, date=day[2].isoformat(), spark=spark, run_id="d2")  # 1 of 4: within
    assert (s["status"], s["deleted"]) == ("succeeded", 1), s
    current = [r for r in DeltaTable(str(cfg.table)).to_pyarrow_table().to_pylist()
               if r.get("_is_current", True)]
    assert sorted(r["product_id"] for r in current) == [1, 2, 3]

    yaml.write_text(yaml.read_text(encoding="utf-8").replace("0.5", "1.5"), encoding="utf-8")
    with pytest.raises(ConfigError, match="snapshots.max_deleted_fraction"):
        load_pipeline(yaml)


def test_a_timestamp_with_a_named_zone_is_an_invalid_snapshot(spark, tmp_path, capsys):
    """Tester L: ``2026-11-01 01:30:00 PST`` (the hour Los Angeles repeats) was stored as the PDT
    instant, ``CST`` as US Central instead of China Standard Time, exit 0. A zone by name is no
    fixed offset: exit 3 naming the values; an offset, ``Z`` or ``UTC`` is taken."""
    job = _job()
    yaml = _pipeline(tmp_path, "zones", schema="schema: {product_id: bigint, seen: timestamp}\n")
    snaps = tmp_path / "snaps"
    (snaps / "2026-01-01.csv").write_text(
        "product_id,seen\n1,2026-11-01 01:30:00 PST\n2,2026-11-01 01:30:00 CST\n"
        "3,2026-11-01 01:30:00 America/Los_Angeles\n4,2026-11-01T01:30:00-08:00\n", encoding="utf-8")
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-01"]) == 3
    err = capsys.readouterr().err
    assert "INVALID SNAPSHOT" in err and "3 value(s) with a time zone given by name" in err, err
    assert "'2026-11-01 01:30:00 PST'" in err and "Traceback" not in err, err
    (snaps / "2026-01-02.csv").write_text(
        "product_id,seen\n1,2026-11-01T01:30:00-08:00\n2,2026-11-01 01:30:00 UTC\n3,2026-11-01T01:30:00Z\n",
        encoding="utf-8")
    assert job.main(["--pipeline", str(yaml), "--date", "2026-01-02"]) == 0
    rows = DeltaTable(str(load_pipeline(yaml).table)).to_pyarrow_table().to_pylist()
    assert {r["product_id"]: r["seen"].replace(tzinfo=None) for r in rows} == {
        1: datetime(2026, 11, 1, 9, 30), 2: datetime(2026, 11, 1, 1, 30), 3: datetime(2026, 11, 1, 1, 30)}


def test_a_table_another_pipeline_or_a_hand_wrote_is_not_refreshed(spark, tmp_path):
    """Tester: two dimension YAMLs naming one ``table:``, run by hand: the second's refresh
    diffed the first's table against its own snapshot and made it that snapshot (the other's
    rows deleted), exit 0. Now the owner marks are checked first (exit 3, nothing written); a
    hand-made table with rows is refused too; the owner's own refreshes go on."""
    from cdc_lake.checkpoint_log import PipelineStateError
    from cdc_lake.dimensions.refresh import run_refresh
    from deltalake import write_deltalake

    def rows(table: Path) -> dict[int, str]:
        return {r["product_id"]: r["category"] for r in DeltaTable(str(table)).to_pyarrow_table().to_pylist()}

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    owner = load_pipeline(_pipeline(tmp_path / "a", "cats_a"))
    other_yaml = _pipeline(tmp_path / "b", "cats_b")
    other_yaml.write_text(other_yaml.read_text().replace("table: lake/cats_b", f"table: {owner.table}"))
    other = load_pipeline(other_yaml)
    assert other.table == owner.table
    _write_snapshot(tmp_path / "a" / "snaps", "csv", DAY0, {1: {"category": "toys"}, 2: {"category": "books"}})
    _write_snapshot(tmp_path / "b" / "snaps", "csv", DAY0, {3: {"category": "garden"}})
    assert run_refresh(owner, date=str(DAY0), spark=spark, run_id="a1")["status"] == "succeeded"
    version = DeltaTable(str(owner.table)).version()
    with pytest.raises(PipelineStateError) as e:
        run_refresh(other, date=str(DAY0), spark=spark, run_id="b1")
    msg = str(e.value)
    assert "pipeline 'cats_a' (kind: dimension)" in msg and f"`table:` in {other.file}" in msg, msg
    assert rows(owner.table) == {1: "toys", 2: "books"} and DeltaTable(str(owner.table)).version() == version
    day1 = DAY0 + timedelta(days=1)
    _write_snapshot(tmp_path / "a" / "snaps", "csv", day1, {1: {"category": "games"}})
    assert run_refresh(owner, date=str(day1), spark=spark, run_id="a2")["status"] == "succeeded"
    assert rows(owner.table) == {1: "games"}

    (tmp_path / "c").mkdir()
    hand = load_pipeline(_pipeline(tmp_path / "c", "cats_c"))
    write_deltalake(str(hand.table), pa.table({"product_id": pa.array([9], pa.int64()), "category": ["x"]}))
    _write_snapshot(tmp_path / "c" / "snaps", "csv", DAY0, {4: {"category": "garden"}})
    with pytest.raises(PipelineStateError) as e:
        run_refresh(hand, date=str(DAY0), spark=spark, run_id="c1")
    assert "no owner mark" in str(e.value), e.value
    assert rows(hand.table) == {9: "x"}
