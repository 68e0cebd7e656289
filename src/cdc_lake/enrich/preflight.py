"""Checks of an enrichment config against the tables and Spark's SQL, before the stream starts.

:func:`preflight` runs in :func:`cdc_lake.enrich.job.run_enrich` right after the session is built
(and before ``--reprocess`` deletes anything). Without it these mistakes surfaced only inside the
first micro-batch, as Spark's raw ``AnalysisException`` (exit 1), or ran and failed on the data:

* a fact column named in the YAML (``fact.keys``, a ``dimensions.<d>.on`` column, ``event_time``,
  an aggregate's ``group_by``) that the fact table does not have (change feed: the Delta table's
  latest schema; events: ``fact.events.schema``, checked at load by :mod:`.validate`);
* a dimension ``keys`` / ``columns`` source not in an existing dimension table, or an SCD2
  dimension without ``_valid_from``/``_valid_to``;
* a join column (``dimensions.<d>.on``) whose type is of another kind than the dimension key's
  (a string against a number: Spark casts, ``'01'`` matches ``1`` and a non-number fails the
  batch), or a float/double against an exact number (compared as doubles: keys above 2^53
  that differ match);
* ``event_time`` of a type the as-of joins and the ``day``/``hour`` bucket cannot use;
* an aggregate ``sums`` expression that does not parse, does not resolve over the enriched
  columns, is an aggregate function, or is not numeric (a string sum failed only when a row
  held a non-number); ``fact.events.schema`` types Spark cannot parse.

Each raises :class:`ConfigError` (exit 2 from ``spark_jobs/enrich.py``) naming the YAML file,
the dotted key, the value and what is available. A table that does not exist yet is not checked
(a dimension without a table parks every fact: a warning names it; a missing change feed is the
source's error).

Example::

    engine = select_engine(spark, cfg.engine)
    preflight(spark, cfg, engine)      # ConfigError: p.yaml: outputs.aggregates.rev.sums.x: ...
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, CharType, DataType, DateType, DoubleType,
                               FloatType, MapType, NullType, NumericType, StringType, StructField, StructType,
                               TimestampNTZType, TimestampType, VarcharType)
from pyspark.sql.utils import AnalysisException

from cdc_lake.config import ConfigError
from cdc_lake.engines import Engine
from cdc_lake.enrich.config import EnrichConfig
from cdc_lake.enrich.normalize import is_fact_column
from cdc_lake.enrich.validate import ENRICHED_JOB_COLUMNS, check_columns

EVENT_TIME_TYPES = (TimestampType, TimestampNTZType, DateType)
FractionalBinary = (FloatType, DoubleType)  # inexact numbers: only joined with their own kind


def fact_columns(cfg: EnrichConfig, engine: Engine) -> tuple[StructType, str] | None:
    """The fact columns the job enriches (as its batches see them) and where they were read;
    None when the change-feed table does not exist."""
    ev = cfg.fact.events
    if ev is not None:
        return StructType([StructField(c, _ddl_type(cfg, c, t)) for c, t in ev.schema.items()]), \
            f"fact.events.schema of {cfg.file.name}"
    path = str(cfg.fact.change_feed)
    schema = engine.schema(path)
    if schema is None:
        return None
    keep = [f for f in schema.fields if is_fact_column(f.name)]
    return StructType(keep), f"Delta table {path} version {engine.version(path)}"


def _ddl_type(cfg: EnrichConfig, column: str, ddl: str) -> DataType:
    why = "it names more than one column"
    try:
        parsed = DataType.fromDDL(f"`{column}` {ddl}")
        if isinstance(parsed, StructType) and len(parsed.fields) == 1:
            return parsed.fields[0].dataType
    except (PySparkException, ValueError) as e:
        why = _first_line(e)
    raise ConfigError(cfg.file, f"fact.events.schema.{column}", (
        f"{ddl!r} is not a Spark SQL type ({why}); e.g. string, bigint, double, "
        "decimal(10,2), boolean, date, timestamp, array<string>"))


def _first_line(e: BaseException) -> str:
    get = getattr(e, "getMessage", None)
    text = (get() if callable(get) else None) or str(e)
    return text.strip().splitlines()[0][:400] if text.strip() else type(e).__name__


@contextlib.contextmanager
def _quiet_analysis_errors() -> Iterator[None]:
    """PySpark logs every captured AnalysisException with its JVM stack (loggers
    ``SQLQueryContextLogger`` / ``DataFrameQueryContextLogger``); the checks here expect them."""
    from pyspark.logger import PySparkLogger

    loggers = [PySparkLogger.getLogger(n) for n in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before):
            lg.disabled = was


def _check_dimensions(cfg: EnrichConfig, engine: Engine,
                      key_types: dict[str, dict[str, DataType]]) -> dict[str, DataType]:
    """Each existing dimension table has the configured columns; returns the outputs' types
    (unknown, NullType, for a dimension without a table yet) and fills ``key_types`` (dimension
    -> key column -> type) for the dimensions that have a table."""
    types: dict[str, DataType] = {}
    for d in cfg.dimensions:
        schema = engine.schema(str(d.table))
        if schema is None:  # type unknown until the table exists: any use of it resolves
            print(f"[enrich] WARNING: dimensions.{d.name}.table: no Delta table at {d.table} "
                  "(yet): every fact joined with it waits in the pending table until it exists "
                  "(or is released without its columns after late_members.wait); a typo in the "
                  "path?", file=sys.stderr, flush=True)
            types.update({o: NullType() for o in d.outputs})
            continue
        fields = {f.name: f.dataType for f in schema.fields}
        wanted = [(f"dimensions.{d.name}.keys", k) for k in d.keys]
        wanted += [(f"dimensions.{d.name}.columns.{o}", s) for o, s in d.columns]
        if d.scd == 2:
            wanted += [(f"dimensions.{d.name}.scd", s) for s in ("_valid_from", "_valid_to")]
        for key, col in wanted:
            if col not in fields:
                what = ("an SCD2 dimension needs the version columns _valid_from/_valid_to "
                        "(a CDC table with scd: 2, or a dimension refresh with scd: 2); "
                        if key.endswith(".scd") else "")
                raise ConfigError(cfg.file, key, f"column {col!r} is not in the dimension: {what}"
                                  f"table {d.table} (version {engine.version(str(d.table))}) "
                                  f"has {sorted(fields)}")
        types.update({o: fields[s] for o, s in d.columns})
        key_types[d.name] = {k: fields[k] for k in d.keys}
    return types


def _family(t: DataType) -> str:
    if isinstance(t, NumericType):
        return "a number"
    if isinstance(t, (StringType, VarcharType, CharType)):
        return "a string"
    if isinstance(t, (DateType, TimestampType, TimestampNTZType)):
        return "a date/time"
    if isinstance(t, BooleanType):
        return "a boolean"
    if isinstance(t, BinaryType):
        return "binary"
    return t.simpleString()


def _check_join_types(cfg: EnrichConfig, columns: dict[str, DataType],
                      key_types: dict[str, dict[str, DataType]]) -> None:
    """A join column and its dimension key hold the same kind of value. Spark would compare a
    string with a number by casting the string (ANSI mode): ``'01'`` would match ``1``, and the
    first value that is not a number would fail the micro-batch (``CAST_INVALID_INPUT``)."""
    for d in cfg.dimensions:
        keys = key_types.get(d.name)
        for fact_col, dim_col in d.on:
            ft = columns.get(fact_col)
            if keys is None or ft is None or isinstance(ft, NullType):
                continue  # a table not there yet: nothing to compare
            kt = keys[dim_col]
            if _family(ft) != _family(kt):
                raise ConfigError(cfg.file, f"dimensions.{d.name}.on.{fact_col}", (
                    f"join column {fact_col!r} is {ft.simpleString()} but the dimension key "
                    f"{dim_col!r} of table {d.table} is {kt.simpleString()}: Spark would compare "
                    f"them by casting one to the other (a string against a number: '01' matches "
                    f"1, a value that is not a number fails the batch). Give both the same kind of type upstream (a CDC "
                    f"pipeline's tables.<t>.types, or the events schema)"))
            if isinstance(ft, FractionalBinary) != isinstance(kt, FractionalBinary):
                raise ConfigError(cfg.file, f"dimensions.{d.name}.on.{fact_col}", (
                    f"join column {fact_col!r} is {ft.simpleString()} but the dimension key "
                    f"{dim_col!r} of table {d.table} is {kt.simpleString()}: Spark compares them "
                    f"as doubles, which hold integers exactly only up to 2^53 and decimal fractions "
                    f"not at all, so keys that differ would match (9007199254740993 = "
                    f"9007199254740992; tester). Give both an exact type (integer or decimal) "
                    f"upstream, or both float/double"))


def _check_event_time(cfg: EnrichConfig, columns: dict[str, DataType]) -> None:
    et = cfg.event_time
    needed = [f"dimensions.{d.name} (scd: 2)" for d in cfg.dimensions if d.scd == 2]
    needed += [f"outputs.aggregates.{a.name} (time_bucket: {a.time_bucket})"
               for a in cfg.outputs.aggregates if a.time_bucket != "none"]
    if et is None or not needed or et not in columns:
        return
    t = columns[et]
    if not isinstance(t, (*EVENT_TIME_TYPES, NullType)):  # null: a dimension without a table
        raise ConfigError(cfg.file, "event_time", (
            f"{et!r} is of type {t.simpleString()}, but {', '.join(needed)} need"
            f"{'s' if len(needed) == 1 else ''} it as a point in time: name a timestamp or date "
            "column (or cast it upstream)"))


def enriched_frame(spark: SparkSession, fact: StructType, dim_types: dict[str, DataType]) -> DataFrame:
    """An empty DataFrame with the enriched table's columns and types."""
    fields = list(fact.fields) + [StructField(o, t) for o, t in dim_types.items()]
    fields += [StructField(c, DataType.fromDDL(t)) for c, t in ENRICHED_JOB_COLUMNS.items()]
    # typed nulls over an empty range: a JVM-only plan (createDataFrame([]) costs ~2 s cold)
    return spark.range(0).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in fields])


def _check_sums(cfg: EnrichConfig, enriched: DataFrame) -> None:
    from cdc_lake.enrich.aggregate import aggregate_deltas

    cols = sorted(enriched.columns)
    anchor = F.col(f"`{cfg.fact.keys[0]}`")  # a row-level column: aggregate functions fail
    for a in cfg.outputs.aggregates:
        base = f"outputs.aggregates.{a.name}"
        for name, expr in a.sums:
            try:
                t = enriched.select(anchor, F.expr(expr).alias("__sum")).schema["__sum"].dataType
            except (PySparkException, AnalysisException) as e:
                raise ConfigError(cfg.file, f"{base}.sums.{name}", (
                    f"{expr!r} is not a Spark SQL expression over the enriched columns: "
                    f"{_first_line(e)}; enriched columns: {cols}")) from None
            if not isinstance(t, (NumericType, NullType)):  # null: a dimension without a table
                raise ConfigError(cfg.file, f"{base}.sums.{name}", (
                    f"{expr!r} is of type {t.simpleString()}; a sum must be numeric (e.g. "
                    f"CAST(... AS decimal(18,2)), or a numeric column); enriched columns: {cols}"))
        try:  # what the batches build: group columns, bucket, sums, count
            aggregate_deltas(enriched, enriched, a, cfg.event_time).schema
        except (PySparkException, AnalysisException) as e:
            raise ConfigError(cfg.file, base, f"the aggregate cannot be computed over the enriched "
                              f"columns: {_first_line(e)}; enriched columns: {cols}") from None


def preflight(spark: SparkSession, cfg: EnrichConfig, engine: Engine) -> None:
    """Raise :class:`ConfigError` for the first mistake found (see the module docstring)."""
    fact = fact_columns(cfg, engine)
    key_types: dict[str, dict[str, DataType]] = {}
    dim_types = _check_dimensions(cfg, engine, key_types)
    if fact is None:
        return  # no fact table yet: nothing to check the names against
    schema, label = fact
    if cfg.fact.kind == "change_feed":  # events: checked at load (validate.check_config)
        check_columns(cfg, schema.names, label)
    columns = {f.name: f.dataType for f in schema.fields} | dim_types
    _check_join_types(cfg, columns, key_types)
    _check_event_time(cfg, columns)
    with _quiet_analysis_errors():
        _check_sums(cfg, enriched_frame(spark, schema, dim_types))
    _check_events_source(cfg, columns)


def _unorderable(t: DataType) -> str | None:
    """The part of ``t`` Spark cannot group, compare or sort by (a map, a variant), or None."""
    if isinstance(t, MapType) or type(t).__name__ == "VariantType":
        return t.simpleString()
    if isinstance(t, ArrayType):
        return _unorderable(t.elementType)
    if isinstance(t, StructType):
        return next((u for f in t.fields if (u := _unorderable(f.dataType))), None)
    return None


def _check_events_source(cfg: EnrichConfig, columns: dict[str, DataType]) -> None:
    """Events: the id and fact keys of a type the dedup and the latest-per-key window can use
    (a ``map`` id failed the first batch, exit 1: tester), and a landing folder that exists (a
    missing one was a raw PATH_NOT_FOUND traceback from the stream, exit 1)."""
    ev = cfg.fact.events
    if ev is None:
        return
    for c in dict.fromkeys((ev.id, *cfg.fact.keys)):
        bad = _unorderable(columns[c]) if c in columns else None
        if bad is not None:
            role = "the event id (fact.events.id)" if c == ev.id else "a fact key (fact.keys)"
            raise ConfigError(cfg.file, f"fact.events.schema.{c}", (
                f"{c!r}, {role}, is declared {ev.schema[c]!r}: Spark cannot deduplicate or "
                f"group by a value containing {bad}; declare it a string, a number or another "
                "comparable type (e.g. string, bigint, struct<...> of those)"))
    path = str(ev.path)
    if "://" not in path and not Path(path).is_dir():
        what = "is a file, not a folder" if Path(path).exists() else "does not exist"
        raise ConfigError(cfg.file, "fact.events.path", (
            f"the events landing folder {path} {what}: create the folder the producer lands "
            "JSON event files in, or correct fact.events.path"))
