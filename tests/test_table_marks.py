"""``cdc_lake.table_marks``: a table changed behind its pipeline since the last run (no Spark).

Real delta-rs tables; the marks are what a job records after a run (version + commit
fingerprint). Each case is a thing an operator, another job or maintenance does to a table.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from cdc_lake.sources.delta_log import SAME_ROWS
from cdc_lake.table_marks import changed_behind, commit_fingerprint, missing_data_files

APP = "cdc-shop-0a1b2c"


def _why(table: Path, version: int, fp: str | None) -> str | None:
    """Both ways of the check (log listed; commits opened by name up to the current version)
    must agree."""
    listed = changed_behind(table, version, fp, app_prefix="cdc-shop-")
    by_name = changed_behind(table, version, fp, app_prefix="cdc-shop-",
                             current=DeltaTable(str(table)).version())
    assert listed == by_name, (listed, by_name)
    return listed


def _own_write(table: Path, ids: list[int], batch: int) -> None:
    write_deltalake(str(table), pa.table({"id": ids}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(APP, batch)]))


def _marked(tmp_path: Path) -> tuple[Path, int, str]:
    table = tmp_path / "orders"
    for b in range(3):
        _own_write(table, [b * 10, b * 10 + 1], b)
    v = DeltaTable(str(table)).version()
    fp = commit_fingerprint(table, v)
    assert fp is not None
    return table, v, fp


def test_own_writes_and_maintenance_pass(tmp_path):
    table, v, fp = _marked(tmp_path)
    assert _why(table, v, fp) is None
    _own_write(table, [99], 3)  # a write of a run that stopped before recording
    dt = DeltaTable(str(table))
    dt.optimize.compact()  # dataChange false
    dt = DeltaTable(str(table))
    dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    dt.create_checkpoint()
    write_deltalake(str(table), DeltaTable(str(table)).to_pyarrow_table(), mode="overwrite",
                    commit_properties=CommitProperties(custom_metadata={SAME_ROWS: "true"}))
    assert _why(table, v, fp) is None
    assert _why(table, v, None) is None  # an old record


def test_a_lost_commit_whose_version_a_later_commit_took_is_seen(tmp_path):
    """The tester's case: the newest commit removed, then maintenance's OPTIMIZE took its
    version number; by version alone the table looked intact."""
    table, v, fp = _marked(tmp_path)
    (table / "_delta_log" / f"{v:020d}.json").unlink()
    DeltaTable(str(table)).optimize.compact()
    assert DeltaTable(str(table)).version() == v
    why = _why(table, v, fp)
    assert why and f"version {v}" in why and "not the one" in why, why


def test_a_lost_commit_is_seen(tmp_path):
    table, v, fp = _marked(tmp_path)
    (table / "_delta_log" / f"{v:020d}.json").unlink()
    why = _why(table, v, fp)
    assert why and "is gone" in why, why


def test_foreign_row_changes_are_seen(tmp_path):
    for change in ("delete", "restore", "append", "overwrite", "other_pipeline"):
        table, v, fp = _marked(tmp_path / change)
        dt = DeltaTable(str(table))
        if change == "delete":
            dt.delete("id < 5")
        elif change == "restore":
            dt.restore(0)
        elif change == "append":
            write_deltalake(str(table), pa.table({"id": [7]}), mode="append")
        elif change == "overwrite":
            write_deltalake(str(table), pa.table({"id": [7]}), mode="overwrite")
        else:  # a pipeline whose name starts like this one's
            write_deltalake(str(table), pa.table({"id": [7]}), mode="append",
                            commit_properties=CommitProperties(
                                app_transactions=[Transaction("cdc-shop_eu-9f", 0)]))
        why = _why(table, v, fp)
        assert why and "changed rows" in why and f"version {v + 1}" in why, (change, why)
        if change == "other_pipeline":  # the writer named (tester: two YAMLs, one storage.root)
            assert "'cdc-shop_eu-9f'" in why and "same table path" in why, why


def test_commits_removed_by_log_retention_are_not_taken_for_lost_ones(tmp_path):
    table, v, fp = _marked(tmp_path)
    dt = DeltaTable(str(table))
    dt.optimize.compact()
    DeltaTable(str(table)).create_checkpoint()
    for f in (table / "_delta_log").glob("*.json"):
        if int(f.name[:20]) <= v:
            f.unlink()  # what cleanup_metadata does to expired commits below a checkpoint
    assert _why(table, v, fp) is None


def test_missing_data_files_are_found_in_delta_rs_errors_also_under_encoded_paths(tmp_path):
    """delta-rs percent-encodes a path with a space in its error; the file is found decoded.
    (Spark's wording is met in tests/test_enrich_safety.py and test_state_outside_changes.py.)"""
    for folder in ("plain", "with space ü"):
        table = tmp_path / folder / "t"
        write_deltalake(str(table), pa.table({"id": [1, 2]}))
        [f] = table.glob("*.parquet")
        f.unlink()
        try:
            DeltaTable(str(table)).to_pyarrow_table()
        except Exception as e:  # noqa: BLE001 - delta-rs's own error for the missing object
            text = f"Traceback ...\n{type(e).__name__}: {e}"
        else:
            raise AssertionError("delta-rs read a table whose data file is gone")
        assert missing_data_files(text) == [f], text
    assert missing_data_files("[PATH_NOT_FOUND] Path does not exist: file:/l/t/p-0.parquet. "
                              "SQLSTATE: 42K03") == [Path("/l/t/p-0.parquet")]
    assert missing_data_files("no file named here") == []


def test_rebuild_hint_names_the_writer_of_an_upstream_table(tmp_path):
    """A missing upstream data file's recovery names how that table is rebuilt, from the owner
    marks in its log (tester: it said ``--tables <name>`` for every table)."""
    import re
    import subprocess

    from cdc_lake.table_writers import rebuild_hint, table_app_ids

    orders = tmp_path / "lake dir" / "orders"
    _own_write(orders, [1, 2], 0)
    assert table_app_ids(orders) == {APP}
    hint = rebuild_hint(orders)
    assert "the CDC pipeline 'shop'" in hint, hint
    assert "--pipeline <shop's YAML> --full-refresh --tables orders`" in hint, hint
    [mv] = re.findall(r"`(mv .+?) && spark-submit", hint)
    r = subprocess.run(["bash", "-c", mv], capture_output=True, text=True)  # pasted as printed
    assert r.returncode == 0 and not orders.exists(), (mv, r.stderr)
    assert len(list(orders.parent.glob("orders.damaged-*"))) == 1, r.stderr

    dims = tmp_path / "dims"
    write_deltalake(str(dims), pa.table({"id": [1]}), commit_properties=CommitProperties(
        app_transactions=[Transaction(app_id="dimension-categories", version=20261127)]))
    assert "dimension pipeline 'categories'" in rebuild_hint(dims)
    plain = tmp_path / "plain"
    write_deltalake(str(plain), pa.table({"id": [1]}))
    assert rebuild_hint(plain) == "rebuild that table with its writer"

