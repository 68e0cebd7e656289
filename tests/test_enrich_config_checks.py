"""Enrichment config mistakes fail before any stream starts: exit 2, naming file, key and value.

Load-time checks (no Spark: :mod:`cdc_lake.enrich.validate`, :mod:`cdc_lake.config`) and the
preflight against the real tables and Spark's SQL analyzer (:mod:`cdc_lake.enrich.preflight`,
run by ``run_enrich`` right after the session is built). Before these checks each case below
ran into Spark mid-stream (exit 1, a raw ``AnalysisException``), failed only on some data
(a string sum), or was refused/garbled at load (``${N:-10}``, an unquoted ``${WAIT:-1d}``).
Also: the example pipelines still load, a broken enrich YAML is the Airflow import error with
the same message, and a ``--reprocess`` summary reports its snapshot batch on its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from cdc_lake.config import ConfigError, load_all, load_pipeline

REPO = Path(__file__).resolve().parents[1]
CDF = {"delta.enableChangeDataFeed": "true"}

# ------------------------------------------------------------------ YAML templates

CHANGE_FEED = """\
kind: enrich
pipeline: lines
fact: {change_feed: facts, keys: [line_id]}
dimensions:
  products: {table: products, keys: [id], scd: 1, on: {product_id: id},
             columns: {product_name: name, category: cat}}
event_time: ts
outputs:
  enriched: gold/lines
  aggregates:
    rev: {group_by: [category], time_bucket: day, sums: {revenue: "qty * price", units: qty}}
engine: {name: deltalake}
"""

EVENTS = """\
kind: enrich
pipeline: clicks
fact:
  events: {path: landing, id: event_id, time: event_ts,
           schema: {event_id: string, product_id: bigint, qty: bigint, event_ts: timestamp}}
dimensions:
  products: {table: products, keys: [id], scd: 1, on: {product_id: id}, columns: {category: cat}}
event_time: event_ts
outputs:
  enriched: gold/clicks
  aggregates:
    rev: {group_by: [category], time_bucket: day, sums: {units: qty}}
engine: {name: deltalake}
"""


def write(tmp: Path, body: str, name: str = "p.yaml") -> Path:
    f = tmp / name
    f.write_text(textwrap.dedent(body), encoding="utf-8")
    return f


def edit(body: str, old: str, new: str) -> str:
    assert old in body, old
    return body.replace(old, new)


def refused(file: Path, key: str, *values: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_pipeline(file)
    msg = str(e.value)
    assert e.value.key == key and msg.startswith(f"{file}: {key}: "), msg
    for v in values:
        assert v in msg, (v, msg)
    return msg


# ------------------------------------------------------------------ at load, no Spark

LOAD_CASES = {
    # name: (template, old, new, key, texts the message must hold)
    "sum named like a group_by column": (
        CHANGE_FEED, "revenue: \"qty", "category: \"qty",
        "outputs.aggregates.rev.sums.category", ["'category'", "group_by column"]),
    "sum named like the day bucket": (
        CHANGE_FEED, "units: qty", "day: qty", "outputs.aggregates.rev.sums.day",
        ["'day'", "time bucket column"]),
    "sum named count (any case)": (
        CHANGE_FEED, "units: qty", "Count: qty", "outputs.aggregates.rev.sums.Count",
        ["'Count'", "'count'"]),
    "sums differing in case only": (
        CHANGE_FEED, "units: qty", "Revenue: qty", "outputs.aggregates.rev.sums.Revenue",
        ["'Revenue'", "another sum", "'revenue'"]),
    "group_by the bucket column": (
        CHANGE_FEED, "group_by: [category]", "group_by: [category, day]",
        "outputs.aggregates.rev.group_by", ["'day'", "time bucket"]),
    "dimension output named like a job column (any case)": (
        CHANGE_FEED, "category: cat}", "category: cat, _Fact_Version: name}",
        "dimensions.products.columns._Fact_Version", ["'_Fact_Version'", "'_fact_version'", "reserved"]),
    "dimension outputs differing in case only": (
        CHANGE_FEED, "category: cat}", "category: cat, Category: name}",
        "dimensions.products.columns.Category", ["'Category'", "dimensions.products.columns.category"]),
    "events: fact.keys not in the schema": (
        EVENTS, "event_ts: timestamp}}", "event_ts: timestamp}}\n  keys: [click_id]",
        "fact.keys", ["['click_id']", "'event_id'", "fact.events.schema"]),
    "events: event time declared string": (
        EVENTS, "event_ts: timestamp}", "event_ts: string}", "fact.events.schema.event_ts",
        ["'event_ts'", "'string'", "timestamp"]),
    "events: event_time not a column": (
        EVENTS, "event_time: event_ts", "event_time: event_time",
        "event_time", ["'event_time'", "event_id", "product_id"]),
    "events: group_by not a column": (
        EVENTS, "group_by: [category]", "group_by: [categry]",
        "outputs.aggregates.rev.group_by", ["['categry']", "'category'", "'qty'"]),
    "events: join column not a column": (
        EVENTS, "on: {product_id: id}", "on: {productid: id}",
        "dimensions.products.on", ["'productid'", "'product_id'"]),
    "events: a decimal type split at its comma by a flow mapping": (
        EVENTS, "event_ts: timestamp}", "event_ts: timestamp, price: decimal(10,2)}", "fact.events.schema",
        ["column names to Spark types", "'decimal(10'", 'quote it, price: "decimal(10,2)"']),
    "events: dimension output is a fact column": (
        EVENTS, "columns: {category: cat}", "columns: {category: cat, QTY: name}",
        "dimensions.products.columns.QTY", ["'QTY'", "'qty'"]),
}


@pytest.mark.parametrize("case", sorted(LOAD_CASES))
def test_load_refuses(tmp_path: Path, case: str) -> None:
    template, old, new, key, texts = LOAD_CASES[case]
    refused(write(tmp_path, edit(template, old, new)), key, *texts)


def test_valid_templates_and_example_pipelines_load(tmp_path: Path) -> None:
    assert load_pipeline(write(tmp_path, CHANGE_FEED)).outputs.aggregates[0].sums[0][0] == "revenue"
    assert load_pipeline(write(tmp_path, EVENTS, "e.yaml")).fact.events.time == "event_ts"
    ok, bad = load_all(REPO / "pipelines")
    assert bad == [] and {"shop_order_lines", "product_categories", "shop_maxwell"} <= {c.name for c in ok}


def test_integer_and_scd_settings_take_substituted_digits(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("N", raising=False)
    monkeypatch.setenv("SCD", "1")
    body = edit(CHANGE_FEED, "keys: [line_id]}", "keys: [line_id], max_versions_per_trigger: \"${N:-10}\"}")
    body = edit(body, "scd: 1", "scd: \"${SCD}\"") + "retries: ${R:-3}\n"
    cfg = load_pipeline(write(tmp_path, body))
    assert (cfg.fact.max_versions_per_trigger, cfg.dimensions[0].scd, cfg.retries) == (10, 1, 3)
    monkeypatch.setenv("N", "ten")
    refused(write(tmp_path, body), "fact.max_versions_per_trigger", "expected an integer >= 1", "'ten'")
    monkeypatch.setenv("N", "0")
    refused(write(tmp_path, body), "fact.max_versions_per_trigger", "'0'")


def test_unquoted_substitution_in_a_flow_mapping_names_line_and_fix(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("WAIT", raising=False)
    body = CHANGE_FEED + "late_members: {wait: ${WAIT:-1d}}\n"
    f = write(tmp_path, body)
    line = body.splitlines().index("late_members: {wait: ${WAIT:-1d}}") + 1
    with pytest.raises(ConfigError) as e:
        load_pipeline(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: line {line}, column ") and "not valid YAML" in msg, msg
    assert "${WAIT:-1d} unquoted" in msg and 'wait: "${WAIT:-1d}"' in msg, msg
    assert "<unicode string>" not in msg
    # quoted it loads; so does the block form, where braces are not YAML syntax
    assert load_pipeline(write(tmp_path, CHANGE_FEED + 'late_members: {wait: "${WAIT:-1d}"}\n')).late_wait.days == 1
    assert load_pipeline(write(tmp_path, CHANGE_FEED + "late_members:\n  wait: ${WAIT:-1d}\n")).late_wait.days == 1


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    body = CHANGE_FEED + "event_time: ts\n"  # PyYAML kept the last one silently
    f = write(tmp_path, body)
    first = body.splitlines().index("event_time: ts") + 1
    with pytest.raises(ConfigError) as e:
        load_pipeline(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: line {len(body.splitlines())}, column 1: ")
    assert f"'event_time' twice (first on line {first})" in msg, msg


def test_broken_enrich_yaml_is_the_dag_import_error_with_the_same_message(tmp_path: Path) -> None:
    from cdc_lake.airflow.dag_factory import PipelineConfigErrors, check_pipeline_configs

    bad = write(tmp_path, edit(CHANGE_FEED, "units: qty", "day: qty"), "bad.yaml")
    write(tmp_path, EVENTS, "good.yaml")
    with pytest.raises(PipelineConfigErrors) as e:
        check_pipeline_configs(tmp_path)
    msg = str(e.value)
    assert f"{bad}: outputs.aggregates.rev.sums.day: the sum name 'day'" in msg, msg
    assert "1 pipeline config file(s)" in msg and "good.yaml" not in msg


def test_script_exits_2_on_a_load_time_mistake(tmp_path: Path) -> None:
    """The job script itself (no Spark is started for a load-time mistake)."""
    f = write(tmp_path, edit(CHANGE_FEED, "revenue: \"qty", "category: \"qty"))
    p = subprocess.run([sys.executable, str(REPO / "spark_jobs" / "enrich.py"), "--pipeline", str(f)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert f"[enrich] CONFIG ERROR: {f}: outputs.aggregates.rev.sums.category: " in p.stderr


# ------------------------------------------------------------------ preflight: tables + Spark


def _lake(tmp: Path, *, scd2_products: bool = False) -> None:
    ts = datetime(2026, 1, 2, 10, tzinfo=timezone.utc)
    write_deltalake(str(tmp / "facts"), pa.table({
        "line_id": [1], "product_id": [1], "sku": ["1"], "qty": [2], "price": pa.array([1.5]),
        "ts": pa.array([ts], pa.timestamp("us", tz="UTC"))}), configuration=CDF)
    dim = {"id": [1], "name": ["apple"], "cat": ["fruit"]}
    if scd2_products:  # an SCD2 table without its version columns
        dim["_is_current"] = [True]
    write_deltalake(str(tmp / "products"), pa.table(dim), configuration=CDF)


PREFLIGHT_CASES = {
    # name: (old, new, key, texts); the template is CHANGE_FEED over _lake()
    "sum does not parse": ("\"qty * price\"", "\"qty *\"", "outputs.aggregates.rev.sums.revenue",
                           ["'qty *'", "PARSE_SYNTAX_ERROR", "'price'"]),
    "sum does not resolve": ("\"qty * price\"", "\"no_such_col * 2\"", "outputs.aggregates.rev.sums.revenue",
                             ["'no_such_col * 2'", "no_such_col", "'product_name'"]),
    "sum of a string": ("\"qty * price\"", "product_name", "outputs.aggregates.rev.sums.revenue",
                        ["'product_name'", "type string", "numeric"]),
    "sum is an aggregate": ("\"qty * price\"", "\"sum(qty)\"", "outputs.aggregates.rev.sums.revenue",
                            ["'sum(qty)'", "GROUP BY"]),
    "event_time not a fact column": ("event_time: ts", "event_time: tss", "event_time",
                                     ["'tss'", "'ts'", "facts version 0"]),
    "event_time not a time": ("event_time: ts", "event_time: qty", "event_time",
                              ["'qty'", "bigint", "time_bucket: day"]),
    "group_by not an enriched column": ("group_by: [category]", "group_by: [categry]",
                                        "outputs.aggregates.rev.group_by", ["['categry']", "'category'"]),
    "fact.keys not a fact column": ("keys: [line_id]}", "keys: [lineid]}", "fact.keys",
                                    ["['lineid']", "'line_id'", "facts version 0"]),
    "join column not a fact column": ("on: {product_id: id}", "on: {productid: id}",
                                      "dimensions.products.on", ["'productid'", "'product_id'"]),
    "join column of another kind than the key": ("on: {product_id: id}", "on: {sku: id}",
                                                 "dimensions.products.on.sku",
                                                 ["'sku' is string", "'id'", "bigint", "'01' matches"]),
    "join column a double against an integer key": ("on: {product_id: id}", "on: {price: id}",
                                                    "dimensions.products.on.price",
                                                    ["'price' is double", "bigint", "2^53"]),
    "dimension output is a fact column": ("category: cat}", "category: cat, QTY: name}",
                                          "dimensions.products.columns.QTY", ["'QTY'", "'qty'"]),
    "dimension column not in its table": ("category: cat}", "category: catt}",
                                          "dimensions.products.columns.category", ["'catt'", "'cat'", "version 0"]),
    "dimension key not in its table": ("keys: [id], scd: 1, on: {product_id: id}",
                                       "keys: [idd], scd: 1, on: {product_id: idd}",
                                       "dimensions.products.keys", ["'idd'", "'id'"]),
    "SCD2 dimension without version columns": ("scd: 1", "scd: 2", "dimensions.products.scd",
                                               ["'_valid_from'", "SCD2"]),
}


@pytest.mark.parametrize("case", sorted(PREFLIGHT_CASES))
def test_preflight_refuses_before_the_stream(spark, tmp_path: Path, case: str) -> None:
    from cdc_lake.enrich.job import run_enrich

    old, new, key, texts = PREFLIGHT_CASES[case]
    _lake(tmp_path)
    cfg = load_pipeline(write(tmp_path, edit(CHANGE_FEED, old, new)))
    with pytest.raises(ConfigError) as e:
        run_enrich(cfg, spark=spark, run_id="r1")
    msg = str(e.value)
    assert e.value.key == key and msg.startswith(f"{cfg.file}: {key}: "), msg
    for t in texts:
        assert t in msg, (t, msg)
    assert not (tmp_path / "gold" / "lines").exists()          # nothing written
    assert not (cfg.checkpoint_path / "offsets").exists()      # no stream started


def test_preflight_refuses_an_unparsable_events_type(spark, tmp_path: Path) -> None:
    from cdc_lake.enrich.job import run_enrich

    _lake(tmp_path)
    cfg = load_pipeline(write(tmp_path, edit(EVENTS, "qty: bigint", "qty: bigintt")))
    with pytest.raises(ConfigError) as e:
        run_enrich(cfg, spark=spark, run_id="r1")
    assert str(e.value).startswith(f"{cfg.file}: fact.events.schema.qty: 'bigintt' is not a Spark SQL type")


@pytest.mark.parametrize("id_type", ["map<string,int>", "array<map<string,int>>"])
def test_preflight_refuses_an_event_id_spark_cannot_deduplicate(spark, tmp_path: Path,
                                                                 id_type: str) -> None:
    """Before: the config passed and the first batch failed in Spark's dedup (exit 1)."""
    from cdc_lake.enrich.job import run_enrich

    _lake(tmp_path)
    (tmp_path / "landing").mkdir()
    cfg = load_pipeline(write(tmp_path, edit(EVENTS, "event_id: string", f"event_id: '{id_type}'")))
    with pytest.raises(ConfigError) as e:
        run_enrich(cfg, spark=spark, run_id="r1")
    msg = str(e.value)
    assert e.value.key == "fact.events.schema.event_id", msg
    assert msg.startswith(f"{cfg.file}: fact.events.schema.event_id: 'event_id'") and "map<string,int>" in msg
    assert not (cfg.checkpoint_path / "offsets").exists()  # no stream started


def test_a_missing_events_landing_folder_is_a_config_error(spark, tmp_path: Path) -> None:
    """Before: a raw PATH_NOT_FOUND traceback from the stream (exit 1)."""
    from cdc_lake.enrich.job import run_enrich

    _lake(tmp_path)
    cfg = load_pipeline(write(tmp_path, EVENTS))
    with pytest.raises(ConfigError) as e:
        run_enrich(cfg, spark=spark, run_id="r1")
    msg = str(e.value)
    assert e.value.key == "fact.events.path", msg
    assert msg.startswith(f"{cfg.file}: fact.events.path: ") and str(tmp_path / "landing") in msg
    assert "does not exist" in msg
    assert not (cfg.checkpoint_path / "offsets").exists()
    (tmp_path / "landing").mkdir()  # created: the run goes on
    assert run_enrich(cfg, spark=spark, run_id="r2")["facts_read"] == 0


def test_fact_columns_named_like_the_jobs_working_columns_are_refused(spark, tmp_path: Path) -> None:
    """Before: a fact column `_reason` was silently left out of the enriched table (exit 0),
    `_origin` / `_fact_version` failed mid-batch with AMBIGUOUS_REFERENCE, `_missing` with a
    delta-rs duplicate-field error (exit 1). A fact column `count` is fine."""
    from cdc_lake.enrich.job import run_enrich

    ts = datetime(2026, 1, 2, 10, tzinfo=timezone.utc)
    for col in ("_Reason", "_origin", "count"):
        lake = tmp_path / col
        write_deltalake(str(lake / "facts"), pa.table({
            "line_id": [1], "product_id": [1], col: [7], "qty": [2], "price": pa.array([1.5]),
            "ts": pa.array([ts], pa.timestamp("us", tz="UTC"))}), configuration=CDF)
        write_deltalake(str(lake / "products"), pa.table({"id": [1], "name": ["apple"], "cat": ["fruit"]}),
                        configuration=CDF)
        cfg = load_pipeline(write(lake, CHANGE_FEED))
        if col == "count":
            run_enrich(cfg, spark=spark, run_id="r1")
            enriched = DeltaTable(str(lake / "gold" / "lines")).to_pyarrow_table().to_pylist()
            assert [r["count"] for r in enriched] == [7]
            continue
        with pytest.raises(ConfigError) as e:
            run_enrich(cfg, spark=spark, run_id="r1")
        msg = str(e.value)
        assert e.value.key == "fact.change_feed" and f"['{col}']" in msg and f"['{col.lower()}']" in msg, msg
        assert not (lake / "gold" / "lines").exists() and not (cfg.checkpoint_path / "offsets").exists()
    # the events schema is checked at load
    refused(write(tmp_path, edit(EVENTS, "qty: bigint", "qty: bigint, _fate: string")),
            "fact.events.schema", "['_fate']")
    # a dimension output named like a working column: refused at load as before for job columns
    refused(write(tmp_path, edit(CHANGE_FEED, "category: cat", "_tie: cat")),
            "dimensions.products.columns._tie", "reserved")


def test_a_missing_fact_table_fails_cleanly_before_anything_is_read(spark, tmp_path: Path, capsys) -> None:
    """Enrichment scheduled before the CDC run that creates its fact table: exit 1 (Airflow
    retries), one line naming the table and the YAML key, no traceback (was a
    FileNotFoundError traceback from inside the stream start); --reprocess resets nothing."""
    _lake(tmp_path)
    import shutil

    shutil.rmtree(tmp_path / "facts")
    f = write(tmp_path, CHANGE_FEED)
    for extra in ([], ["--reprocess"]):
        assert _cli().main(["--pipeline", str(f), "--run-id", "r1", *extra]) == 1
        err = capsys.readouterr().err
        assert f"[enrich] FACT TABLE NOT FOUND: pipeline lines: the fact table {tmp_path / 'facts'} " \
               f"(fact.change_feed in {f}) does not exist" in err, err
        assert "Traceback" not in err and not (tmp_path / "gold" / "lines").exists()


def _cli():  # type: ignore[no-untyped-def]
    """spark_jobs/enrich.py as a module (its main() maps exceptions to exit codes)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("enrich_cli", REPO / "spark_jobs" / "enrich.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_valid_config_passes_preflight_and_cli_exits_2_naming_the_sum(spark, tmp_path: Path, capsys) -> None:
    from cdc_lake.engines import select_engine
    from cdc_lake.enrich.preflight import preflight

    _lake(tmp_path)
    engine = select_engine(spark, "deltalake")
    preflight(spark, load_pipeline(write(tmp_path, CHANGE_FEED, "ok.yaml")), engine)
    # a dimension without a table yet: its outputs' types are unknown, not refused (the next
    # run after the table appears checks them)
    no_table = edit(edit(CHANGE_FEED, "table: products", "table: not_yet"), "units: qty", "units: category")
    preflight(spark, load_pipeline(write(tmp_path, no_table, "not_yet.yaml")), engine)
    # numbers of other widths join by value: an int key for a bigint join column passes
    write_deltalake(str(tmp_path / "products32"), pa.table({
        "id": pa.array([1], pa.int32()), "name": ["apple"], "cat": ["fruit"]}), configuration=CDF)
    narrow = edit(CHANGE_FEED, "table: products", "table: products32")
    preflight(spark, load_pipeline(write(tmp_path, narrow, "narrow.yaml")), engine)
    f = write(tmp_path, edit(CHANGE_FEED, "\"qty * price\"", "\"amount *\""))
    assert _cli().main(["--pipeline", str(f), "--run-id", "r1"]) == 2
    err = capsys.readouterr().err
    assert f"[enrich] CONFIG ERROR: {f}: outputs.aggregates.rev.sums.revenue: 'amount *'" in err, err
    assert "Traceback" not in err


def test_reprocess_summary_reports_the_snapshot_batch_on_its_own(spark, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from cdc_lake.enrich.job import run_enrich

    _lake(tmp_path)
    cfg = load_pipeline(write(tmp_path, CHANGE_FEED))
    s1 = run_enrich(cfg, spark=spark, run_id="r1")
    assert (s1["batches"], s1["batch_ids"], s1["facts_read"], s1["reprocess_snapshot"]) == (1, [0], 1, None)
    (DeltaTable(str(tmp_path / "facts")).merge(pa.table({
        "line_id": [2], "product_id": [1], "qty": [1], "price": [2.0],
        "ts": pa.array([datetime(2026, 1, 2, 11, tzinfo=timezone.utc)], pa.timestamp("us", tz="UTC"))}),
        "t.line_id = s.line_id", "s", "t").when_not_matched_insert_all().execute())
    s2 = run_enrich(cfg, spark=spark, run_id="r2", reprocess=True)
    # the snapshot (2 facts) is not a micro-batch of the stream, which had nothing new: Spark
    # plans an empty batch 0 at the start offset, which changes nothing (no pending re-join)
    assert s2["facts_read"] == 0 and s2["enriched_upserted"] == 0, s2
    assert s2["batches"] == len(s2["batch_ids"]) and s2["batch_ids"] == [], s2
    assert s2["reprocess_snapshot"]["facts_read"] == 2 and s2["reprocess_snapshot"]["enriched_upserted"] == 2
    saved = json.loads((cfg.runs_path / "lines" / "r2.json").read_text())
    assert saved["reprocess_snapshot"]["facts_read"] == 2 and saved["batches"] == s2["batches"]
    human = _cli()._human(s2)
    assert human[0].split(": ", 1)[1].startswith(f"{s2['batches']} batch(es) {s2['batch_ids']}, 0 fact changes")
    assert "--reprocess snapshot (before those batches): 2 facts, 2 enriched" in human[-1]
    # a fact table at version 0: the stream follows from version 1, it does not read version 0
    # again after the snapshot (the start was written as 0: "version or -1" took 0 for none)
    fresh = tmp_path / "v0"
    _lake(fresh)
    s3 = run_enrich(load_pipeline(write(fresh, CHANGE_FEED)), spark=spark, run_id="r3", reprocess=True)
    assert s3["reprocess_snapshot"]["facts_read"] == 1 and s3["facts_read"] == 0, s3


def test_a_dimension_path_with_no_table_is_warned_about_naming_key_and_path(spark, tmp_path: Path,
                                                                          capsys) -> None:
    """A typo in a dimension's path parked every fact with nothing but ``{'products': None}``
    in the summary (tester). A dimension may legitimately not exist yet, so the run goes on;
    stderr names the YAML key and the path."""
    from cdc_lake.enrich.job import run_enrich

    _lake(tmp_path)
    cfg = load_pipeline(write(tmp_path, edit(CHANGE_FEED, "{table: products,", "{table: prodcts,")))
    summary = run_enrich(cfg, spark=spark, run_id="r1")
    err = capsys.readouterr().err
    assert (f"[enrich] WARNING: dimensions.products.table: no Delta table at {tmp_path / 'prodcts'} "
            "(yet)") in err, err
    assert summary["pending_rows"] == 1, summary
