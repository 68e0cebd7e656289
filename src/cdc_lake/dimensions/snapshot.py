"""Reading one date's snapshot file as a DataFrame whose values are the file's, exactly.

* CSV (:func:`read_snapshot` -> ``_read_csv``): RFC 4180 quoting (``""`` inside a quoted field
  is one ``"``; an unquoted empty field is NULL, a quoted one the empty string), read as text,
  then cast by :func:`cdc_lake.dimensions.types.conform` to the declared ``schema:`` types or
  to the types Spark infers (a column the table keeps as string stays text), so no conversion
  rounds or truncates a value silently;
* Parquet (``parquet_snapshot.read_parquet``): nanosecond timestamps (pandas' default) are read when every value
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
from pyspark.sql.types import StringType, StructField, StructType

from cdc_lake.dimensions.config import SCD1_META, SCD2_META, DimensionPipelineConfig
from cdc_lake.dimensions.csv_check import check_csv_file
from cdc_lake.dimensions.parquet_snapshot import check_utf8, nulls_as_text, read_parquet
from cdc_lake.dimensions.diff import SnapshotInvalid
from cdc_lake.dimensions.types import conform, quote, refuse_case_twins
from cdc_lake.paths import glob_escape

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
    microsecond (:func:`cdc_lake.dimensions.parquet_snapshot.read_parquet`). A column spelled like a table column in another case
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
    df = _spell_as_table(nulls_as_text(read_parquet(spark, f), f), spellings, where)
    targets = {c.lower(): t for c, t in (cfg.schema or {}).items()} if cfg.schema else {
        x.name.lower(): x.dataType.simpleString() for x in (stored.fields if stored else [])}
    check_utf8(df, targets, where)
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
    inferred = _csv_reader(spark, cfg, f).option("inferSchema", "true").csv(glob_escape(str(f))).schema
    text = _csv_reader(spark, cfg, f).schema(_as_text(inferred.names)).csv(glob_escape(str(f)))
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
        return _csv_reader(spark, cfg, f).schema(_as_text(list(cfg.schema))).csv(glob_escape(str(f)))
    # by name: a schema given to Spark's CSV reader is applied by position and the header
    # ignored (an export with two columns swapped was stored swapped, exit 0)
    text = _csv_reader(spark, cfg, f).csv(glob_escape(str(f)))  # every column a string, named by the header
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
    refuse_case_twins(df.columns, where)
    renames = {c: want[c.lower()] for c in df.columns if want.get(c.lower(), c) != c}
    if not renames:
        return df
    print(f"[dimension] {where}: " + ", ".join(f"column {c!r} is the table's {t!r}"
                                              for c, t in renames.items())
          + " (names compare case-insensitively); stored under the table's spelling", flush=True)
    return df.select(*[F.col(quote(c)).alias(renames.get(c, c)) for c in df.columns])


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
