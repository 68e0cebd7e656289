"""A column whose first values disagree in kind (docs/contracts.md, "Column types"): the one
corner where the batch split decides the type. Nothing is stored changed either way, and
config ``types`` pins the column so the split no longer matters."""

from __future__ import annotations

from deltalake import DeltaTable
from job_helpers import event, land, pipeline

from cdc_lake.cdc.job import run_pipeline


def _run(spark, tmp_path, split: bool):  # type: ignore[no-untyped-def]
    cfg = pipeline(tmp_path)
    landing = tmp_path / "landing"
    first, second = event(1, code=1), event(2, code="abc")
    if split:
        land(landing, "a.json", first)
        run_pipeline(cfg, spark=spark, run_id="r1")
        land(landing, "b.json", second)
        run_pipeline(cfg, spark=spark, run_id="r2")
    else:
        land(landing, "a.json", first, second)
        run_pipeline(cfg, spark=spark, run_id="r1")
    t = DeltaTable(str(cfg.table_path("orders")))
    ctype = {f.name: str(f.type) for f in t.schema().fields}["code"]
    stored = {r["id"]: r["code"] for r in t.to_pyarrow_table().to_pylist()}
    q = DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().to_pylist() \
        if (cfg.quarantine_path / "_delta_log").exists() else []
    return ctype, stored, [r["reason"] for r in q]


def test_one_batch_mixing_kinds_makes_text_and_stores_both(spark, tmp_path):
    ctype, stored, reasons = _run(spark, tmp_path, split=False)
    assert "string" in ctype.lower(), ctype
    assert stored == {1: "1", 2: "abc"} and reasons == []


def test_split_batches_type_by_the_first_and_quarantine_the_misfit(spark, tmp_path):
    ctype, stored, reasons = _run(spark, tmp_path, split=True)
    assert "long" in ctype.lower(), ctype
    assert stored == {1: 1} and len(reasons) == 1 and "abc" in reasons[0], (stored, reasons)


def test_config_types_pin_the_column_whatever_the_split(spark, tmp_path, monkeypatch):
    import job_helpers

    pinned = job_helpers.YAML.replace("  orders: {{keys: [id]}}\n",
                                      "  orders: {{keys: [id], types: {{code: string}}}}\n")
    assert pinned != job_helpers.YAML
    monkeypatch.setattr(job_helpers, "YAML", pinned)
    for split in (False, True):
        d = tmp_path / f"split_{split}"
        d.mkdir()
        ctype, stored, reasons = _run(spark, d, split)
        assert "string" in ctype.lower() and stored == {1: "1", 2: "abc"} and reasons == [], \
            (split, ctype, stored, reasons)


def test_a_number_beyond_the_double_range_is_quarantined_not_stored_as_infinity(spark, tmp_path):
    """Tester: ``"a": 1e400`` (JSON allows it; it parses as Infinity) was stored as ``inf`` in a
    double column, exit 0. Now quarantined naming the value; finite doubles are stored."""
    cfg = pipeline(tmp_path)
    lines = [event(1, a="BIG"), event(2, a=2.5e300), event(3, a=-1.5e300)]
    lines[0] = lines[0].replace('"BIG"', "1e400")
    land(tmp_path / "landing", "a.json", *lines)
    run_pipeline(cfg, spark=spark, run_id="r1")
    t = DeltaTable(str(cfg.table_path("orders")))
    assert "double" in str({f.name: f.type for f in t.schema().fields}["a"]).lower()
    stored = {r["id"]: r["a"] for r in t.to_pyarrow_table().to_pylist()}
    assert stored == {2: 2.5e300, 3: -1.5e300}, stored
    q = DeltaTable(str(cfg.quarantine_path)).to_pyarrow_table().to_pylist()
    assert len(q) == 1 and "1e400" in q[0]["raw_line"] and "Infinity" in q[0]["reason"], q
    assert "does not fit column type double exactly" in q[0]["reason"], q
