"""Checks of a ``kind: enrich`` config that need no table and no Spark, run at load.

Called by :func:`cdc_lake.enrich.config.load_enrich_pipeline` on the built config, so a mistake
fails ``spark_jobs/enrich.py`` with exit 2 before Spark starts, and the Airflow DAG import with
the same message. Each :class:`ConfigError` names the YAML file, the dotted key, the value and
what is available. The checks that need a table's schema or Spark's SQL parser run later, right
after the session is built and before the stream starts: :mod:`cdc_lake.enrich.preflight`.

Example::

    check_config(cfg)   # raises ConfigError("p.yaml", "outputs.aggregates.rev.sums.day", ...)

Spark resolves column names case-insensitively (``spark.sql.caseSensitive`` is off by default),
so two names that differ only in case are the same column here too.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from cdc_lake.config import ConfigError
from cdc_lake.enrich.columns import RESERVED, reserved_fact_column

if TYPE_CHECKING:
    from cdc_lake.enrich.config import AggregateConfig, EnrichConfig

# Columns the job writes into every enriched row (enrich.writer / enrich.pending).
ENRICHED_JOB_COLUMNS = {"_unknown_members": "array<string>", "_fact_version": "bigint",
                        "_enriched_batch": "bigint", "_dim_versions": "map<string,bigint>"}
# Columns every aggregate table holds besides its group columns and sums (enrich.aggregate).
AGGREGATE_JOB_COLUMNS = ("_group_key", "count")
# The only event-time type Spark's streaming watermark takes (timestamp_ntz is refused).
WATERMARK_TYPES = ("timestamp", "timestamp_ltz")


def _same(a: str, b: str) -> bool:
    return a.lower() == b.lower()


def _find(name: str, names: list[str] | tuple[str, ...]) -> str | None:
    return next((n for n in names if _same(n, name)), None)


def _hint(missing: list[str], names: list[str]) -> str:
    """`` (names are matched exactly: did you mean 'Qty'?)`` when only the case differs."""
    near = [n for m in missing if (n := _find(m, names)) is not None]
    return f" (names are matched exactly: did you mean {near}?)" if near else ""


def aggregate_written_columns(agg: AggregateConfig) -> dict[str, str]:
    """Every column the aggregate table gets, by name -> what writes it (for clash messages)."""
    out = {c: "the job's own aggregate column" for c in AGGREGATE_JOB_COLUMNS}
    if agg.time_bucket != "none":
        out[agg.time_bucket] = f"the time bucket column (time_bucket: {agg.time_bucket})"
    return out


def check_aggregate_names(file: object, agg: AggregateConfig) -> None:
    """group_by and sums must not collide with each other, with the time bucket column or with
    ``_group_key`` / ``count`` (Spark: ``AMBIGUOUS_REFERENCE`` mid-stream; exit 1 before)."""
    key = f"outputs.aggregates.{agg.name}"
    own = aggregate_written_columns(agg)
    for g in agg.group_by:
        clash = _find(g, list(own))
        if clash is not None:
            raise ConfigError(file, f"{key}.group_by", (
                f"{g!r} is {own[clash]} of every aggregate table; group by other enriched columns "
                f"(written by the job: {', '.join(own)})"))
    lowered = [g.lower() for g in agg.group_by]
    if len(set(lowered)) != len(lowered):
        raise ConfigError(file, f"{key}.group_by", f"{list(agg.group_by)} names a column twice "
                          "(column names are case-insensitive)")
    seen: list[str] = []
    for name, _ in agg.sums:
        taken = {**{g: "a group_by column of this aggregate" for g in agg.group_by}, **own,
                 **{s: "another sum of this aggregate" for s in seen}}
        clash = _find(name, list(taken))
        if clash is not None:
            raise ConfigError(file, f"{key}.sums.{name}", (
                f"the sum name {name!r} is {taken[clash]}" + (f" ({clash!r})" if clash != name else "")
                + "; the aggregate table has one "
                f"column per name (group_by {list(agg.group_by)}, sums, and "
                f"{', '.join(own)}): rename the sum"))
        seen.append(name)


def enriched_columns(cfg: EnrichConfig, fact_columns: list[str]) -> dict[str, str]:
    """Column of the enriched table -> where it comes from (YAML key), for a fact whose
    (normalized) columns are ``fact_columns``."""
    out = {c: "fact" for c in fact_columns}
    for d in cfg.dimensions:
        out.update({o: f"dimensions.{d.name}.columns.{o}" for o in d.outputs})
    out.update({c: "the job" for c in ENRICHED_JOB_COLUMNS})
    return out


def check_columns(cfg: EnrichConfig, fact_columns: list[str], fact_label: str) -> None:
    """Every column the config names in the fact (or an earlier dimension's output) exists:
    ``fact.keys``, each ``dimensions.<d>.on`` column, ``event_time`` and every aggregate's
    ``group_by``; no dimension output shadows a fact column. ``fact_label`` says where the
    fact columns were read (the events schema in the YAML, or the Delta table and version)."""
    file = cfg.file
    have = f"the fact's columns ({fact_label}): {sorted(fact_columns)}"
    clash = [c for c in fact_columns if reserved_fact_column(c)]
    if clash:
        key = "fact.events.schema" if cfg.fact.kind == "events" else "fact.change_feed"
        raise ConfigError(file, key, (
            f"the fact's column(s) {clash} ({fact_label}) have the names of columns the job adds "
            f"while it works (compared ignoring case, as Spark resolves names; "
            f"{[reserved_fact_column(c) for c in clash]}): the batch would fail or lose the "
            "column. Rename them upstream (a view or the producer); the job's columns: "
            f"{', '.join(r for r in RESERVED if r not in ('count', '_group_key'))}"))
    missing = [k for k in cfg.fact.keys if k not in fact_columns]
    if missing:
        raise ConfigError(file, "fact.keys", f"{missing} are not columns of the fact"
                          f"{_hint(missing, fact_columns)}; {have}")
    available = list(fact_columns)
    for d in cfg.dimensions:
        for fact_col, _ in d.on:
            if fact_col not in available:
                raise ConfigError(file, f"dimensions.{d.name}.on", (
                    f"join column {fact_col!r} is neither a fact column nor an output of an "
                    f"earlier dimension{_hint([fact_col], available)}; available: {sorted(available)}"))
        for out in d.outputs:
            clash = _find(out, fact_columns)
            if clash is not None:
                raise ConfigError(file, f"dimensions.{d.name}.columns.{out}", (
                    f"output column {out!r} is also the fact column {clash!r} ({fact_label}); "
                    "rename the output"))
        available += list(d.outputs)
    if cfg.event_time is not None and cfg.event_time not in available:
        raise ConfigError(file, "event_time", (
            f"{cfg.event_time!r} is neither a fact column nor a dimension output"
            f"{_hint([cfg.event_time], available)}; {have}; "
            f"dimension outputs: {[o for d in cfg.dimensions for o in d.outputs]}"))
    enriched = enriched_columns(cfg, fact_columns)
    for a in cfg.outputs.aggregates:
        missing = [g for g in a.group_by if g not in enriched]
        if missing:
            raise ConfigError(file, f"outputs.aggregates.{a.name}.group_by", (
                f"{missing} are not columns of the enriched table{_hint(missing, list(enriched))}; "
                f"it has {sorted(enriched)}"
                + (f" (and `{a.time_bucket}`, added from event_time by time_bucket)"
                   if a.time_bucket != "none" else "")))


def _check_events(cfg: EnrichConfig) -> None:
    ev = cfg.fact.events
    if ev is None:
        return
    t = ev.schema[ev.time].strip().lower()
    if t not in WATERMARK_TYPES:
        raise ConfigError(cfg.file, f"fact.events.schema.{ev.time}", (
            f"the event time column {ev.time!r} (fact.events.time) is declared {ev.schema[ev.time]!r}; "
            "Spark's watermark needs `timestamp` (ISO-8601 text in the JSON is parsed into it)"))
    for col in ev.schema:
        if not re.fullmatch(r"[^`\s][^`]*", col):
            raise ConfigError(cfg.file, f"fact.events.schema.{col}", "not a usable column name")
    check_columns(cfg, list(ev.schema), f"fact.events.schema of {cfg.file.name}")


def _check_dimension_outputs(cfg: EnrichConfig) -> None:
    """Dimension outputs unique case-insensitively (config.py compares them exactly)."""
    seen: dict[str, str] = {}
    for d in cfg.dimensions:
        for out in d.outputs:
            if out.lower() in seen:
                raise ConfigError(cfg.file, f"dimensions.{d.name}.columns.{out}", (
                    f"output column {out!r} is also produced as {seen[out.lower()]} (column names "
                    "are case-insensitive); rename one"))
            seen[out.lower()] = f"dimensions.{d.name}.columns.{out}"


def check_config(cfg: EnrichConfig) -> None:
    """All load-time checks (see the module docstring); raises :class:`ConfigError`."""
    _check_dimension_outputs(cfg)
    for a in cfg.outputs.aggregates:
        check_aggregate_names(cfg.file, a)
    _check_events(cfg)
