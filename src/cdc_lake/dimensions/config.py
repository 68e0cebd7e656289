"""``kind: dimension`` pipeline YAML -> one frozen, validated :class:`DimensionPipelineConfig`.

Same rules as the other kinds (:mod:`cdc_lake.config`): relative paths resolve against the
YAML's folder, ``${VAR}`` expands, every problem raises :class:`ConfigError` naming file,
dotted key, value and fix. Example YAML::

    kind: dimension
    pipeline: product_categories
    schedule: {cron: "0 2 * * *"}        # or "0 2 * * *", "@daily", {every: 1d}
    snapshots: {path: ../data/snapshots/product_categories, format: csv, pattern: "{date}.csv"}
    keys: [product_id]
    scd: 1                               # or 2
    schema: {product_id: int, category: string}   # optional; recommended for CSV
    table: ../lake/dims/product_categories
    # maintenance: {schedule: "@weekly"}  # optional: <pipeline>__maintenance DAG (cdc_lake.maintenance)
    # storage: {state: <table parent>/_checkpoints/<pipeline>, runs: <table parent>/_runs}

Python::

    cfg = load_pipeline("pipelines/product_categories.yaml")
    cfg.snapshot_file("2026-01-02")      # PosixPath('/abs/data/snapshots/product_categories/2026-01-02.csv')
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cdc_lake.config import (NAME_RE, ConfigError, DeltaSparkSettings, Reader, Schedule,
                             parse_maintenance, parse_runtime, parse_schedule, spark_type,
                             split_type_hint)
from cdc_lake.locks import LockSettings

SNAPSHOT_FORMATS = ("csv", "parquet")
DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# Columns the refresh job adds to the dimension table.
SCD1_META = ("_snapshot_date",)
SCD2_META = ("_valid_from", "_valid_to", "_is_current")


@dataclass(frozen=True)
class SnapshotSource:
    """``snapshots:`` — one full snapshot file per day: ``<path>/<pattern with {date}>``."""

    path: Path
    format: Literal["csv", "parquet"]
    pattern: str
    header: bool = True
    delimiter: str = ","
    # refuse a snapshot that would delete (SCD2: close without a new version) more than this
    # fraction of the table's current rows: a truncated export would otherwise empty the table
    max_deleted_fraction: float | None = None


@dataclass(frozen=True)
class DimensionPipelineConfig:
    """Everything one dimension refresh needs; built only by :func:`load_dimension_pipeline`."""

    file: Path
    name: str
    description: str
    owner: str
    tags: tuple[str, ...]
    schedule: Schedule
    start_date: str
    retries: int
    snapshots: SnapshotSource
    keys: tuple[str, ...]
    scd: Literal[1, 2]
    schema: dict[str, str] | None
    table: Path
    checkpoint_path: Path  # the state folder: lock file + last_applied.json
    runs_path: Path
    engine: Literal["auto", "deltalake", "delta-spark"]
    delta_spark: DeltaSparkSettings
    spark_conf: dict[str, str]
    spark_conn_id: str
    trigger: str = "batch"  # a plain batch job (no stream); kept for the shared config shape
    kind: Literal["dimension"] = "dimension"
    lock: LockSettings = field(default_factory=LockSettings)
    maintenance: Any = None  # MaintenanceSettings: ``maintenance:`` (absent: no maintenance DAG)

    @property
    def app_id(self) -> str:
        """Delta transaction app id of this pipeline's writes; the version is the date as yyyymmdd."""
        return f"dimension-{self.name}"

    def snapshot_file(self, date: str) -> Path:
        """The snapshot file of ``date`` (``YYYY-MM-DD``)."""
        return self.snapshots.path / self.snapshots.pattern.format(date=date)

    @property
    def output_tables(self) -> dict[str, Path]:
        return {"table": self.table}


def load_dimension_pipeline(file: Path, raw: dict[str, Any]) -> DimensionPipelineConfig:
    """Validate the mapping of a ``kind: dimension`` YAML (called by ``cdc_lake.config.load_pipeline``)."""
    r = Reader(file, raw)
    r.check_known({"kind", "pipeline", "description", "owner", "tags", "schedule", "start_date",
                   "retries", "snapshots", "keys", "scd", "schema", "table", "storage", "engine",
                   "spark", "lock", "maintenance"})
    name = r.str("pipeline", required=True) or ""
    if not NAME_RE.match(name):
        raise r.fail("pipeline", f"{name!r} must match {NAME_RE.pattern} (it becomes the DAG id)")
    snaps = _snapshots(r)
    keys = r.names("keys", non_empty=True)
    if not keys:
        raise r.fail("keys", "is required: the dimension's key columns, e.g. keys: [product_id]")
    scd = r.scd()
    schema = _schema(r, keys, scd)
    table = r.path("table", required=True)
    storage = r.section("storage")
    storage.check_known({"state", "checkpoint", "runs"})
    base = table.parent  # type: ignore[union-attr]
    state = storage.path("state") or storage.path("checkpoint") or base / "_checkpoints" / name
    runtime = parse_runtime(r)
    return DimensionPipelineConfig(
        file=file,
        name=name,
        description=r.str("description", default="") or "",
        owner=r.str("owner", default="data-engineering") or "data-engineering",
        tags=r.names("tags", default=()) or (),
        schedule=_schedule(r),
        start_date=str(r.raw.get("start_date", "2026-01-01")),
        retries=r.int("retries", default=2, minimum=0) or 0,
        snapshots=snaps,
        keys=keys,
        scd=scd,
        schema=schema,
        table=table,  # type: ignore[arg-type]
        checkpoint_path=state,
        runs_path=storage.path("runs", default=base / "_runs"),  # type: ignore[arg-type]
        maintenance=parse_maintenance(r),
        **runtime,
    )


def _schedule(r: Reader) -> Schedule:
    """Like the other kinds, plus ``{cron: "0 2 * * *"}``; asset schedules make no sense here
    (the snapshot date comes from the run's logical date)."""
    v = r.raw.get("schedule")
    if isinstance(v, dict) and set(v) == {"cron"}:
        r = Reader(r.file, {**r.raw, "schedule": v["cron"]}, r.prefix)
    s = parse_schedule(r)
    if s.kind == "assets":
        raise r.fail("schedule", "a dimension refresh takes its snapshot date from the run's logical "
                     "date; use a daily cron like {cron: \"0 2 * * *\"} or '@daily', not assets")
    return s


def _snapshots(r: Reader) -> SnapshotSource:
    s = r.section("snapshots", required=True)
    s.check_known({"path", "format", "pattern", "header", "delimiter", "max_deleted_fraction"})
    fmt = s.choice("format", SNAPSHOT_FORMATS, default="csv")
    pattern = s.str("pattern", default="{date}." + fmt) or ""
    rest = pattern.replace("{date}", "", 1)
    if "{date}" not in pattern or "{" in rest or "}" in rest or "/" in pattern or "\\" in pattern:
        raise s.fail("pattern", f"{pattern!r} must contain {{date}} exactly once and no other "
                     "brace, placeholder, folder or backslash, e.g. \"{date}.csv\" (date = YYYY-MM-DD)")
    if pattern[:1] in ("_", "."):
        raise s.fail("pattern", f"{pattern!r}: Spark skips files whose name starts with '_' or '.' "
                     "(hidden files) and would find no snapshot; use a name that starts otherwise")
    delimiter = s.raw.get("delimiter")  # raw: a tab or space is a delimiter (tester)
    delimiter = "," if delimiter is None else delimiter
    if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '"\r\n':
        raise s.fail("delimiter", f"expected one character other than a quote or line break, "
                     f"got {delimiter!r} (a tab: \"\\t\")")
    frac = s.raw.get("max_deleted_fraction")
    if isinstance(frac, str) and re.fullmatch(r"\s*(0|0?\.\d+|1(\.0*)?)\s*", frac):
        frac = float(frac)  # ${MAX_DELETED:-0.2} expands to text
    if frac is not None and (isinstance(frac, bool) or not isinstance(frac, (int, float))
                             or not 0 <= frac <= 1):
        raise s.fail("max_deleted_fraction", "expected a number from 0 to 1, e.g. 0.2 (a snapshot "
                     f"deleting more than that share of the current rows is refused), got {frac!r}")
    return SnapshotSource(path=s.folder("path", required=True), format=fmt,  # type: ignore[arg-type]
                          pattern=pattern, header=s.bool("header", default=True), delimiter=delimiter,
                          max_deleted_fraction=None if frac is None else float(frac))


def _schema(r: Reader, keys: tuple[str, ...], scd: int) -> dict[str, str] | None:
    raw = r.raw.get("schema")
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise r.fail("schema", f"expected a mapping column -> Spark type, got {raw!r}")
    out: dict[str, str] = {}
    for col, t in raw.items():
        spark_t = spark_type(t)
        if spark_t is None:
            raise r.fail(f"schema.{col}", f"unsupported type {t!r}; use a Spark SQL type such as "
                         "int, bigint, string, decimal(10,2), date, timestamp" + split_type_hint(col, t))
        out[str(col)] = spark_t
    missing = [k for k in keys if k not in out]
    if missing:
        raise r.fail("schema", f"must include the key columns {missing}")
    reserved = [c for c in out if c.lower() in SCD1_META + SCD2_META]
    if reserved:
        raise r.fail("schema", f"{reserved} are columns the refresh job maintains; rename them")
    return out


def parse_date(value: str, what: str = "--date") -> str:
    """``YYYY-MM-DD`` checked to be a real date; raises ConfigError naming ``what``."""
    from datetime import date

    if not DATE_RE.match(value or ""):
        raise ConfigError(what, "", f"expected a date YYYY-MM-DD, got {value!r}")
    try:
        date.fromisoformat(value)
    except ValueError as e:
        raise ConfigError(what, "", f"{value!r} is not a calendar date ({e})") from None
    return value
