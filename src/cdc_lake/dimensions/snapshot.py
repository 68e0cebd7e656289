"""Reading one date's snapshot file as a DataFrame whose values are the file's, exactly.

* CSV (:func:`read_snapshot` -> ``_read_csv``): RFC 4180 quoting (``""`` inside a quoted field
  is one ``"``; an unquoted empty field is NULL, a quoted one the empty string), read as text,
  then cast by :func:`cdc_lake.dimensions.types.conform` to the declared ``schema:`` types or
  to the types Spark infers (a column the table keeps as string stays text), so no conversion
  rounds or truncates a value silently;
* Parquet (``_read_parquet``): nanosecond timestamps (pandas' default) are read when every value
  is a whole microsecond;
* both: a column spelled like a table column in another case is that column
  (``_spell_as_table``); a column named like one the job maintains is refused
  (``_check_reserved``); a folder instead of a file is :class:`SnapshotInvalid`, no file yet
  :class:`SnapshotMissing` (exit 66, retried).

Example::

    df = read_snapshot(spark, load_pipeline("pipelines/product_categories.yaml"), "2026-01-02",
                       stored=table_schema_or_None)
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from cdc_lake.dimensions.config import SCD1_META, SCD2_META, DimensionPipelineConfig
from cdc_lake.dimensions.csv_check import check_csv_file
from cdc_lake.dimensions.diff import SnapshotInvalid
from cdc_lake.dimensions.types import conform, quote

__all__ = ["SnapshotInvalid", "SnapshotMissing", "read_snapshot"]


class SnapshotMissing(FileNotFoundError):
    """The snapshot file of the requested date is not there."""


def read_snapshot(spark: SparkSession, cfg: DimensionPipelineConfig, date: str,
                  stored: StructType | None = None) -> DataFrame:
    """The snapshot of ``date`` as a DataFrame (explicit ``schema:`` applied when configured).

    Every conversion is a checked cast (:func:`cdc_lake.dimensions.types.conform`): a value its
    type cannot hold exactly raises :class:`SnapshotInvalid` naming file, column and values. A
    CSV (RFC 4180: ``""`` inside a quoted field is one ``"``; :func:`_csv_reader`) is read as
    text, then cast to the declared types, or without ``schema:`` to the types Spark infers,
    except that a column the table (``stored``) keeps as string stays text (``007`` stays
    ``007``). A Parquet column of nanosecond timestamps is read if every value is a whole
    microsecond (:func:`_read_parquet`). A column spelled like a table column in another case
    (``name`` for ``Name``) is renamed to the table's spelling (:func:`_spell_as_table`). A
    column of the file named like one the job maintains (:data:`SCD1_META` /
    :data:`SCD2_META`, any case) raises :class:`SnapshotInvalid`.
    """
    f = _snapshot_path(cfg, date)
    where = str(f)
    fix = (f"Fix the file, or declare the column with a type that holds these values in "
           f"`schema:` of {cfg.file}")
    spellings = [x.name for x in (stored.fields if stored else [])] + list(cfg.keys)
    if cfg.snapshots.format == "csv":
        return _check_reserved(_read_csv(spark, cfg, f, stored, spellings, fix), cfg, where)
    df = _spell_as_table(_read_parquet(spark, f), spellings, where)
    targets = {c.lower(): t for c, t in (cfg.schema or {}).items()} if cfg.schema else {
        x.name.lower(): x.dataType.simpleString() for x in (stored.fields if stored else [])}
    _check_utf8(df, targets, where)
    if cfg.schema:
        have = {c.lower(): c for c in df.columns}
        missing = [c for c in cfg.schema if c.lower() not in have]
        if missing:
            raise SnapshotInvalid(f"{f}: column(s) {missing} of `schema:` are not in the file "
                                  f"(columns: {df.columns})")
        df = df.select(*[df[quote(have[c.lower()])].alias(c) for c in cfg.schema])
        return conform(_spell_as_table(df, spellings, where), _declared(cfg, spellings),
                       where=where, against="the declared (`schema:`)", fix=fix)
    return _check_reserved(df, cfg, where)


def _snapshot_path(cfg: DimensionPipelineConfig, date: str) -> Path:
    """The snapshot file of ``date``; :class:`SnapshotInvalid` for a folder (a Spark-style
    export), :class:`SnapshotMissing` (exit 66, retried) when it is not there yet."""
    f = cfg.snapshot_file(date)
    if f.is_dir():  # a Spark/Hive-style export folder: not "missing" (exit 66 retried for ever)
        raise SnapshotInvalid(
            f"{f}: the snapshot for {date} is a directory (snapshots.pattern "
            f"{cfg.snapshots.pattern!r} of {cfg.file} must name one file per date), so nothing "
            "was written. Export one file (e.g. coalesce(1) and move the part file to this "
            "name), or point the pattern at it")
    if not f.is_file():
        raise SnapshotMissing(
            f"{cfg.file}: snapshot for {date} not found: expected {f} (snapshots.path + "
            f"snapshots.pattern {cfg.snapshots.pattern!r}). Land the file and re-run, or run "
            "another date with --date YYYY-MM-DD")
    return f


def _declared(cfg: DimensionPipelineConfig, spellings: list[str]) -> dict[str, str]:
    """``schema:`` with each column spelled as the table spells it (:func:`_spell_as_table`)."""
    want = {n.lower(): n for n in reversed(spellings)}
    return {want.get(c.lower(), c): t for c, t in (cfg.schema or {}).items()}


# Spark's CSV reader gives NULL for a field equal to ``nullValue`` and for an unquoted empty
# field; a quoted empty field ("") is ``emptyValue`` (''). With the default nullValue '' both
# were NULL: a text nobody writes as a whole field keeps '' apart from NULL.
_NO_NULL_TEXT = "\u0000cdc-lake:no-null-text\u0000"


def _csv_reader(spark: SparkSession, cfg: DimensionPipelineConfig, f: Path):  # type: ignore[no-untyped-def]
    """Spark's CSV reader as RFC 4180 (Python's csv module, Excel, pandas) reads: two quotes
    inside a quoted field are one quote (with Spark's default escape, a backslash, a quoted
    field holding say ""hi"" was stored as written, enclosing and doubled quotes kept, exit 0;
    tester); an unquoted empty field is NULL, a quoted empty one the empty string; multiLine:
    a quoted value may hold a line break (valid CSV; it failed with
    malformedCSVRecordError, exit 1; tester); the file's own line separator: with Spark's
    detection a CRLF inside a quoted value of a CRLF file was stored as LF (tester)."""
    s = cfg.snapshots
    reader = (spark.read.option("header", str(s.header).lower()).option("sep", s.delimiter)
              .option("quote", '"').option("escape", '"').option("nullValue", _NO_NULL_TEXT)
              .option("emptyValue", "").option("mode", "FAILFAST").option("multiLine", "true"))
    sep = _line_separator(f)
    return reader if sep is None else reader.option("lineSep", sep)


def _line_separator(f: Path) -> str | None:
    """CRLF when the file's first line ends with one, LF when with a bare LF; None (Spark's own
    detection) for a file without any LF in its first 64 KiB."""
    import gzip

    opener = gzip.open if f.name.endswith(".gz") else open
    with opener(f, "rb") as fh:
        head = fh.read(1 << 16)
    i = head.find(b"\n")
    if i < 0:
        return None
    return "\r\n" if i > 0 and head[i - 1:i] == b"\r" else "\n"


def malformed_csv(cfg: DimensionPipelineConfig, f: Path, error: BaseException) -> SnapshotInvalid | None:
    """Spark's FAILFAST error for a CSV record it cannot parse (``MALFORMED_CSV_RECORD``, raised
    by whichever Spark job reads the file first) as an invalid snapshot naming the file, the
    record and the usual causes; None for any other error. It was exit 1 (retried) with a Java
    stack tail; a file that mixes CRLF and bare-LF line ends is one cause (tester J): the record
    separator is the first line's, so a line with the other ending runs into the next."""
    text = str(error)
    if cfg.snapshots.format != "csv" or ("MALFORMED_CSV_RECORD" not in text
                                         and "Malformed CSV record" not in text):
        return None
    record = ""
    if "Malformed CSV record:" in text:
        record = text.split("Malformed CSV record:", 1)[1].strip()
        record = record.split("\n\tat ", 1)[0].split(" SQLSTATE", 1)[0][:200]
    try:
        sep = _line_separator(f)
    except OSError:
        sep = None
    ending = {"\r\n": "CRLF", "\n": "LF"}.get(sep or "", "")
    return SnapshotInvalid(
        f"{f}: a CSV record cannot be parsed" + (f": {record!r}" if record else "")
        + " (Spark: MALFORMED_CSV_RECORD); nothing was written. Causes: a row with more fields "
        "than the header, an unbalanced quote, or line ends that change within the file "
        + (f"(its first line ends with {ending}: every record must end the same way; a line "
           f"ending otherwise runs into the next) " if ending else "")
        + "- fix the export and run this date again")


def _read_csv(spark: SparkSession, cfg: DimensionPipelineConfig, f: Path, stored: StructType | None,
              spellings: list[str], fix: str) -> DataFrame:
    """The CSV snapshot read as text and cast by :func:`conform` to the declared types, or
    without ``schema:`` to the types Spark infers (one inference job), except the columns the
    table keeps as string: every conversion is checked the same way, so an inferred one cannot
    round or truncate a value either (``10:00:00.1234567`` was stored as ``10:00:00.123456``,
    exit 0; tester)."""
    where = str(f)
    check_csv_file(f, delimiter=cfg.snapshots.delimiter)  # UTF-8, RFC 4180, one shape (exit 3)
    if cfg.snapshots.header:
        _check_header(f, cfg.snapshots.delimiter)
    if cfg.schema:
        text = _spell_as_table(_declared_text(spark, cfg, f), spellings, where)
        targets = _declared(cfg, spellings)
        return conform(_blank_is_null(text, targets), targets, where=where,
                       against="the declared (`schema:`)", fix=fix)
    inferred = _csv_reader(spark, cfg, f).option("inferSchema", "true").csv(str(f)).schema
    text = _csv_reader(spark, cfg, f).schema(_as_text(inferred.names)).csv(str(f))
    text = _spell_as_table(text, spellings, where)
    keep = {x.name.lower() for x in (stored.fields if stored else []) if x.dataType == StringType()}
    targets = {c: "string" if c.lower() in keep else x.dataType.simpleString()
               for c, x in zip(text.columns, inferred.fields)}
    return conform(_blank_is_null(text, targets), targets, where=where, against="the inferred",
                   fix=_inferred_fix(cfg))


def _declared_text(spark: SparkSession, cfg: DimensionPipelineConfig, f: Path) -> DataFrame:
    """The ``schema:`` columns of the CSV as text: by header name (any order and case, other
    columns ignored), or without a header by position."""
    assert cfg.schema
    if not cfg.snapshots.header:
        return _csv_reader(spark, cfg, f).schema(_as_text(list(cfg.schema))).csv(str(f))
    # by name: a schema given to Spark's CSV reader is applied by position and the header
    # ignored (an export with two columns swapped was stored swapped, exit 0)
    text = _csv_reader(spark, cfg, f).csv(str(f))  # every column a string, named by the header
    have = {c.lower(): c for c in text.columns}
    missing = [c for c in cfg.schema if c.lower() not in have]
    if missing:
        raise SnapshotInvalid(f"{f}: column(s) {missing} of `schema:` are not in the file's "
                              f"header (columns: {text.columns}), so nothing was written. Fix "
                              f"the export, or `schema:` in {cfg.file}")
    return text.select(*[text[quote(have[c.lower()])].alias(c) for c in cfg.schema])


def _as_text(names: list[str]) -> StructType:
    """A CSV schema reading every column (by position) as text."""
    return StructType([StructField(n, StringType()) for n in names])


def _blank_is_null(text: DataFrame, targets: dict[str, str]) -> DataFrame:
    """A quoted empty field (``""``, read as '') of a column cast to anything but string is
    NULL, as an unquoted one is: there is no empty number, date or boolean."""
    blank = {c for c, t in targets.items() if t != "string"}
    return text.select(*[F.when(F.col(quote(c)) != "", F.col(quote(c))).alias(c) if c in blank
                         else F.col(quote(c)) for c in text.columns])


def _inferred_fix(cfg: DimensionPipelineConfig) -> str:
    return (f"If the export is wrong, fix the file and re-run this date. If the values are "
            f"right, declare the columns in `schema:` of {cfg.file} (every column the table "
            "keeps; types are then no longer inferred) with a type that holds them: string keeps "
            "the text as it is. A type the table's column cannot be widened to losslessly needs "
            f"a rebuild: delete {cfg.table} and {cfg.checkpoint_path}, then backfill from the "
            "first date")


def _spell_as_table(df: DataFrame, spellings: list[str], where: str) -> DataFrame:
    """Rename a snapshot column spelled like a table column (or key) in another case to that
    spelling (``name`` on a day the table has ``Name``): Spark and Delta resolve names
    case-insensitively, so it is the same column (it was refused as missing; tester). Two
    snapshot columns that differ only in case raise :class:`SnapshotInvalid`."""
    want = {n.lower(): n for n in reversed(spellings)}  # the table's spelling before a key's
    seen: dict[str, str] = {}
    for c in df.columns:
        if c.lower() in seen:
            raise SnapshotInvalid(
                f"{where}: the snapshot names the column {seen[c.lower()]!r} twice (as {c!r} "
                "too; names compared case-insensitively, as Spark and Delta resolve them), so "
                "nothing was written. Rename or drop one of them in the export and re-run this date")
        seen[c.lower()] = c
    renames = {c: want[c.lower()] for c in df.columns if want.get(c.lower(), c) != c}
    if not renames:
        return df
    print(f"[dimension] {where}: " + ", ".join(f"column {c!r} is the table's {t!r}"
                                              for c, t in renames.items())
          + " (names compare case-insensitively); stored under the table's spelling", flush=True)
    return df.select(*[F.col(quote(c)).alias(renames.get(c, c)) for c in df.columns])


def _check_utf8(df: DataFrame, targets: dict[str, str], where: str) -> None:
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


def _read_parquet(spark: SparkSession, f: Path) -> DataFrame:
    """The Parquet snapshot; a column of INT64 nanosecond timestamps (pandas' and pyarrow's
    default unit, which Spark refuses with ``PARQUET_TYPE_ILLEGAL``: exit 1, retried for ever;
    tester) is read as its nanoseconds (``spark.sql.legacy.parquet.nanosAsLong``, set only while
    Spark resolves the file's schema) and, when every value is a whole microsecond, converted
    to ``timestamp`` (UTC-adjusted) or ``timestamp_ntz`` (local time), as Spark reads
    microsecond columns; a value with a non-zero nanosecond digit raises
    :class:`SnapshotInvalid` (one Spark job for the check). One nested inside a struct, list or
    map is refused before Spark reads the file."""
    nanos, nested = _nanos_columns(f)
    fix = ("Export timestamps in microseconds (pandas: df.to_parquet(..., coerce_timestamps='us'); "
           "pyarrow: pq.write_table(..., coerce_timestamps='us')) and re-run this date")
    if nested:
        raise SnapshotInvalid(
            f"{f}: column(s) {nested} hold nanosecond timestamps inside a struct, list or map, "
            f"which Spark cannot read, so nothing was written. {fix}")
    if not nanos:
        return spark.read.parquet(str(f))
    before = spark.conf.get(_NANOS_AS_LONG, None)
    spark.conf.set(_NANOS_AS_LONG, "true")
    try:  # Spark 4.2 needs the setting only to resolve the schema; both readers then read longs
        df = spark.read.parquet(str(f))
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


def _check_header(f: Path, delimiter: str) -> None:
    """Refuse a CSV header naming one column twice (compared case-insensitively, as Spark
    resolves names): Spark's reader renames such columns by position (``Cat`` and ``cat`` become
    ``Cat1`` and ``cat2``), which would be stored as new columns. Python's csv module reads the
    header by the same RFC 4180 rules as :func:`_csv_reader` (a doubled quote is one quote)."""
    import csv

    import gzip

    opener = gzip.open if f.name.endswith(".gz") else open  # Spark reads .csv.gz too
    with opener(f, "rt", encoding="utf-8-sig", newline="") as fh:
        header = next(csv.reader(fh, delimiter=delimiter), [])
    seen: dict[str, str] = {}
    for name in header:
        if name and name.lower() in seen:
            raise SnapshotInvalid(
                f"{f}: the header names the column {seen[name.lower()]!r} twice (as {name!r} too; "
                "names compared case-insensitively, as Spark and Delta resolve them), so nothing "
                "was written. Rename or drop one of them in the export and re-run this date")
        seen.setdefault(name.lower(), name)


def _check_reserved(df: DataFrame, cfg: DimensionPipelineConfig, where: str) -> DataFrame:
    """Refuse a file column named like one the job maintains (compared case-insensitively, as
    Spark and Delta resolve names): it would clash with the job's own column in the table."""
    maps = [x.name for x in df.schema.fields if "map<" in x.dataType.simpleString()]
    if maps:  # the MERGE compares columns with <=>, which maps do not support
        raise SnapshotInvalid(
            f"{where}: column(s) {maps} hold maps, which the refresh cannot compare between "
            "snapshots (the next date would fail in the MERGE), so nothing was written. Export "
            "them as JSON text or as arrays of key/value structs, or drop them")
    meta = SCD1_META if cfg.scd == 1 else SCD2_META
    clash = [c for c in df.columns if c.lower() in meta]
    if clash:
        raise SnapshotInvalid(
            f"{where}: column(s) {clash} of the snapshot are named like the column(s) {list(meta)} "
            f"the refresh job maintains itself (scd: {cfg.scd}; names compared case-insensitively), "
            "so nothing was written. Rename or drop them in the export and re-run this date")
    return df
