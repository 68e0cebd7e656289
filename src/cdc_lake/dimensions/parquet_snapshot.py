"""Parquet snapshots of a dimension refresh: read with the few fixes Spark needs (nanosecond
timestamps, all-NULL columns) and checked for text that is not UTF-8. Used by
:mod:`cdc_lake.dimensions.snapshot`.

Example::

    df = nulls_as_text(read_parquet(spark, Path("snapshots/2026-01-02.parquet")), path)
    check_utf8(df, {"name": "string"}, where=str(path))   # raises SnapshotInvalid
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType

from cdc_lake.dimensions.diff import SnapshotInvalid
from cdc_lake.dimensions.types import quote, refuse_case_twins
from cdc_lake.paths import glob_escape


def check_utf8(df: DataFrame, targets: dict[str, str], where: str) -> None:
    """Refuse Parquet text that is not UTF-8: string columns, and binary columns that would be
    stored as ``string`` (``targets``: lower-case name -> the declared or the table's type).
    Stored, such a value made the Delta table unreadable for every reader (delta-rs: "non UTF-8
    data"), so every later refresh failed with exit 1 (tester K). One Spark job."""
    cols = [x.name for x in df.schema.fields if isinstance(x.dataType, StringType)
            or (isinstance(x.dataType, BinaryType) and targets.get(x.name.lower()) == "string")]
    if not cols:
        return
    bad = [~F.is_valid_utf8(F.col(quote(c)).cast("string")) for c in cols]
    row = df.agg(*[F.count_if(b).alias(f"n{i}") for i, b in enumerate(bad)]).first()
    found = [(c, b, int(row[i])) for i, (c, b) in enumerate(zip(cols, bad)) if row and row[i]]
    if not found:
        return
    c, b, n = found[0]
    examples = [r[0] for r in df.where(b).select(F.hex(F.col(quote(c)).cast("binary"))).limit(3).collect()]
    raise SnapshotInvalid(
        f"{where}: column(s) {[x[0] for x in found]} hold text that is not UTF-8 ({c!r}: {n} "
        f"value(s), e.g. hex {examples}); a Delta string column must hold UTF-8 (stored, such a "
        "value leaves the table unreadable), so nothing was written. Export the text as UTF-8, "
        "or keep raw bytes in a column declared `binary` in `schema:`, and re-run this date")


_NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"


def read_parquet(spark: SparkSession, f: Path) -> DataFrame:
    """The Parquet snapshot; a column of INT64 nanosecond timestamps (pandas' and pyarrow's
    default unit, which Spark refuses with ``PARQUET_TYPE_ILLEGAL``: exit 1, retried for ever;
    tester) is read as its nanoseconds (``spark.sql.legacy.parquet.nanosAsLong``, set only while
    Spark resolves the file's schema) and, when every value is a whole microsecond, converted
    to ``timestamp`` (UTC-adjusted) or ``timestamp_ntz`` (local time), as Spark reads
    microsecond columns; a value with a non-zero nanosecond digit raises
    :class:`SnapshotInvalid` (one Spark job for the check). One nested inside a struct, list or
    map is refused before Spark reads the file."""
    _check_names(f)
    nanos, nested = _nanos_columns(f)
    fix = ("Export timestamps in microseconds (pandas: df.to_parquet(..., coerce_timestamps='us'); "
           "pyarrow: pq.write_table(..., coerce_timestamps='us')) and re-run this date")
    if nested:
        raise SnapshotInvalid(
            f"{f}: column(s) {nested} hold nanosecond timestamps inside a struct, list or map, "
            f"which Spark cannot read, so nothing was written. {fix}")
    if not nanos:
        return spark.read.parquet(glob_escape(str(f)))
    before = spark.conf.get(_NANOS_AS_LONG, None)
    spark.conf.set(_NANOS_AS_LONG, "true")
    try:  # Spark 4.2 needs the setting only to resolve the schema; both readers then read longs
        df = spark.read.parquet(glob_escape(str(f)))
    finally:
        if before is None:
            spark.conf.unset(_NANOS_AS_LONG)
        else:
            spark.conf.set(_NANOS_AS_LONG, before)
    bad = {c: F.col(quote(c)) % 1000 != 0 for c in nanos}
    row = df.agg(*[F.count_if(b).alias(f"n{i}") for i, b in enumerate(bad.values())]).first()
    problems = []
    for i, c in enumerate(bad):
        n = int(row[f"n{i}"] or 0)  # type: ignore[index]
        if n:
            ex = [_nanos_text(r[0], nanos[c]) for r in
                  df.where(bad[c]).select(quote(c)).distinct().limit(5).collect()]
            problems.append(f"column {c!r}: {n} value(s) with a non-zero digit beyond "
                            f"microseconds, e.g. {ex}")
    if problems:
        raise SnapshotInvalid(
            f"{f}: " + "; ".join(problems) + " (a timestamp holds 6 fraction digits; Spark "
            f"would drop the rest), so nothing was written. {fix}")
    return df.select(*[_micros(c, nanos[c]).alias(c) if c in nanos else F.col(quote(c))
                       for c in df.columns])


def nulls_as_text(df: DataFrame, f: Path) -> DataFrame:
    """Top-level columns of Arrow type ``null`` (all values NULL; pandas/pyarrow write them as
    INT32 annotated Null, which Spark reads as ``int``) read as ``string``, as an all-empty CSV
    column is: created ``int`` on a first day, the column refused every later text value
    (tester K). A table column of another type takes them as NULLs (fits by type)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        nulls = {x.name for x in pq.ParquetFile(f).schema_arrow if pa.types.is_null(x.type)}
    except Exception:  # noqa: BLE001 - not Parquet / truncated: Spark's own error, as before
        return df
    if not nulls:
        return df
    return df.select(*[F.lit(None).cast("string").alias(c) if c in nulls else F.col(quote(c))
                       for c in df.columns])


def _check_names(f: Path) -> None:
    """Refuse a file naming one column twice, compared case-insensitively (``Name`` and
    ``name``), before Spark reads it: Spark's read failed with ``COLUMN_ALREADY_EXISTS``, exit 1,
    which Airflow retries in vain (:func:`cdc_lake.dimensions.types.refuse_case_twins`, as for
    the columns Spark reads). A footer pyarrow cannot read is left to Spark's own error."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(f).names
    except Exception:  # noqa: BLE001 - not Parquet / truncated: Spark's own error, as before
        return
    refuse_case_twins(names, str(f))


def _nanos_columns(f: Path) -> tuple[dict[str, bool], list[str]]:
    """The file's top-level INT64 nanosecond timestamp columns (-> adjusted to UTC) and the
    top-level columns holding such timestamps nested; both empty when pyarrow cannot read the
    footer (Spark then reports the file itself). INT96 timestamps (Spark reads them) are not
    counted: they are read with the unit ``us`` here."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.ParquetFile(f, coerce_int96_timestamp_unit="us").schema_arrow
    except Exception:  # noqa: BLE001 - not Parquet / truncated: Spark's own error, as before
        return {}, []

    def holds(t: pa.DataType) -> bool:
        if pa.types.is_timestamp(t):
            return t.unit == "ns"
        return any(holds(t.field(i).type) for i in range(getattr(t, "num_fields", 0)))

    top = {x.name: x.type.tz is not None for x in schema
           if pa.types.is_timestamp(x.type) and x.type.unit == "ns"}
    return top, [x.name for x in schema if x.name not in top and holds(x.type)]


def _micros(c: str, utc: bool):  # type: ignore[no-untyped-def]
    """Nanoseconds since 1970 (a whole number of microseconds) as ``timestamp`` (``utc``) or
    ``timestamp_ntz``, independent of the session time zone."""
    whole = f"({quote(c)} DIV 1000)"
    if utc:
        return F.expr(f"timestamp_micros({whole})")
    return F.expr(f"TIMESTAMP_NTZ'1970-01-01 00:00:00' + "
                  f"make_dt_interval(0, 0, 0, CAST({whole} AS DECIMAL(20, 0)) / 1000000)")


def _nanos_text(v: int, utc: bool) -> str:
    """Nanoseconds since 1970 as ISO text with 9 fraction digits (``...T10:00:00.000000009Z``)."""
    from datetime import datetime, timedelta

    secs, ns = divmod(v, 1_000_000_000)
    t = datetime(1970, 1, 1) + timedelta(seconds=secs)
    return f"{t:%Y-%m-%dT%H:%M:%S}.{ns:09d}" + ("Z" if utc else "")
