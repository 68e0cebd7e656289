"""The normalized change event: the one data contract between format parsers and writers.

Every parser (``cdc_lake.cdc.formats.*``) turns raw landing lines into rows with exactly these
columns; nothing downstream knows which format a row came from.

=============  ===================  ======================================================
column         type                 meaning
=============  ===================  ======================================================
_file          string               landing file the line came from
_line          string               the raw line (kept for quarantine)
_error         string               why the line/row is unusable, else null
_kind          string               ``row`` (data change), ``ddl``, ``skip`` (not data)
db             string               source database
tbl            string               source table
op             string               ``insert`` | ``update`` | ``delete`` | ``snapshot``
seq            string               binlog order; sorts lexically; unique per row change
commit_ts      timestamp            source commit time (UTC)
row            variant              row image: after-image, or before-image for deletes
old            variant              previous values: full before-image or changed columns only
pk_names       array<string>        primary-key columns the format carries (else null)
type_hints     map<string,string>   per-column type metadata the format carries (else null)
ddl_type       string               DDL kind for ``_kind = 'ddl'``/``'skip'``
ddl_sql        string               DDL statement text
=============  ===================  ======================================================
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

COLUMNS = ("_file", "_line", "_error", "_kind", "db", "tbl", "op", "seq", "commit_ts", "row",
           "old", "pk_names", "type_hints", "ddl_type", "ddl_sql")

OPS = ("insert", "update", "delete", "snapshot")


def pad(col: Column, width: int) -> Column:
    """Left-pad a non-negative integer column so lexical order equals numeric order."""
    return F.lpad(col.cast("decimal(38,0)").cast("string"), width, "0")


def binlog_file_number(file_col: Column) -> Column:
    """``mysql-bin.000123`` -> 123 (the numeric suffix orders binlog files)."""
    return F.regexp_extract(file_col, r"(\d+)$", 1).cast("bigint")


def vget(v: Column, path: str, type_: str = "variant") -> Column:
    """Null-tolerant typed read from a variant (``try_variant_get``)."""
    return F.try_variant_get(v, path, type_)


def select_normalized(df):  # type: ignore[no-untyped-def]
    """Project a parser's output onto :data:`COLUMNS` (fails fast if a parser forgot one)."""
    return df.select(*COLUMNS)
