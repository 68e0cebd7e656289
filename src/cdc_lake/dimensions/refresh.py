"""One dimension refresh run: apply the snapshot of one date to the dimension Delta table.

Steps, all under the pipeline lock (``<state>/cdc.lock`` or the ``lock:`` backend):

1. the last applied date = the table's Delta transaction version of app id
   ``dimension-<pipeline>`` (the date as ``yyyymmdd``, committed with the data) or, if later,
   ``<state>/last_applied.json`` (covers a date whose snapshot changed nothing);
2. a date **older** than that changes nothing (status ``skipped_older_date``, exit 0): a
   backfill of old dates never rolls the dimension back; the **same** date again changes
   nothing (status ``already_applied``): a refresh is idempotent per date;
3. the snapshot file ``snapshots.path/pattern`` must exist (:class:`SnapshotMissing`, naming
   the expected path) and be a full snapshot (:class:`SnapshotInvalid`: NULL/duplicate keys, a
   table column missing, a column named like one the job maintains (``_snapshot_date``; SCD2
   ``_valid_from``/``_valid_to``/``_is_current``; any case), a value its column's type cannot
   hold exactly —
   :mod:`cdc_lake.dimensions.types`); all of this is checked before anything is written;
4. a table column whose type cannot hold the snapshot's values but has a lossless widening that
   can (``int -> double`` for ``1`` then ``1.5``) is widened first (one same-rows commit);
5. the diff against the table's current rows (:mod:`cdc_lake.dimensions.diff`) is written by
   **one** MERGE with ``Txn("dimension-<pipeline>", yyyymmdd)``; a re-run after a crash after
   that commit sees the date as applied.

Example::

    summary = run_refresh(load_pipeline("pipelines/product_categories.yaml"), date="2026-01-02")
    summary["status"], summary["inserted"], summary["delta_version"]
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from cdc_lake.dimensions.config import SCD1_META, SCD2_META, DimensionPipelineConfig, parse_date
from cdc_lake.dimensions.diff import SnapshotInvalid, check_snapshot, scd1_changes, scd2_changes
from cdc_lake.dimensions.types import conform, plan_types, quote
from cdc_lake.engines import Engine, Txn, select_engine
from cdc_lake.checkpoint import claim_checkpoint
from cdc_lake.locks import pipeline_lock
from cdc_lake.runids import safe_run_id
from cdc_lake.summary import record_failure, record_summary

__all__ = ["SnapshotInvalid", "SnapshotMissing", "last_applied", "run_refresh", "read_snapshot"]
STATE_FILE = "last_applied.json"


class SnapshotMissing(FileNotFoundError):
    """The snapshot file of the requested date is not there."""


def date_version(date: str) -> int:
    """``'2026-01-02'`` -> ``20260102`` (the Delta transaction version of that date's refresh)."""
    return int(date.replace("-", ""))


def version_date(v: int | None) -> str | None:
    if v is None:
        return None
    s = f"{v:08d}"
    return f"{s[:4]}-{s[4:6]}-{s[6:]}"


def read_state(state: Path) -> dict[str, Any]:
    """The state file (``{}`` when there is none). One that exists but cannot be read stops the
    run (:class:`~cdc_lake.checkpoint.StateFileDamaged`, exit 3): read as "nothing applied", it
    let an older date roll the dimension back (tester)."""
    from cdc_lake.checkpoint import read_state_file
    from cdc_lake.paths import mv_aside

    f = state / STATE_FILE
    data = read_state_file(
        f, "the last date applied to the dimension table (a date that changed nothing is recorded "
           "only here), by which an older date never rolls the table back",
        f"restore it from a copy; or move it aside (`{mv_aside(f)}`) and re-run the newest "
        "date already applied: that run records it again", lambda d: True)
    return data or {}


def damaged_table(cfg: DimensionPipelineConfig, error_text: str) -> str | None:
    """After a failed run: why the dimension table cannot be read (a data file gone, a Delta
    log delta-rs cannot load) with the recovery, else None: exit 3 instead of exit 1 and a
    traceback retried for nothing (tester)."""
    from cdc_lake.paths import mv_aside
    from cdc_lake.table_marks import missing_data_files

    rebuild = (f"restore it from a copy if you have one; else rebuild it: move the table and the "
               f"state aside (`{mv_aside(cfg.table)}` and `{mv_aside(cfg.checkpoint_path / STATE_FILE)}`), "
               "then apply the snapshots again from the first date (SCD1: the newest date alone "
               "rebuilds it)")
    gone = [f for f in missing_data_files(error_text) if Path(cfg.table) in f.parents]
    if gone:
        return (f"pipeline {cfg.name}: the data file {gone[0]} of the dimension table {cfg.table} is "
                f"gone; its Delta log still references it. Recovery: put the file back, or {rebuild}")
    if not (Path(cfg.table) / "_delta_log").is_dir():
        return None
    from deltalake import DeltaTable

    try:
        DeltaTable(str(cfg.table))
    except OSError:
        return None
    except Exception as e:  # noqa: BLE001 - DeltaError and kin: the log is damaged
        first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        return (f"pipeline {cfg.name}: the Delta log of the dimension table {cfg.table} cannot be "
                f"read ({type(e).__name__}: {first}). Recovery: {rebuild}")
    return None


def check_table(engine: Engine, cfg: DimensionPipelineConfig, state: dict[str, Any]) -> None:
    """:class:`~cdc_lake.checkpoint_log.PipelineStateError` when the table is below the Delta
    version the last refresh left it at, or gone (tester: its newest commit removed, the date
    counted as applied: an empty dimension table, exit 0)."""
    from cdc_lake.checkpoint_log import PipelineStateError
    from cdc_lake.paths import mv_aside

    left = state.get("delta_version")
    if not isinstance(left, int) or isinstance(left, bool):
        return
    now = engine.version(str(cfg.table)) if engine.exists(str(cfg.table)) else None
    if now is not None and now >= left:
        return
    where = "is gone" if now is None else f"is at version {now}"
    raise PipelineStateError(
        f"pipeline {cfg.name}: the dimension table {cfg.table} {where}, but the refresh of "
        f"{state.get('date')} left it at version {left} ({cfg.checkpoint_path / STATE_FILE}): "
        "commits were lost. Recovery: put the removed _delta_log commits back from a copy; else "
        f"rebuild it: move the table and the state aside (`{mv_aside(cfg.table)}` and "
        f"`{mv_aside(cfg.checkpoint_path / STATE_FILE)}`), then apply the snapshots again from the "
        "first date (SCD1: the newest date alone rebuilds it; docs/dimensions.md, backfill)")


def _write_state(state: Path, data: dict[str, Any]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    f = state / STATE_FILE
    tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, f)


def last_applied(engine: Engine, cfg: DimensionPipelineConfig) -> int | None:
    """Last applied date as ``yyyymmdd`` (Delta txn version or the state file, the later)."""
    txn = engine.txn_version(str(cfg.table), cfg.app_id) if engine.exists(str(cfg.table)) else None
    state = read_state(cfg.checkpoint_path).get("version")
    found = [v for v in (txn, state) if isinstance(v, int)]
    return max(found) if found else None


def _fix(cfg: DimensionPipelineConfig) -> str:
    return (f"If the export is wrong, fix the file and re-run this date. If the values are right, "
            f"give the column a type that holds them in `schema:` of {cfg.file} (e.g. string, "
            f"double or decimal(p,s)); a type the table's column cannot be widened to losslessly "
            f"needs a rebuild: delete {cfg.table} and {cfg.checkpoint_path}, then backfill from "
            "the first date")


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


def _csv_reader(spark: SparkSession, cfg: DimensionPipelineConfig):  # type: ignore[no-untyped-def]
    """Spark's CSV reader as RFC 4180 (Python's csv module, Excel, pandas) reads: two quotes
    inside a quoted field are one quote (with Spark's default escape, a backslash, a quoted
    field holding say ""hi"" was stored as written, enclosing and doubled quotes kept, exit 0;
    tester); an unquoted empty field is NULL, a quoted empty one the empty string; multiLine:
    a quoted value may hold a line break (valid CSV; it failed with
    malformedCSVRecordError, exit 1; tester)."""
    s = cfg.snapshots
    return (spark.read.option("header", str(s.header).lower()).option("sep", s.delimiter)
            .option("quote", '"').option("escape", '"').option("nullValue", _NO_NULL_TEXT)
            .option("emptyValue", "").option("mode", "FAILFAST").option("multiLine", "true"))


def _read_csv(spark: SparkSession, cfg: DimensionPipelineConfig, f: Path, stored: StructType | None,
              spellings: list[str], fix: str) -> DataFrame:
    """The CSV snapshot read as text and cast by :func:`conform` to the declared types, or
    without ``schema:`` to the types Spark infers (one inference job), except the columns the
    table keeps as string: every conversion is checked the same way, so an inferred one cannot
    round or truncate a value either (``10:00:00.1234567`` was stored as ``10:00:00.123456``,
    exit 0; tester)."""
    where = str(f)
    if cfg.snapshots.header:
        _check_header(f, cfg.snapshots.delimiter)
    if cfg.schema:
        text = _spell_as_table(_declared_text(spark, cfg, f), spellings, where)
        targets = _declared(cfg, spellings)
        return conform(_blank_is_null(text, targets), targets, where=where,
                       against="the declared (`schema:`)", fix=fix)
    inferred = _csv_reader(spark, cfg).option("inferSchema", "true").csv(str(f)).schema
    text = _csv_reader(spark, cfg).schema(_as_text(inferred.names)).csv(str(f))
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
        return _csv_reader(spark, cfg).schema(_as_text(list(cfg.schema))).csv(str(f))
    # by name: a schema given to Spark's CSV reader is applied by position and the header
    # ignored (an export with two columns swapped was stored swapped, exit 0)
    text = _csv_reader(spark, cfg).csv(str(f))  # every column a string, named by the header
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
    from datetime import timedelta

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


def run_refresh(cfg: DimensionPipelineConfig, *, date: str, spark: SparkSession | None = None,
                run_id: str | None = None) -> dict[str, Any]:
    """Apply the snapshot of ``date`` (``YYYY-MM-DD``) and return the run summary.

    Raises:
        ConfigError: ``date`` is not a date.
        PipelineLocked: another run holds the pipeline lock.
        SnapshotMissing / SnapshotInvalid: see the module docstring.
    """
    parse_date(date)
    run_id = run_id or f"manual_{datetime.now(timezone.utc):%Y%m%dT%H%M%S}_{uuid.uuid4().hex[:6]}"
    started, t0 = datetime.now(timezone.utc), time.monotonic()
    if spark is None:
        from cdc_lake.spark_session import build_session

        spark = build_session(cfg, app_name=f"dimension-{cfg.name}")  # type: ignore[arg-type]
    from cdc_lake.spark_session import check_file_name_encoding

    check_file_name_encoding(spark, cfg)  # a JVM without a UTF-8 locale: exit 2
    engine = select_engine(spark, cfg.engine)
    summary: dict[str, Any] = {
        "pipeline": cfg.name, "kind": "dimension", "run_id": run_id, "status": "running",
        "date": date, "scd": cfg.scd, "engine": engine.name, "table": str(cfg.table),
        "snapshot_file": str(cfg.snapshot_file(date)), "snapshot_rows": None,
        "inserted": 0, "updated": 0, "deleted": 0, "closed": 0, "unchanged": 0,
        "skipped_writes": 0, "widened": {}, "started_at": started.isoformat(timespec="seconds"),
    }
    with pipeline_lock(cfg) as lock:
        lock.acquire(run_id)
        try:
            _refresh(spark, engine, cfg, date, run_id, summary, t0)
        except Exception as e:  # recorded like the other kinds' failures (docs tester: none)
            record_failure(cfg.runs_path, cfg.name, {
                **summary, "status": "failed", "error": f"{type(e).__name__}: {str(e)[:2000]}",
                "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "duration_s": round(time.monotonic() - t0, 2)})
            raise
    return summary


def _refresh(spark: SparkSession, engine: Engine, cfg: DimensionPipelineConfig, date: str,
             run_id: str, summary: dict[str, Any], t0: float) -> None:
    """The run under the pipeline lock: fills ``summary`` and records it."""
    claim_checkpoint(cfg.checkpoint_path, cfg.name, "dimension", cfg.file)  # another's: exit 3
    state = read_state(cfg.checkpoint_path)
    check_table(engine, cfg, state)
    before = last_applied(engine, cfg)
    summary["last_applied_before"] = version_date(before)
    want = date_version(date)
    if before is not None and want < before:
        summary["status"] = "skipped_older_date"
        summary["message"] = (f"{date} is older than the last applied date "
                              f"{version_date(before)}: nothing changed (no rollback)")
    elif before == want:
        summary["status"] = "already_applied"
        summary["message"] = f"{date} was already applied: nothing changed (idempotent per date)"
        summary["skipped_writes"] = 1
        if not state:  # the state file was moved aside (its recovery): record the date again
            _write_state(cfg.checkpoint_path, {
                "date": date, "version": want, "run_id": safe_run_id(run_id),
                "delta_version": engine.version(str(cfg.table)) if engine.exists(str(cfg.table)) else None,
                "applied_at": datetime.now(timezone.utc).isoformat()})
    else:
        _apply(spark, engine, cfg, date, run_id, summary)
    after = last_applied(engine, cfg)
    summary["last_applied_date"] = version_date(after)
    summary["delta_version"] = engine.version(str(cfg.table))
    summary["tables"] = {"table": {"delta_version": summary["delta_version"],
                                   **{k: summary[k] for k in ("inserted", "updated", "deleted")}}}
    summary["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    summary["duration_s"] = round(time.monotonic() - t0, 2)
    record_summary(cfg.runs_path, cfg.name, summary)


def _apply(spark: SparkSession, engine: Engine, cfg: DimensionPipelineConfig, date: str,
           run_id: str, summary: dict[str, Any]) -> None:
    path, where = str(cfg.table), str(cfg.snapshot_file(date))
    stored = engine.schema(path) if engine.exists(path) else None
    snap = read_snapshot(spark, cfg, date, stored)
    summary["snapshot_rows"] = check_snapshot(snap, cfg.keys, where)
    meta = SCD1_META if cfg.scd == 1 else SCD2_META
    # every check before the first write: a refused snapshot leaves the table as it was
    plan, snap = plan_types(snap, stored, meta=meta, where=where, fix=_fix(cfg))
    if plan.widen:
        print(f"[dimension] widening {path}: " + ", ".join(
            f"{c} {t}" for c, t in plan.describe().items()) + " (lossless; one same-rows commit)",
            flush=True)
        engine.widen(path, plan.widen)
        summary["widened"] = plan.describe()
    table = engine.read(path)
    build = scd1_changes if cfg.scd == 1 else scd2_changes
    changes = build(snap, table, cfg.keys, date, where)
    try:
        summary.update(changes.counts)
        txn = Txn(cfg.app_id, date_version(date))
        if not engine.exists(path):  # an empty first snapshot still makes the table
            # every column nullable: a later snapshot may have NULLs anywhere, and delta-rs
            # MERGE validates NOT NULL columns of rows it only copies (timestamps among them)
            engine.create(path, StructType([StructField(f.name, f.dataType, True)
                                            for f in changes.source.schema.fields]))
        if sum(v for k, v in changes.counts.items() if k != "unchanged"):
            result = engine.merge(path, changes.source, changes.spec, txn=txn)
            summary["skipped_writes"] = int(result.skipped)
    finally:
        changes.release()
    _write_state(cfg.checkpoint_path, {"date": date, "version": date_version(date),
                                       "run_id": safe_run_id(run_id),
                                       "delta_version": engine.version(path),
                                       "applied_at": datetime.now(timezone.utc).isoformat()})
    summary["status"] = "succeeded"
