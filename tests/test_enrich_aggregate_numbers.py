"""Aggregate sums at the edges of their types (tester, 2026-11-27).

* A ``bigint`` sum that passes 2^63-1 across batches wrapped round in the MERGE (5e18+1 + 5e18
  stored as -8446744073709551615, exit 0); within one batch it failed with Spark's bare
  ARITHMETIC_OVERFLOW (exit 1, retried for ever). Both now stop before anything is written,
  exit 3 naming aggregate, column and group, and the printed recovery (a decimal sum and
  ``--reprocess``) gives the exact total.
* A NaN or ±Infinity contribution to a ``double`` sum stayed in the group for good (a signed
  delta cannot withdraw NaN); it now counts as 0 (docs/enrichment.md).

Truth: exact Python integers and floats over the upstream rows, written here.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
from test_enrich_safety import _read, cli, products, upsert, write_yaml

FACTS = pa.schema([("line_id", pa.int64()), ("product_id", pa.int64()), ("qty", pa.int64()),
                   ("w", pa.float64())])
YAML = """
    kind: enrich
    pipeline: nums
    fact: {change_feed: lake/facts, keys: [line_id]}
    dimensions:
      products: {table: lake/products, keys: [id], scd: 1, on: {product_id: id},
                 columns: {category: cat}}
    late_members: {wait: 1d}
    outputs:
      enriched: gold/lines
      aggregates:
        units: {group_by: [category], sums: {units: QTY_EXPR, wsum: w}}
    engine: {name: deltalake}
    spark: {conf: {spark.sql.shuffle.partitions: "2"}}
"""
BIG = 5 * 10**18


def facts(root: Path, *rows: tuple) -> None:
    upsert(root / "lake/facts", list(rows), FACTS, "line_id")


def agg(root: Path) -> dict:
    return {r["category"]: (r["units"], r["wsum"], r["count"]) for r in _read(root / "gold/units")}


def truth(root: Path) -> dict:
    cats = {r["id"]: r["cat"] for r in _read(root / "lake/products")}
    out: dict = {}
    for f in _read(root / "lake/facts"):
        units, wsum, n = out.get(cats[f["product_id"]], (0, 0.0, 0))
        w = f["w"] if f["w"] is not None and math.isfinite(f["w"]) else 0.0
        out[cats[f["product_id"]]] = (units + f["qty"], wsum + w, n + 1)
    return out


def test_integer_sums_stop_before_they_wrap_and_nan_is_withdrawn(tmp_path: Path, capsys) -> None:
    yaml = write_yaml(tmp_path, YAML.replace("QTY_EXPR", "qty"))
    products(tmp_path, (10, "a"), (20, "b"))
    facts(tmp_path, (1, 10, BIG, 1.0), (2, 10, 1, float("nan")), (3, 20, 7, float("inf")))
    code, out = cli(capsys, yaml, "--run-id", "r1")
    assert code == 0, out[-3000:]
    assert agg(tmp_path) == truth(tmp_path) == {"a": (BIG + 1, 1.0, 2), "b": (7, 0.0, 1)}

    facts(tmp_path, (2, 10, 1, 2.0), (3, 20, 7, 0.5))  # the NaN and the Infinity leave
    code, out = cli(capsys, yaml, "--run-id", "r2")
    assert code == 0, out[-3000:]
    assert agg(tmp_path) == truth(tmp_path) == {"a": (BIG + 1, 3.0, 2), "b": (7, 0.5, 1)}

    # across batches: 5e18+1 stored, 5e18 more would wrap round in the MERGE
    before = {t: _read(tmp_path / "gold" / t) for t in ("units", "lines")}
    facts(tmp_path, (4, 10, BIG, 0.0))
    code, out = cli(capsys, yaml, "--run-id", "r3")
    last = out.strip().splitlines()[-1]
    assert code == 3 and last.startswith("[enrich] NEEDS RECOVERY"), out[-3000:]
    assert "outputs.aggregates.units.sums.units" in last and '{"category":"a"}' in last, last
    assert f"would reach {2 * BIG + 1}" in last and "nothing of this batch was written" in last
    assert {t: _read(tmp_path / "gold" / t) for t in ("units", "lines")} == before

    # the printed recovery: a decimal sum, --reprocess; exact
    assert 'CAST(qty AS DECIMAL(38,0))' in last and "--reprocess" in last, last
    write_yaml(tmp_path, YAML.replace("QTY_EXPR", '"CAST(qty AS DECIMAL(38,0))"'))
    code, out = cli(capsys, yaml, "--run-id", "r4", "--reprocess")
    assert code == 0, out[-3000:]
    got = agg(tmp_path)
    assert got == truth(tmp_path) and got["a"][0] == Decimal(2 * BIG + 1), got


def test_an_integer_sum_beyond_bigint_within_one_batch_names_the_aggregate(spark, tmp_path: Path) -> None:
    """Within one batch (the deltas of one Spark job; before: Spark's bare ARITHMETIC_OVERFLOW,
    exit 1, retried for ever): the job's error names aggregate and sum, and the enrichment job
    turns it into AggregateOverflow (exit 3, NEEDS RECOVERY)."""
    import pytest
    from pyspark.sql import types as T

    from cdc_lake.config import load_pipeline
    from cdc_lake.enrich.aggregate import AggregateOverflow, aggregate_deltas, overflow_in

    cfg = load_pipeline(write_yaml(tmp_path, YAML.replace("QTY_EXPR", "qty")))
    [units] = cfg.outputs.aggregates
    rows = spark.createDataFrame([("a", BIG, 0.0), ("a", BIG, 0.0), ("b", 7, 1.0)], T.StructType([
        T.StructField("category", T.StringType()), T.StructField("qty", T.LongType()),
        T.StructField("w", T.DoubleType())]))
    with pytest.raises(Exception) as e:
        aggregate_deltas(None, rows, units, None).collect()
    found = overflow_in(cfg, e.value)
    assert isinstance(found, AggregateOverflow), e.value
    assert re.search(r"outputs\.aggregates\.units\.sums\.units \('qty'\) adds up to more than a "
                     r"bigint holds within one batch", str(found)), found
    assert f'(batch total {2 * BIG}) in group {{"category":"a"}}' in str(found), found  # (tester: unnamed)
    assert "check the other sums" in str(found), found
    # a decimal sum beyond its decimal(38,10) within one batch: Spark's bare ARITHMETIC_OVERFLOW
    # (exit 1, retried for ever: second tester) -> the same exit 3 with the decimal advice
    from decimal import Decimal as D

    big = spark.createDataFrame([("a", D("9e27"), 0.0), ("a", D("9e27"), 0.0)], T.StructType([
        T.StructField("category", T.StringType()), T.StructField("qty", T.DecimalType(38, 10)),
        T.StructField("w", T.DoubleType())]))
    with pytest.raises(Exception) as e:
        aggregate_deltas(None, big, units, None).collect()
    dec = overflow_in(cfg, e.value)
    assert isinstance(dec, AggregateOverflow), e.value
    assert 'decimal(38,10) holds within one batch (batch total beyond it) in group {"category":"a"}' \
        in str(dec), dec
    assert "ROUNDED" in str(dec), dec
    # Spark's arithmetic overflowing elsewhere (a sums expression per fact, ``qty * 2``): exit 3
    # naming the sums expressions, not Spark's bare error, exit 1, retried for ever (tester)
    from cdc_lake.checkpoint_log import PipelineStateError
    from cdc_lake.enrich.aggregate import ExpressionOverflow

    with pytest.raises(Exception) as e:
        spark.range(1).selectExpr("9223372036854775807L * 2 AS q").collect()
    expr = overflow_in(cfg, e.value)
    assert isinstance(expr, ExpressionOverflow) and isinstance(expr, PipelineStateError), e.value  # exit 3
    assert "ARITHMETIC_OVERFLOW" in str(expr) and "units.units = 'qty'" in str(expr), expr
    assert "CAST(qty AS DECIMAL(38,0)) * 2" in str(expr) and "--reprocess" in str(expr), expr
    # a decimal sum's recovery says that fewer decimals round each value (the advice
    # DECIMAL(38,0) summed whole numbers, exit 0: tester); an integer sum's stays exact
    dec = str(AggregateOverflow(cfg, "units", "units", "would reach ...", scale=10))
    assert "CAST(qty AS DECIMAL(38,5))" in dec and "ROUNDED" in dec and "DOUBLE" in dec, dec
    assert "(exact for integers)" in str(found) and "ROUNDED" not in str(found), found
    ok = {r["category"]: r["units"] for r in aggregate_deltas(None, rows.where("category = 'b'"),
                                                                units, None).collect()}
    assert ok == {"b": 7}
