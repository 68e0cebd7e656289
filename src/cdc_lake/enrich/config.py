"""``kind: enrich`` pipeline YAML -> one frozen, validated :class:`EnrichConfig`.

Same rules as the CDC kind (:mod:`cdc_lake.config`): relative paths resolve against the YAML's
folder, ``${VAR}`` expands, every problem raises :class:`ConfigError` naming file, dotted key,
value and fix. Example::

    from cdc_lake.config import load_pipeline
    cfg = load_pipeline("pipelines/shop_order_lines.yaml")     # dispatches on kind: enrich
    [d.name for d in cfg.dimensions]     # ['orders', 'products', 'categories', 'customers']
    cfg.outputs.enriched                 # PosixPath('/abs/lake/gold/order_lines')

See docs/enrichment.md for the full YAML reference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from cdc_lake.config import (NAME_RE, TRIGGERS, ConfigError, DeltaSparkSettings, Reader, Schedule,
                             parse_maintenance, parse_runtime, parse_schedule, split_type_hint)
from cdc_lake.enrich.columns import reserved, reserved_message
from cdc_lake.locks import LockSettings
from cdc_lake.paths import overlap

_DURATION_RE = re.compile(r"^(\d+)\s*([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_EVENT_FORMATS = ("json",)
TIME_BUCKETS = ("day", "hour", "none")
@dataclass(frozen=True)
class EventSource:
    """``fact.events``: an append-only landing folder of JSON events (file stream)."""

    path: Path
    format: str
    id: str
    time: str
    watermark: str
    schema: dict[str, str]
    max_files_per_trigger: int
    # ``fact.events.archive_dir``: files of committed micro-batches move there (Spark's
    # ``cleanSource=archive``), so the folder listed on every run holds only what is new;
    # ``--reprocess`` moves them back first (cdc_lake.sources.landing_history.restore_archived)
    archive_dir: Path | None = None

    @property
    def ddl(self) -> str:
        return ", ".join(f"`{c}` {t}" for c, t in self.schema.items())


@dataclass(frozen=True)
class FactConfig:
    """``fact:`` — a Delta change feed (``change_feed``) or JSON events (``events``)."""

    kind: Literal["change_feed", "events"]
    keys: tuple[str, ...]
    change_feed: Path | None = None
    events: EventSource | None = None
    max_versions_per_trigger: int | None = None
    max_rows_per_trigger: int | None = None

    @property
    def label(self) -> str:
        return str(self.change_feed if self.kind == "change_feed" else self.events.path)  # type: ignore[union-attr]


@dataclass(frozen=True)
class DimensionConfig:
    """One ``dimensions.<name>`` entry; ``on`` maps fact/earlier column -> dimension column,
    ``columns`` maps output column -> dimension column."""

    name: str
    table: Path
    keys: tuple[str, ...]
    scd: Literal[1, 2]
    on: tuple[tuple[str, str], ...]
    columns: tuple[tuple[str, str], ...]

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(o for o, _ in self.columns)


@dataclass(frozen=True)
class AggregateConfig:
    name: str
    path: Path
    group_by: tuple[str, ...]
    time_bucket: str
    sums: tuple[tuple[str, str], ...]

    @property
    def group_columns(self) -> tuple[str, ...]:
        return self.group_by + (() if self.time_bucket == "none" else (self.time_bucket,))


@dataclass(frozen=True)
class Outputs:
    enriched: Path
    pending: Path
    quarantine: Path
    manifest: Path
    aggregates: tuple[AggregateConfig, ...]


@dataclass(frozen=True)
class EnrichConfig:
    """Everything one enrichment run needs; built only by :func:`load_enrich_pipeline`."""

    file: Path
    name: str
    description: str
    owner: str
    tags: tuple[str, ...]
    schedule: Schedule
    start_date: str
    retries: int
    trigger: Literal["available_now", "once"]
    fact: FactConfig
    dimensions: tuple[DimensionConfig, ...]
    event_time: str | None
    late_wait: timedelta
    outputs: Outputs
    lake_root: Path
    checkpoint_path: Path
    runs_path: Path
    engine: Literal["auto", "deltalake", "delta-spark"]
    delta_spark: DeltaSparkSettings
    spark_conf: dict[str, str]
    spark_conn_id: str
    kind: Literal["enrich"] = "enrich"
    lock: LockSettings = field(default_factory=LockSettings)
    maintenance: Any = None  # ``maintenance:`` -> cdc_lake.maintenance.MaintenanceSettings, or None

    @property
    def upstream_tables(self) -> tuple[Path, ...]:
        """Delta tables this pipeline reads (change feed fact + dimensions)."""
        fact = (self.fact.change_feed,) if self.fact.change_feed else ()
        return fact + tuple(d.table for d in self.dimensions)

    @property
    def change_feed_sources(self) -> tuple[Path, ...]:
        """Delta tables whose change feed this pipeline reads from its checkpoint; maintenance
        keeps their history until this reader has passed it (see ``cdc_lake.maintenance``)."""
        return (self.fact.change_feed,) if self.fact.change_feed else ()

    @property
    def pinned_tables(self) -> dict[str, Path]:
        """Tables a batch plan pins by version (``cdc_lake.enrich.plan``), by the plan's key: a
        replayed batch reads them at those versions, so maintenance keeps their files while a
        batch planned on them is not committed (``cdc_lake.retention.pinned_readers``)."""
        out = {f"dim:{d.name}": d.table for d in self.dimensions}
        out.update({"enriched": self.outputs.enriched, "pending": self.outputs.pending})
        return out

    @property
    def output_tables(self) -> dict[str, Path]:
        """Every table the job writes, by the name used in txn ids and crash points."""
        out = {"enriched": self.outputs.enriched, "pending": self.outputs.pending}
        out.update({f"aggregate:{a.name}": a.path for a in self.outputs.aggregates})
        out.update({"quarantine": self.outputs.quarantine, "manifest": self.outputs.manifest})
        return out

    @property
    def roots(self) -> tuple[Path, ...]:
        return (self.lake_root, self.checkpoint_path.parent)


def parse_duration(r: Reader, name: str, default: str) -> timedelta:
    v = str(r.raw.get(name, default)).strip()
    m = _DURATION_RE.match(v)
    if not m:
        raise r.fail(name, f"expected a duration like '0s', '30m', '2h', '1d', got {v!r}")
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def _mapping(r: Reader, name: str, required: bool = True) -> dict[str, str]:
    v = r.raw.get(name)
    if v is None and not required:
        return {}
    if not isinstance(v, dict) or not v or not all(
            isinstance(k, str) and isinstance(x, str) and k and x for k, x in v.items()):
        what = "column names to Spark types" if name == "schema" else "column names to column names"
        parts = [x for kv in (v.items() if isinstance(v, dict) else ()) for x in kv]
        raise r.fail(name, f"expected a non-empty mapping of {what}, got {v!r}{split_type_hint(*parts)}")
    return dict(v)


def _fact(r: Reader) -> FactConfig:
    f = r.section("fact", required=True)
    f.check_known({"change_feed", "events", "keys", "max_versions_per_trigger", "max_rows_per_trigger"})
    has_cf, has_ev = f.raw.get("change_feed") is not None, f.raw.get("events") is not None
    if has_cf == has_ev:
        raise f.fail("change_feed", "set exactly one of fact.change_feed (a Delta table with the "
                     "change data feed on) or fact.events (a folder of JSON events)")
    mv, mr = f.int("max_versions_per_trigger", None), f.int("max_rows_per_trigger", None)
    if has_cf:
        return FactConfig("change_feed", f.names("keys", non_empty=True) or
                          _required(f, "keys", "the CDC table's keys, e.g. keys: [id]"),
                          change_feed=f.path("change_feed", required=True),
                          max_versions_per_trigger=mv, max_rows_per_trigger=mr)
    e = f.section("events")
    e.check_known({"path", "format", "id", "time", "watermark", "schema", "max_files_per_trigger",
                   "archive_dir"})
    schema = _mapping(e, "schema")
    ev_id, ev_time = e.str("id", required=True) or "", e.str("time", required=True) or ""
    for k, c in (("id", ev_id), ("time", ev_time)):
        if c not in schema:
            raise e.fail(k, f"column {c!r} is not in fact.events.schema ({sorted(schema)})")
    watermark = e.str("watermark", default="1 hour") or "1 hour"
    if not re.match(r"^\d+\s+(second|minute|hour|day)s?$", watermark.strip()):
        raise e.fail("watermark", f"expected e.g. '10 minutes' or '1 hour', got {watermark!r}")
    events = EventSource(path=e.folder("path", required=True),  # type: ignore[arg-type]
                         format=e.choice("format", _EVENT_FORMATS, default="json"),
                         id=ev_id, time=ev_time, watermark=watermark.strip(), schema=schema,
                         max_files_per_trigger=e.int("max_files_per_trigger", 1000) or 1000,
                         archive_dir=e.folder("archive_dir"))
    keys = f.names("keys", default=(ev_id,), non_empty=True) or (ev_id,)
    return FactConfig("events", keys, events=events, max_rows_per_trigger=mr)


def _required(r: Reader, name: str, hint: str) -> Any:
    raise r.fail(name, f"is required ({hint})")


def _dimensions(r: Reader) -> tuple[DimensionConfig, ...]:
    raw = r.raw.get("dimensions")
    if not isinstance(raw, dict) or not raw:
        raise r.fail("dimensions", "expected a non-empty mapping of dimension name -> settings")
    dims: list[DimensionConfig] = []
    outputs: dict[str, str] = {}
    for name, draw in raw.items():
        if isinstance(draw, dict) and True in draw:  # YAML 1.1 reads a bare `on:` key as true
            draw = {("on" if k is True else k): v for k, v in draw.items()}
        d = Reader(r.file, draw if isinstance(draw, dict) else {}, f"dimensions.{name}")
        if not isinstance(draw, dict):
            raise d.fail("", f"expected a mapping, got {draw!r}")
        if not NAME_RE.match(str(name)):
            raise ConfigError(r.file, f"dimensions.{name}", f"name must match {NAME_RE.pattern}")
        d.check_known({"table", "keys", "scd", "on", "columns"})
        keys = d.names("keys", non_empty=True) or _required(d, "keys", "the dimension's key columns")
        scd = d.scd()
        on = _mapping(d, "on")
        if sorted(on.values()) != sorted(keys):
            raise d.fail("on", f"must map a column to each key of the dimension {list(keys)} "
                         f"(one member per fact), got {on!r}")
        columns = _mapping(d, "columns")
        for out in columns:
            if out in outputs:
                raise d.fail(f"columns.{out}", f"output column {out!r} is already produced by "
                             f"dimensions.{outputs[out]}; rename one")
            if reserved(out):
                raise d.fail(f"columns.{out}", reserved_message(out))
            outputs[out] = str(name)
        dims.append(DimensionConfig(str(name), d.path("table", required=True),  # type: ignore[arg-type]
                                    keys, scd, tuple(on.items()), tuple(columns.items())))
    return tuple(dims)


def _check_event_time(r: Reader, dims: tuple[DimensionConfig, ...], event_time: str | None,
                      needs: bool) -> None:
    if event_time is None:
        if needs:
            raise r.fail("event_time", "is required: SCD2 dimensions join as of the event time "
                         "and time-bucketed aggregates need it (a fact column or an output column "
                         "of an earlier dimension)")
        return
    producer = next((i for i, d in enumerate(dims) if event_time in d.outputs), None)
    if producer is None:
        return  # a fact column (checked against the data at run time)
    for d in dims[:producer + 1]:
        if d.scd == 2:
            raise r.fail("event_time", f"{event_time!r} comes from dimensions.{dims[producer].name}, "
                         f"which is joined after (or is) the SCD2 dimension {d.name!r} that needs "
                         "it; move that dimension later in the YAML")


def _aggregates(o: Reader, root: Path) -> tuple[AggregateConfig, ...]:
    raw = o.raw.get("aggregates") or {}
    if not isinstance(raw, dict):
        raise o.fail("aggregates", f"expected a mapping of aggregate name -> settings, got {raw!r}")
    out = []
    for name, araw in raw.items():
        a = Reader(o.file, araw if isinstance(araw, dict) else {}, f"{o.key('aggregates')}.{name}")
        if not isinstance(araw, dict) or not NAME_RE.match(str(name)):
            raise a.fail("", f"expected a mapping under a name matching {NAME_RE.pattern}")
        a.check_known({"path", "group_by", "time_bucket", "sums"})
        sums = _mapping(a, "sums", required=False)
        for s in sums:
            if reserved(s):
                raise a.fail(f"sums.{s}", reserved_message(s))
            if not NAME_RE.match(s):
                raise a.fail(f"sums.{s}", f"{s!r} is not a valid column name ({NAME_RE.pattern})")
        out.append(AggregateConfig(str(name), a.path("path", default=root / str(name)),  # type: ignore[arg-type]
                                   a.names("group_by", default=()) or (),
                                   a.choice("time_bucket", TIME_BUCKETS, default="none"),
                                   tuple(sums.items())))
    return tuple(out)


def check_disjoint_paths(file: Path, owned: list[tuple[str, Path]],
                         inputs: list[tuple[str, Path]]) -> None:
    """Every path the job writes (and ``--reprocess`` deletes) must be disjoint from every input
    table and from every other path it writes: not equal, not inside, not containing (compared
    after resolving symlinks, ``..`` and trailing slashes). Otherwise ``--reprocess`` would delete
    upstream tables or another output (seen: ``storage.checkpoint`` = the folder holding the fact
    table deleted the fact and dimension tables)."""
    resolved = [(k, p, Path(p).resolve()) for k, p in owned]
    ins = [(k, p, Path(p).resolve()) for k, p in inputs]
    for i, (key, path, rp) in enumerate(resolved):
        for other_key, other, ro in ins + resolved[i + 1:]:
            how = overlap(rp, ro)
            if how is None:
                continue
            what = ("the input table" if (other_key, other, ro) in ins
                    else "the path the job also writes as")
            raise ConfigError(file, key, (
                f"{path} {how} {what} {other_key} ({other}"
                + (f", resolved {ro}" if ro != Path(other) or rp != Path(path) else "") + "); "
                f"the job writes {key} (and `--reprocess` deletes the checkpoint and the output "
                f"tables), so it must be a folder of its own that neither holds nor lies inside "
                f"{other_key}: give each output and the checkpoint its own path"))


def _check_archive(file: Path, archive: Path, others: list[tuple[str, Path]]) -> None:
    """``fact.events.archive_dir`` is a local folder (Spark archives by a rename within one file
    system) that neither holds nor lies inside the landing folder (the stream would read its
    archived files again, or archive its own archive), an output, the checkpoint or a dimension
    table (``--reprocess`` deletes the outputs and the checkpoint)."""
    key = "fact.events.archive_dir"
    if ":" in str(archive):
        raise ConfigError(file, key, (
            f"{str(archive)!r}: the archive must be a local folder (Spark archives by renaming "
            "within one file system; a URI is not supported here)"))
    ra = archive.resolve()
    for other_key, other in others:
        how = overlap(ra, Path(other).resolve())
        if how is not None:
            raise ConfigError(file, key, (
                f"{archive} {how} {other_key} ({other}): the archive needs a folder of its own "
                "that neither holds nor lies inside the landing folder, an output, the "
                "checkpoint or a dimension table; give it a path of its own"))


def load_enrich_pipeline(file: Path, raw: dict[str, Any]) -> EnrichConfig:
    """Validate the mapping of a ``kind: enrich`` YAML (called by :func:`cdc_lake.config.load_pipeline`)."""
    r = Reader(file, raw)
    r.check_known({"kind", "pipeline", "description", "owner", "tags", "schedule", "start_date",
                   "retries", "trigger", "fact", "dimensions", "event_time", "late_members",
                   "outputs", "storage", "engine", "spark", "lock", "maintenance"})
    name = r.str("pipeline", required=True) or ""
    if not NAME_RE.match(name):
        raise r.fail("pipeline", f"{name!r} must match {NAME_RE.pattern} (it becomes the DAG id)")
    fact = _fact(r)
    dims = _dimensions(r)
    for d in dims:
        clash = set(d.outputs) & set(fact.keys)
        if clash:
            raise r.fail(f"dimensions.{d.name}.columns", f"{sorted(clash)} are fact keys")
    event_time = r.str("event_time")
    lm = r.section("late_members")
    lm.check_known({"wait"})
    late_wait = parse_duration(lm, "wait", "2h")
    o = r.section("outputs", required=True)
    o.check_known({"enriched", "pending", "quarantine", "manifest", "aggregates"})
    enriched = o.path("enriched", required=True)
    storage = r.section("storage")
    storage.check_known({"root", "checkpoint", "runs"})
    root = storage.path("root", default=enriched.parent)  # type: ignore[union-attr]
    aggs = _aggregates(o, root)  # type: ignore[arg-type]
    _check_event_time(r, dims, event_time,
                      any(d.scd == 2 for d in dims) or any(a.time_bucket != "none" for a in aggs))
    outputs = Outputs(enriched=enriched,  # type: ignore[arg-type]
                      pending=o.path("pending", default=root / "_pending" / name),  # type: ignore[arg-type, operator]
                      quarantine=o.path("quarantine", default=root / "_quarantine"),  # type: ignore[arg-type, operator]
                      manifest=o.path("manifest", default=root / "_manifests" / name),  # type: ignore[arg-type, operator]
                      aggregates=aggs)
    checkpoint = storage.path("checkpoint", default=root / "_checkpoints" / name)  # type: ignore[operator]

    def said(section: dict[str, Any], key: str, label: str) -> str:  # a defaulted path says so
        return label if isinstance(section, dict) and section.get(key) is not None else (
            f"{label} (not set: its default under storage.root)")

    agg_raw = o.raw.get("aggregates") or {}
    owned = [(said(storage.raw, "checkpoint", "storage.checkpoint"), checkpoint),
             ("outputs.enriched", outputs.enriched),
             (said(o.raw, "pending", "outputs.pending"), outputs.pending),
             (said(o.raw, "quarantine", "outputs.quarantine"), outputs.quarantine),
             (said(o.raw, "manifest", "outputs.manifest"), outputs.manifest)]
    owned += [(said(agg_raw.get(a.name), "path", f"outputs.aggregates.{a.name}.path"), a.path)
              for a in aggs]
    inputs = [("fact.change_feed", fact.change_feed) if fact.change_feed is not None
              else ("fact.events.path", fact.events.path)]  # type: ignore[union-attr]
    inputs += [(f"dimensions.{d.name}.table", d.table) for d in dims]
    check_disjoint_paths(file, owned, inputs)  # type: ignore[arg-type]
    if fact.events is not None and fact.events.archive_dir is not None:
        _check_archive(file, fact.events.archive_dir, inputs + owned)  # type: ignore[arg-type]
    runtime = parse_runtime(r)
    cfg = EnrichConfig(
        file=file, name=name,
        description=r.str("description", default="") or "",
        owner=r.str("owner", default="data-engineering") or "data-engineering",
        tags=r.names("tags", default=()) or (),
        schedule=parse_schedule(r),
        start_date=str(r.raw.get("start_date", "2026-01-01")),
        retries=r.int("retries", default=2, minimum=0) or 0,
        trigger=r.choice("trigger", TRIGGERS, default="available_now"),  # type: ignore[arg-type]
        fact=fact, dimensions=dims, event_time=event_time, late_wait=late_wait, outputs=outputs,
        lake_root=root,  # type: ignore[arg-type]
        checkpoint_path=checkpoint,  # type: ignore[arg-type]
        runs_path=storage.path("runs", default=root / "_runs"),  # type: ignore[arg-type, operator]
        maintenance=parse_maintenance(r),
        **runtime,
    )
    from cdc_lake.enrich.validate import check_config

    check_config(cfg)  # names vs names and the events schema; table schemas: enrich.preflight
    return cfg
