"""Parser regressions found by the chaos harness (tests/chaos), pinned at the parser level."""

from __future__ import annotations

import json

from cdc_lake.cdc.formats import parser_for


def test_debezium_schema_change_record_with_schema_wrapper_is_ddl_not_a_crash(spark):
    """A schema-change record's schema has no 'after' field; the type-hint lookup used to index
    an empty array (Spark INVALID_ARRAY_INDEX) and fail the whole run."""
    rec = {"schema": {"type": "struct", "fields": [
               {"field": "source", "type": "struct", "fields": []},
               {"field": "databaseName", "type": "string"}, {"field": "ddl", "type": "string"}]},
           "payload": {"source": {"file": "mysql-bin.000001", "pos": 100, "ts_ms": 1000},
                       "databaseName": "shop", "ddl": "ALTER TABLE orders ADD COLUMN x INT",
                       "tableChanges": []}}
    df = spark.createDataFrame([("f.json", json.dumps(rec))], "_file string, _line string")
    [row] = parser_for("debezium")(df).collect()
    assert row["_kind"] == "ddl" and row["_error"] is None
    assert row["ddl_sql"] == "ALTER TABLE orders ADD COLUMN x INT" and row["db"] == "shop"
