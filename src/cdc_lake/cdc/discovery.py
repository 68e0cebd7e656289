"""What one micro-batch holds, found before anything is written (the first half of a batch).

:func:`route` names each event's target table; :func:`survey` runs one Spark job over the batch
(counts per kind and target, each table's merged variant schema, the primary key the format
carries); :func:`observe` gives each table's observed columns (with the format's type hints and,
for untyped string columns, one more job checking whether every value looks like a date or a
timestamp); :func:`plan_table` decides a table's keys and column types, or why its rows must be
quarantined. The batch writer (:mod:`cdc_lake.cdc.batch_writer`) then builds the writes.

Example::

    ev = batch.withColumn("_target", route(cfg, selected)).persist()
    seen = survey(ev, selected)
    existing = {n: engine.schema(str(cfg.tables[n].path)) for n in seen.present}
    observed = observe(ev, seen, cfg, existing)
    plan = plan_table(cfg, "orders", observed["orders"], seen.pks.get("orders", []),
                      existing["orders"])  # a TablePlan, or the quarantine reason (str)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_lake.cdc import changes as ch
from cdc_lake.cdc.column_types import (DATE_RE, TIMESTAMP_RE, ColumnType, ObservedColumn,
                                       kind_proven, parse_object_schema, resolve, vfield)
from cdc_lake.cdc.config import PipelineConfig
from cdc_lake.cdc.events import ORDINAL
from cdc_lake.cdc.widening import pin_fits, proven_exact, same_type, widen

UNKNOWN = "__unknown__"
IGNORED = "__ignored__"
UNSELECTED = "__unselected__"


@dataclass(frozen=True)
class Survey:
    """The survey's rows (``_kind, _target, ok, n, vtype, pk, ordinal``) and what they add up
    to."""

    rows: list[Any]
    selected: frozenset[str]

    def _sum(self, pred: Any) -> int:
        return sum(r.n for r in self.rows if pred(r))

    @property
    def events(self) -> int:
        return self._sum(lambda r: True)

    @property
    def row_events(self) -> int:
        """Row changes (``row_changes``): row events but those of ignored tables; rows that
        failed (quarantined) included."""
        return self._sum(lambda r: r._kind == "row" and not (r._target == IGNORED and r.ok))

    @property
    def skipped(self) -> int:
        return self._sum(lambda r: r._kind == "skip")

    @property
    def ignored(self) -> int:
        return self._sum(lambda r: r._target == IGNORED and r.ok)

    @property
    def errors(self) -> int:
        return self._sum(lambda r: not r.ok)

    @property
    def unknown(self) -> int:
        return self._sum(lambda r: r._kind == "row" and r.ok and r._target == UNKNOWN)

    @property
    def ddl(self) -> int:
        return self._sum(lambda r: r._kind == "ddl" and r.ok)

    @property
    def present(self) -> list[str]:
        """Selected tables with usable row events in the batch."""
        return sorted({r._target for r in self.rows if r._kind == "row" and r.ok
                       and r._target in self.selected})

    @property
    def pks(self) -> dict[str, list[str]]:
        return {r._target: list(r.pk or []) for r in self.rows if r._kind == "row" and r.ok}

    @property
    def non_object_tables(self) -> list[str]:
        """Selected tables whose usable row images are not all JSON objects (their merged type
        is not ``OBJECT<...>``): :func:`refuse_non_objects` must flag those rows first. (Rows of
        ignored and unknown tables are not typed: left alone.)"""
        return sorted({r._target for r in self.rows if r._kind == "row" and r.ok
                       and r._target in self.selected
                       and r.vtype is not None and not r.vtype.startswith("OBJECT<")})

    @property
    def ordinal_tables(self) -> frozenset[str]:
        """Tables with usable row events whose ``seq`` waits for its per-file ordinal
        (:data:`cdc_lake.cdc.events.ORDINAL`: Canal, Maxwell without ``xoffset``): only these
        need :func:`cdc_lake.cdc.events.finalize_order` (a window over the table's rows)."""
        return frozenset(r._target for r in self.rows if r._kind == "row" and r.ok
                         and getattr(r, "ordinal", None))

    def variant_types(self, name: str) -> dict[str, str]:
        return next((parse_object_schema(r.vtype) for r in self.rows
                     if r._kind == "row" and r.ok and r._target == name), {})


def route(cfg: PipelineConfig, selected: set[str]) -> Column:
    """Column naming each event's target table (or UNKNOWN / IGNORED / UNSELECTED)."""
    expr = None
    for t in cfg.tables.values():
        cond = F.col("tbl") == t.source_table
        if t.database:
            cond = cond & (F.col("db") == t.database)
        name = t.name if t.name in selected else UNSELECTED
        expr = F.when(cond, name) if expr is None else expr.when(cond, name)
    for ig in cfg.ignore_tables:
        db, _, tbl = ig.rpartition(".")
        cond = F.col("tbl") == tbl
        if db:
            cond = cond & (F.col("db") == db)
        expr = expr.when(cond, IGNORED)  # type: ignore[union-attr]
    return expr.otherwise(UNKNOWN)  # type: ignore[union-attr]


@contextmanager
def _case_sensitive(df: DataFrame) -> Iterator[None]:
    """``spark.sql.caseSensitive=true`` while a ``schema_of_variant_agg`` runs: case-insensitive,
    its merge drops one of two field spellings that sort next to each other (``Amount`` and
    ``amount`` in one batch: one column, the other spelling's values stored as NULL, exit 0:
    tester), so neither reaches the spelling rule of :func:`plan_table`. Our own column names
    in these queries are exact; the previous setting is restored."""
    conf = df.sparkSession.conf
    before = conf.get("spark.sql.caseSensitive", "false")
    conf.set("spark.sql.caseSensitive", "true")
    try:
        yield
    finally:
        conf.set("spark.sql.caseSensitive", before)


def survey(ev: DataFrame, selected: set[str]) -> Survey:
    """One pass over the batch (one Spark job): counts per kind/target, each table's merged
    variant schema and primary key, and whether any usable row's ``seq`` holds the
    :data:`~cdc_lake.cdc.events.ORDINAL` placeholder (:attr:`Survey.ordinal_tables`)."""
    usable = (F.col("_kind") == "row") & F.col("_error").isNull()
    with _case_sensitive(ev):
        rows = (ev.groupBy("_kind", "_target", F.col("_error").isNull().alias("ok"))
                .agg(F.count(F.lit(1)).alias("n"),
                     F.expr("schema_of_variant_agg(CASE WHEN _kind = 'row' AND _error IS NULL "
                            "THEN row END)").alias("vtype"),
                     F.first(F.when(usable, F.col("pk_names")), ignorenulls=True).alias("pk"),
                     F.coalesce(F.max(F.when(usable, F.col("seq").contains(ORDINAL))),
                                F.lit(False)).alias("ordinal"))
                .collect())
    return Survey(rows, frozenset(selected))


def refuse_non_objects(ev: DataFrame, tables: list[str]) -> DataFrame:
    """``ev`` with an ``_error`` on each usable row event of ``tables`` whose row image is not a
    JSON object (an array, a number...): it has no columns to store, and left in, it would make
    the table's merged row type ``VARIANT``, so that no column of the batch's other rows is
    typed. Run only for the tables :attr:`Survey.non_object_tables` names (a per-row schema is
    costly), then survey again.

    Example::

        if seen.non_object_tables:
            ev = refuse_non_objects(ev, seen.non_object_tables)
            seen = survey(ev, selected)
    """
    kind = F.schema_of_variant("row")
    bad = ((F.col("_kind") == "row") & F.col("_error").isNull() & F.col("_target").isin(tables)
           & ~kind.startswith("OBJECT<"))
    reason = F.concat(F.lit("row image is not a JSON object (it is "),
                      F.when(F.length(kind) > 80, F.concat(F.substring(kind, 1, 80), F.lit("...")))
                      .otherwise(kind), F.lit("): no columns to store"))
    return ev.withColumn("_error", F.when(bad, reason).otherwise(F.col("_error")))


def _hints(ev: DataFrame, fmt: str, targets: list[str]) -> dict[str, dict[str, tuple[str, ...]]]:
    """Per-column type metadata the format carries (Canal mysqlType, Debezium schema): every
    distinct hint of the batch's events, sorted (a source-side ALTER inside the batch gives a
    column two; :func:`cdc_lake.cdc.type_hints.hinted` merges them)."""
    if fmt == "maxwell":
        return {}
    distinct = (ev.where(F.col("_target").isin(targets) & F.col("type_hints").isNotNull())
                .select("_target", F.array_sort(F.map_entries("type_hints")).alias("h"))
                .distinct().collect())
    seen: dict[str, dict[str, set[str]]] = {}
    for r in distinct:
        for e in r.h:
            if e[1] is not None:
                seen.setdefault(r._target, {}).setdefault(e[0], set()).add(e[1])
    return {t: {c: tuple(sorted(hs)) for c, hs in cols.items()} for t, cols in seen.items()}


def _temporal(ev: DataFrame, wanted: dict[str, list[str]]) -> dict[tuple[str, str], tuple[bool, bool]]:
    """For string columns with no declared type: do all values look like dates / timestamps?

    One aggregate over the batch for all tables (one Spark job), not one per table.
    """
    if not wanted:
        return {}
    # Each value is read once (a projection: 1 = date, 2 = timestamp, 0 = neither, null for
    # null values and other tables' rows), then two flags per column are aggregated from it.
    looks, names = [], []
    for target, cols in wanted.items():
        mine = F.col("_target") == target
        for c in cols:
            v = vfield(F.col("row"), c, "string")
            looks.append(F.when(mine & v.isNotNull(), F.when(v.rlike(DATE_RE), 1)
                                .when(v.rlike(TIMESTAMP_RE), 2).otherwise(0)).alias(f"k{len(looks)}"))
            names.append((target, c))
    # bool_and skips the nulls; no value at all -> False
    aggs = [F.coalesce(F.bool_and(F.col(f"k{i}") == kind), F.lit(False))
            for i in range(len(looks)) for kind in (1, 2)]
    row = (ev.where((F.col("_kind") == "row") & F.col("_error").isNull()
                    & F.col("_target").isin(list(wanted)))
           .select(*looks).agg(*aggs).first())
    return {tc: (bool(row[2 * i]), bool(row[2 * i + 1])) for i, tc in enumerate(names)}


def _is_numeric(kind: str | None) -> bool:
    k = (kind or "").upper()
    return k in ("TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE") or k.startswith("DECIMAL")


def _type_of(schema: StructType | None, column: str) -> str | None:
    low = column.lower()
    return next((f.dataType.simpleString() for f in (schema.fields if schema else [])
                 if f.name.lower() == low), None)


def _numeric_kinds(ev: DataFrame, wanted: dict[str, list[str]]) -> dict[tuple[str, str], str]:
    """For columns of an existing numeric type whose batch values are of mixed kinds (10.5 and
    "n/a"): the merged kind of the numeric values alone (one Spark job for all of them), so
    that a bad value does not keep a valid one from widening the column. Run only for such
    columns (rare); the bad values are still quarantined one by one."""
    if not wanted:
        return {}
    numbers, names = [], []
    for target, cols in wanted.items():
        mine = F.col("_target") == target
        for c in cols:
            v = vfield(F.col("row"), c, "variant")
            kind = F.upper(F.schema_of_variant(v))
            numeric = (kind.isin("TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE")
                       | kind.startswith("DECIMAL"))
            numbers.append(F.when(mine & numeric, v).alias(f"k{len(names)}"))
            names.append((target, c))
    with _case_sensitive(ev):
        row = (ev.where((F.col("_kind") == "row") & F.col("_error").isNull()
                        & F.col("_target").isin(list(wanted)))
               .select(*numbers)
               .agg(*[F.expr(f"schema_of_variant_agg(k{i})") for i in range(len(names))]).first())
    return {tc: str(row[i]) for i, tc in enumerate(names)
            if row[i] is not None and _is_numeric(str(row[i]))}


RESERVED = (*ch.META, *ch.SCD2_META)


def _reserved_reason(cfg: PipelineConfig, name: str, clash: list[str]) -> str:
    return (f"table {name}: source column(s) {clash} have the name of a metadata column the "
            f"job writes on every row ({', '.join(RESERVED)}; Spark compares names ignoring "
            "case); storing the row would overwrite the source's value, so it is not stored: "
            "rename the column at the source (or a view/SMT in the producer), or drop it "
            f"knowingly with tables.{name}.exclude_columns: {clash} in {cfg.file.name}, then "
            "re-ingest the quarantined lines")


def _merge_spellings(obs: list[ObservedColumn], canon: str) -> ObservedColumn:
    """One observation for the spellings of a column that differ only in case. Values of
    different kinds: ``VARIANT`` (typed as JSON text if nothing else fixes the type; never
    proven exact)."""
    kinds = {o.variant_type for o in obs} - {"VOID"}
    vtype = kinds.pop() if len(kinds) == 1 else ("VOID" if not kinds else "VARIANT")
    strings = [o for o in obs if o.variant_type == "STRING"]
    hints = tuple(sorted({h for o in obs for h in (o.hints or ((o.hint,) if o.hint else ()))}))
    return ObservedColumn(canon, vtype, hints[0] if hints else None,
                          bool(strings) and all(o.all_dates for o in strings),
                          bool(strings) and all(o.all_timestamps for o in strings), hints=hints)


def plan_table(cfg: PipelineConfig, name: str, observed: dict[str, ObservedColumn], pk: list[str],
               existing: StructType | None) -> ch.TablePlan | str:
    """The table's plan, or the reason its rows must be quarantined.

    Column names compare as Spark compares them, ignoring case: a source column named like a
    metadata column (:data:`RESERVED`, any case) or holding a backtick quarantines the table's
    rows (unless config excludes it); spellings of one name that differ only in case (``Name``, then ``name`` after
    a rename at the source) are one column, named as the Delta table names it (first batch:
    the spelling that sorts first) and read from whichever spelling an event carries."""
    t = cfg.tables[name]
    meta = {m.lower() for m in RESERVED}
    low = {c.lower() for c in t.exclude_columns}
    allow = None if t.columns is None else {c.lower() for c in t.columns}
    wanted = [c for c in observed if c.lower() not in low and (allow is None or c.lower() in allow)]
    clash = sorted(c for c in wanted if c.lower() in meta)
    if clash:
        return _reserved_reason(cfg, name, clash)
    ticks = sorted(c for c in wanted if "`" in c)
    if ticks:  # the Delta writers' column references do not escape a backtick (yet)
        return (f"table {name}: source column(s) {ticks} hold a backtick (`), which the Delta "
                "writers cannot reference yet; rows not stored: rename the column at the source, "
                f"or drop it knowingly with tables.{name}.exclude_columns: {ticks} in "
                f"{cfg.file.name}, then re-ingest the quarantined lines")
    existing_types = {f.name: f.dataType.simpleString() for f in (existing.fields if existing else [])
                      if f.name.lower() not in meta}
    canon = {c.lower(): c for c in existing_types}
    spellings: dict[str, list[str]] = {}
    for c in sorted(observed):
        spellings.setdefault(canon.setdefault(c.lower(), c), []).append(c)
    spelled = {c: tuple(s) for c, s in spellings.items() if s != [c]}
    observed = {c: observed[c] if s == [c] else _merge_spellings([observed[x] for x in s], c)
                for c, s in spellings.items()}
    types = {canon.get(c.lower(), c): v for c, v in t.types.items()}
    keys = tuple(canon.get(k.lower(), k) for k in (t.keys or tuple(pk)))
    if not keys:
        return (f"no primary key for table {name}: the events carry none; "
                f"set tables.{name}.keys in {cfg.file.name}")
    candidates = list(existing_types) + sorted(c for c in observed if c not in existing_types)
    for k in keys:
        if k not in candidates:
            candidates.append(k)
    if allow is not None:
        candidates = [c for c in candidates if c.lower() in allow]
    candidates = [c for c in candidates if c.lower() not in low and c.lower() not in meta]
    columns: dict[str, ColumnType] = {}
    widened: dict[str, str] = {}
    fmt, temporal = cfg.source_format, cfg.infer_temporal
    for c in candidates:
        obs = observed.get(c) or ObservedColumn(c, "VOID", None, False, False)
        configured, current = types.get(c), existing_types.get(c)
        if current is not None and configured is not None and not same_type(configured, current):
            # a pin changed on a running pipeline: applied when it is a lossless widening of
            # the stored column; otherwise the stored type stays the target (values checked
            # against what they are stored as; the run's preflight refuses such a pin)
            if pin_fits(current, configured):
                widened[c] = current = configured
            else:
                configured = current
        if current is not None and configured is None and c in observed:
            # the batch alone would pick `natural`: widen the column when that is lossless
            numbers = obs if obs.numeric_type is None else ObservedColumn(
                c, obs.numeric_type, None, False, False)  # a bad value does not block a widening
            natural = resolve(numbers, configured=None, existing=None, fmt=fmt, infer_temporal=temporal)
            wider = widen(current, natural.sql) if natural is not None else None
            if wider is not None:
                widened[c] = current = wider
        ct = resolve(obs, configured=configured, existing=current, fmt=fmt, infer_temporal=temporal)
        if ct is None and c in keys:
            ct = ColumnType("string")
        if ct is not None:
            columns[c] = ct
    # (only columns the survey typed: with a row image that is not an object in the batch the
    # merged schema is VARIANT and no column is typed)
    proven = frozenset(c for c, ct in columns.items() if ct.decoder == "plain" and c in observed
                       and (proven_exact(observed[c].variant_type, ct.sql)
                            or kind_proven(observed[c], ct.sql)))
    return ch.TablePlan(name=name, keys=tuple(keys), columns=columns, scd=t.scd, widen=widened,
                        proven_exact=proven,
                        spellings={c: s for c, s in spelled.items() if c in columns})


def observe(ev: DataFrame, seen: Survey, cfg: PipelineConfig,
            existing: dict[str, StructType | None]) -> dict[str, dict[str, ObservedColumn]]:
    """Each present table's observed columns: variant type, the format's hint, and (untyped
    strings, when ``infer_temporal``) whether every value looks like a date / timestamp."""
    present = seen.present
    hints = _hints(ev, cfg.source_format, present) if present else {}
    observed = {n: {c: ObservedColumn(c, t, (hints.get(n, {}).get(c) or (None,))[0], False, False,
                                      hints=hints.get(n, {}).get(c) or ())
                    for c, t in seen.variant_types(n).items()} for n in present}
    pks = seen.pks
    keys = {n: {k.lower() for k in (cfg.tables[n].keys or pks.get(n) or ())} for n in present}
    mixed = {n: [c for c, o in observed[n].items() if c not in cfg.tables[n].types
                 and c.lower() not in keys[n]  # a key column: a bad key still blocks it
                 and o.variant_type == "VARIANT" and not o.hint  # values of mixed kinds
                 and existing[n] is not None and _is_numeric(_type_of(existing[n], c))]
             for n in present}
    for (n, c), t in _numeric_kinds(ev, {n: cs for n, cs in mixed.items() if cs}).items():
        o = observed[n][c]
        observed[n][c] = ObservedColumn(c, o.variant_type, o.hint, o.all_dates, o.all_timestamps, t,
                                        o.hints)
    if cfg.infer_temporal:
        wanted = {n: [c for c, o in observed[n].items()
                      if o.variant_type == "STRING" and not o.hint
                      and c not in cfg.tables[n].types
                      and not (existing[n] and c in existing[n].fieldNames())]  # type: ignore[union-attr]
                  for n in present}
        flags = _temporal(ev, {n: cs for n, cs in wanted.items() if cs})
        for (n, c), (d, ts) in flags.items():
            observed[n][c] = ObservedColumn(c, "STRING", None, d, ts)
    return observed
