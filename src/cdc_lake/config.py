"""Pipeline configuration: one YAML file -> one frozen, validated :class:`PipelineConfig`.

Validated once, up front. Every problem raises :class:`ConfigError` naming the file, the dotted
key, the bad value and what to change, so spark-submit exits non-zero before any Spark work and
the Airflow DAG factory turns the same message into a DAG import error.

Example::

    cfg = load_pipeline("pipelines/shop_maxwell.yaml")
    cfg.tables["orders"].keys        # ('id',)
    cfg.table_path("orders")         # PosixPath('/abs/data/lake/shop_maxwell/orders')

Relative paths are resolved against the YAML file's directory; ``${VAR}`` and ``${VAR:-default}``
are expanded from the environment first, so one file serves laptops and clusters.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import yaml

from cdc_lake.locks import LockSettings, parse_lock_settings
from cdc_lake.quarantine_limits import QuarantineLimits, parse_quarantine_limits

KINDS = ("cdc", "enrich", "dimension")
FORMATS = ("debezium", "maxwell", "canal")
TRIGGERS = ("available_now", "once")
ENGINES = ("auto", "deltalake", "delta-spark")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_DURATION_RE = re.compile(r"^(\d+)\s*([smhd])$")
# Spark SQL type names accepted in `types:`; checked here so a typo fails before Spark starts.
_TYPE_RE = re.compile(
    r"^(string|boolean|tinyint|smallint|int|integer|bigint|float|double|date|timestamp|binary"
    r"|decimal\(\s*\d{1,2}\s*,\s*\d{1,2}\s*\))$",
    re.IGNORECASE,
)
DEFAULT_DELTA_PACKAGES = "io.delta:delta-spark_2.13:4.4.1"


# JVM options of the driver, read by spark-submit's launcher before the driver JVM starts, so they
# go on the spark-submit command line (the operator) or into the builder of a bare `python` run.
# A scheduled run is short: the C2 JIT compiler does not pay back within it and competes with the
# tasks for the cores (local mode runs the tasks in the driver JVM). Measured on 2 cores
# (docs/benchmarks.md): small increment 17.1 s -> 12.7 s, 200k-event batch 24.1 s -> 25.6 s.
# ``defaultJavaOptions`` is prepended to ``extraJavaOptions``; a pipeline that runs big batches
# sets ``spark.driver.defaultJavaOptions: ""`` in its spark conf.
LAUNCH_CONF = {"spark.driver.defaultJavaOptions": "-XX:TieredStopAtLevel=1"}


class ConfigError(ValueError):
    """A pipeline config problem, located by file and dotted key."""

    def __init__(self, file: str | os.PathLike[str], key: str, message: str) -> None:
        self.file = str(file)
        self.key = key
        self.message = message
        super().__init__(f"{self.file}: {key}: {message}" if key else f"{self.file}: {message}")


@dataclass(frozen=True)
class TableConfig:
    """One replicated source table and its Delta target."""

    name: str
    source_table: str
    database: str | None
    keys: tuple[str, ...]
    columns: tuple[str, ...] | None
    exclude_columns: tuple[str, ...]
    types: dict[str, str]
    scd: Literal[1, 2]
    path: Path


@dataclass(frozen=True)
class DeltaSparkSettings:
    packages: str
    repositories: str | None
    jars_dir: Path | None


@dataclass(frozen=True)
class CaptureConfig:
    """``capture:`` — the pipeline lands its own source: MariaDB/MySQL row binlog → Maxwell JSON.

    The DAG becomes ``capture >> ingest``; the capture task runs
    ``python -m cdc_lake.capture.mariadb_maxwell --until-now`` with the host, port, login and
    password of the Airflow connection ``conn_id`` (or ``CDC_CAPTURE_*`` environment variables
    when run outside Airflow), writing into ``source.path``.
    """

    type: Literal["mariadb"]
    conn_id: str
    databases: tuple[str, ...]
    tables: tuple[str, ...]
    server_id: int | None
    start: str
    state_path: Path | None


@dataclass(frozen=True)
class Schedule:
    kind: Literal["none", "cron", "interval", "assets", "assets_or_time"]
    cron: str | None = None
    interval: timedelta | None = None
    assets: tuple[str, ...] = ()


@dataclass(frozen=True)
class PipelineConfig:
    """Everything one pipeline run needs; built only by :func:`load_pipeline`."""

    file: Path
    name: str
    description: str
    owner: str
    tags: tuple[str, ...]
    schedule: Schedule
    start_date: str
    retries: int
    source_format: Literal["debezium", "maxwell", "canal"]
    landing_path: Path
    source_database: str | None
    file_glob: str | None
    max_files_per_trigger: int
    max_bytes_per_trigger: int | None
    trigger: Literal["available_now", "once"]
    lake_root: Path
    checkpoint_path: Path
    quarantine_path: Path
    ddl_log_path: Path
    runs_path: Path
    engine: Literal["auto", "deltalake", "delta-spark"]
    delta_spark: DeltaSparkSettings
    spark_conf: dict[str, str]
    spark_conn_id: str
    infer_temporal: bool
    tables: dict[str, TableConfig]
    ignore_tables: tuple[str, ...] = field(default=())
    kind: Literal["cdc"] = "cdc"
    capture: CaptureConfig | None = None
    lock: LockSettings = field(default_factory=LockSettings)  # ``lock:`` (cdc_lake.locks)
    # ``quarantine:`` per-run threshold (cdc_lake.quarantine_limits); default: none
    quarantine_limits: QuarantineLimits = field(default_factory=QuarantineLimits)
    maintenance: Any = None  # ``maintenance:`` -> cdc_lake.maintenance.MaintenanceSettings, or None

    def table_path(self, table: str) -> Path:
        return self.tables[table].path

    def tombstone_path(self, table: str) -> Path:
        """Side table of deleted keys (SCD1), so late events never resurrect a delete."""
        return self.lake_root / "_tombstones" / table

    @property
    def roots(self) -> tuple[Path, ...]:
        """Folders this pipeline may read or write; params must stay inside them."""
        return (self.landing_path, self.lake_root, self.checkpoint_path.parent)


def _text(value: str, file: Path, key: str) -> str:
    """``value`` as encodable text: YAML's ``"\\ud800\\udc00"`` escapes stay two surrogates in
    PyYAML; a pair is joined into its character, a lone surrogate is a :class:`ConfigError`."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        pass
    try:
        joined = value.encode("utf-16", "surrogatepass").decode("utf-16")
        joined.encode("utf-8")
        return joined
    except UnicodeError:
        raise ConfigError(file, key, f"{value!r} holds a lone UTF-16 surrogate escape (e.g. \\ud800 "
                          "without its pair); write the character itself") from None


def _expand_env(value: Any, file: Path, key: str) -> Any:
    if isinstance(value, str):
        def repl(m: re.Match[str]) -> str:
            var, default = m.group(1), m.group(2)
            if var in os.environ:
                return os.environ[var]
            if default is not None:
                return default
            raise ConfigError(file, key, f"environment variable ${{{var}}} is not set "
                              f"(set it or write ${{{var}:-default}})")
        return _text(_ENV_RE.sub(repl, value), file, key)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            printable = k.encode("utf-8", "backslashreplace").decode() if isinstance(k, str) else k
            sub = f"{key}.{printable}" if key else str(printable)
            out[_text(k, file, sub) if isinstance(k, str) else k] = _expand_env(v, file, sub)
        return out
    if isinstance(value, list):
        return [_expand_env(v, file, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


class _Reader:
    """Typed accessors over the raw mapping; each error names file and dotted key."""

    def __init__(self, file: Path, raw: dict[str, Any], prefix: str = "") -> None:
        self.file, self.raw, self.prefix = file, raw, prefix

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str, message: str) -> ConfigError:
        return ConfigError(self.file, self.key(name), message)

    def check_known(self, allowed: set[str]) -> None:
        for k in self.raw:
            if k not in allowed:
                raise self.fail(str(k), f"unknown key {k!r}; allowed: {', '.join(sorted(allowed))}")

    def section(self, name: str, required: bool = False) -> _Reader:
        v = self.raw.get(name)
        if v is None:
            if required:
                raise self.fail(name, "is required")
            v = {}
        if not isinstance(v, dict):
            raise self.fail(name, f"expected a mapping, got {v!r}")
        return _Reader(self.file, v, self.key(name))

    def str(self, name: str, default: str | None = None, required: bool = False) -> str | None:
        if self.raw.get(name) is None:
            if required:
                raise self.fail(name, "is required")
            return default
        v = self.raw[name]
        if not isinstance(v, str) or not v.strip():
            raise self.fail(name, f"expected a non-empty string, got {v!r}")
        return v

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        v = self.raw.get(name, default)
        if v not in choices:
            raise self.fail(name, f"unknown value {v!r}; expected one of: {', '.join(choices)}")
        return v

    def int(self, name: str, default: int | None, minimum: int = 1) -> int | None:
        v = self.raw.get(name, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.fail(name, f"expected an integer >= {minimum}, got {v!r}")
        return v

    def bool(self, name: str, default: bool) -> bool:
        v = self.raw.get(name, default)
        if not isinstance(v, bool):
            raise self.fail(name, f"expected true or false, got {v!r}")
        return v

    def names(self, name: str, default: tuple[str, ...] | None = None,
              non_empty: bool = False) -> tuple[str, ...] | None:
        v = self.raw.get(name)
        if v is None:
            return default
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise self.fail(name, f"expected a list of names, got {v!r}")
        if non_empty and not v:
            raise self.fail(name, "must not be empty")
        if len(set(v)) != len(v):
            raise self.fail(name, f"has duplicates: {v!r}")
        return tuple(v)

    def path(self, name: str, default: Path | None = None, required: bool = False) -> Path | None:
        v = self.str(name, required=required)
        if v is None:
            return default
        p = Path(v).expanduser()
        return (p if p.is_absolute() else (self.file.parent / p)).resolve()


def _parse_schedule(r: _Reader) -> Schedule:
    v = r.raw.get("schedule")
    if v is None:
        return Schedule("none")
    if isinstance(v, str):
        if v.startswith("@") or len(v.split()) in (5, 6):
            return Schedule("cron", cron=v)
        raise r.fail("schedule", f"{v!r} is not a cron expression or preset like '@hourly'")
    if isinstance(v, dict) and set(v) == {"cron"}:
        return _parse_schedule(_Reader(r.file, {**r.raw, "schedule": v["cron"]}, r.prefix))
    if isinstance(v, dict) and "assets" in v and len(v) == 2 and set(v) - {"assets"} <= {"every", "cron"}:
        # both: run when the Assets update AND on time (Airflow AssetOrTimeSchedule)
        assets = _parse_schedule(_Reader(r.file, {**r.raw, "schedule": {"assets": v["assets"]}}, r.prefix))
        time_key = next(iter(set(v) - {"assets"}))
        timed = _parse_schedule(_Reader(r.file, {**r.raw, "schedule": {time_key: v[time_key]}}, r.prefix))
        return Schedule("assets_or_time", cron=timed.cron, interval=timed.interval, assets=assets.assets)
    if isinstance(v, dict) and set(v) == {"every"}:
        m = _DURATION_RE.match(str(v["every"]).strip())
        if not m:
            raise r.fail("schedule.every", f"expected a duration like '30m', '2h', '1d', got {v['every']!r}")
        n, unit = int(m.group(1)), m.group(2)
        return Schedule("interval", interval=timedelta(**{
            {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[unit]: n}))
    if isinstance(v, dict) and set(v) == {"assets"}:
        assets = v["assets"]
        if not isinstance(assets, list) or not assets or not all(isinstance(a, str) for a in assets):
            raise r.fail("schedule.assets", f"expected a non-empty list of asset URIs, got {assets!r}")
        return Schedule("assets", assets=tuple(assets))
    raise r.fail("schedule", f"expected a cron string, {{cron: ...}}, {{every: 30m}}, {{assets: [...]}} "
                 f"or assets plus every/cron (both), got {v!r}")


def _parse_table(r: _Reader, name: str, source_format: str, default_db: str | None,
                 lake_root: Path) -> TableConfig:
    if not NAME_RE.match(name):
        raise ConfigError(r.file, r.prefix, f"table name {name!r} must match {NAME_RE.pattern}")
    r.check_known({"source_table", "database", "keys", "columns", "exclude_columns", "types",
                   "scd", "path"})
    keys = r.names("keys", default=(), non_empty=True) or ()
    if not keys and source_format == "debezium":
        raise r.fail("keys", "is required for debezium: its JSON envelope carries no primary-key "
                     "names (set e.g. keys: [id])")
    columns = r.names("columns")
    exclude = r.names("exclude_columns", default=()) or ()
    if columns is not None:
        missing = [k for k in keys if k not in columns]
        if missing:
            raise r.fail("columns", f"must include the key columns {missing!r}")
    if any(k in exclude for k in keys):
        raise r.fail("exclude_columns", f"cannot exclude key columns {keys!r}")
    types_raw = r.raw.get("types") or {}
    if not isinstance(types_raw, dict):
        raise r.fail("types", f"expected a mapping column -> Spark type, got {types_raw!r}")
    types: dict[str, str] = {}
    for col, t in types_raw.items():
        if not isinstance(t, str) or not _TYPE_RE.match(t.strip()):
            raise r.fail(f"types.{col}", f"unsupported type {t!r}; use a Spark SQL type such as "
                         "bigint, string, decimal(10,2), date, timestamp")
        types[str(col)] = t.strip().lower().replace(" ", "")
    scd = r.raw.get("scd", 1)
    if scd not in (1, 2):
        raise r.fail("scd", f"expected 1 or 2, got {scd!r}")
    return TableConfig(
        name=name,
        source_table=r.str("source_table", default=name) or name,
        database=r.str("database", default=default_db),
        keys=keys,
        columns=columns,
        exclude_columns=exclude,
        types=types,
        scd=scd,
        path=r.path("path", default=lake_root / name) or lake_root / name,
    )


def load_pipeline(path: str | os.PathLike[str]) -> Any:
    """Load and validate one pipeline YAML file of any kind (top-level ``kind:``, default ``cdc``).

    Returns the kind's frozen config: :class:`PipelineConfig` for ``cdc``, the enrichment and
    dimension-refresh configs of :mod:`cdc_lake.enrich.config` / :mod:`cdc_lake.dimensions.config`
    for the others. Every kind's config has ``kind``, ``name``, ``file``, ``description``,
    ``owner``, ``tags``, ``schedule``, ``start_date``, ``retries`` and ``spark_conn_id``.

    Raises:
        ConfigError: the file is missing, not YAML, or a key is missing/unknown/invalid.
    """
    file, raw = read_yaml(path)
    kind = raw.get("kind", "cdc")
    if kind == "enrich":
        from cdc_lake.enrich.config import load_enrich_pipeline
        return load_enrich_pipeline(file, raw)
    if kind == "dimension":
        from cdc_lake.dimensions.config import load_dimension_pipeline
        return load_dimension_pipeline(file, raw)
    if kind != "cdc":
        raise ConfigError(file, "kind", f"unknown value {kind!r}; expected one of: {', '.join(KINDS)}")
    return load_cdc_pipeline(file, raw)


def read_yaml(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """The resolved file and its top-level mapping, ``${VAR}`` already expanded.

    Raises:
        ConfigError: the file is missing, not YAML, or not a mapping.
    """
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ConfigError(file, "", "pipeline config file not found")
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(file, "", f"not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(file, "", f"expected a mapping at top level, got {type(raw).__name__}")
    return file, _expand_env(raw, file, "")


def load_cdc_pipeline(file: Path, raw: dict[str, Any]) -> PipelineConfig:
    """Validate the mapping of a ``kind: cdc`` pipeline YAML (see :func:`load_pipeline`)."""
    r = _Reader(file, raw)
    r.check_known({"kind", "pipeline", "description", "owner", "tags", "schedule", "start_date", "retries",
                   "source", "trigger", "storage", "engine", "spark", "tables", "ignore_tables",
                   "infer_temporal", "capture", "lock", "maintenance", "quarantine"})
    name = r.str("pipeline", required=True) or ""  # required=True raised if missing
    if not NAME_RE.match(name):
        raise r.fail("pipeline", f"{name!r} must match {NAME_RE.pattern} (it becomes the DAG id)")

    src = r.section("source", required=True)
    src.check_known({"format", "path", "database", "glob", "max_files_per_trigger",
                     "max_bytes_per_trigger"})
    fmt = src.choice("format", FORMATS, default="")
    landing = src.path("path", required=True)
    storage = r.section("storage", required=True)
    storage.check_known({"root", "checkpoint", "quarantine", "ddl_log", "runs"})
    root = storage.path("root", required=True)
    if landing is None or root is None:  # unreachable: required=True raised; narrows the types
        raise r.fail("storage.root", "is required")

    runtime = parse_runtime(r)

    tables_raw = r.raw.get("tables")
    if not isinstance(tables_raw, dict) or not tables_raw:
        raise r.fail("tables", "expected a non-empty mapping of table name -> settings")
    source_db = src.str("database")
    tables: dict[str, TableConfig] = {}
    seen_sources: dict[tuple[str | None, str], str] = {}
    for tname, traw in tables_raw.items():
        tr = _Reader(file, traw or {}, f"tables.{tname}")
        if traw is not None and not isinstance(traw, dict):
            raise tr.fail("", f"expected a mapping, got {traw!r}")
        t = _parse_table(tr, str(tname), fmt, source_db, root)
        ident = (t.database, t.source_table)
        if ident in seen_sources:
            raise tr.fail("source_table", f"{t.database}.{t.source_table} is already replicated by "
                          f"tables.{seen_sources[ident]}")
        seen_sources[ident] = t.name
        tables[t.name] = t
    paths = [t.path for t in tables.values()]
    if len(set(paths)) != len(paths):
        raise r.fail("tables", "two tables share one target path")

    max_files = src.int("max_files_per_trigger", default=1000) or 1000
    return PipelineConfig(
        file=file,
        name=name,
        description=r.str("description", default="") or "",
        owner=r.str("owner", default="data-engineering") or "data-engineering",
        tags=r.names("tags", default=()) or (),
        schedule=_parse_schedule(r),
        start_date=str(r.raw.get("start_date", "2026-01-01")),
        retries=r.int("retries", default=2, minimum=0) or 0,
        source_format=fmt,  # type: ignore[arg-type]
        landing_path=landing,
        source_database=source_db,
        file_glob=src.str("glob"),
        max_files_per_trigger=max_files,
        max_bytes_per_trigger=src.int("max_bytes_per_trigger", default=None),
        trigger=r.choice("trigger", TRIGGERS, default="available_now"),  # type: ignore[arg-type]
        lake_root=root,
        checkpoint_path=storage.path("checkpoint", default=root / "_checkpoints" / name),  # type: ignore[arg-type]
        quarantine_path=storage.path("quarantine", default=root / "_quarantine"),  # type: ignore[arg-type]
        ddl_log_path=storage.path("ddl_log", default=root / "_ddl_log"),  # type: ignore[arg-type]
        runs_path=storage.path("runs", default=root / "_runs"),  # type: ignore[arg-type]
        **runtime,
        infer_temporal=r.bool("infer_temporal", default=True),
        tables=tables,
        ignore_tables=r.names("ignore_tables", default=()) or (),
        capture=_parse_capture(r, fmt, source_db, tables),
        quarantine_limits=parse_quarantine_limits(r),
        maintenance=_parse_maintenance(r),
    )


_START_RE = re.compile(r"^(earliest|current|[A-Za-z0-9_.-]+:\d+)$")


def parse_runtime(r: _Reader) -> dict[str, Any]:
    """The sections every pipeline kind shares, as keyword arguments of its config dataclass:
    ``engine:`` (``name``, ``delta_spark``), ``spark:`` (``conf``, ``conn_id``) and ``lock:``.

    Example::

        return EnrichConfig(file=file, name=name, ..., **parse_runtime(r))
    """
    eng = r.section("engine")
    eng.check_known({"name", "delta_spark"})
    ds = eng.section("delta_spark")
    ds.check_known({"packages", "repositories", "jars_dir"})
    spark = r.section("spark")
    spark.check_known({"conf", "conn_id"})
    spark_conf = spark.raw.get("conf") or {}
    if not isinstance(spark_conf, dict):
        raise spark.fail("conf", f"expected a mapping of Spark conf keys to values, got {spark_conf!r}")
    return {
        "engine": eng.choice("name", ENGINES, default="auto"),
        "delta_spark": DeltaSparkSettings(
            packages=ds.str("packages", default=DEFAULT_DELTA_PACKAGES) or DEFAULT_DELTA_PACKAGES,
            repositories=ds.str("repositories"), jars_dir=ds.path("jars_dir")),
        "spark_conf": {str(k): str(v) for k, v in spark_conf.items()},
        "spark_conn_id": spark.str("conn_id", default="spark_default") or "spark_default",
        "lock": parse_lock_settings(r),
    }


def _parse_maintenance(r: _Reader) -> Any:
    """``maintenance:`` (absent: no maintenance DAG); see :mod:`cdc_lake.maintenance`."""
    if "maintenance" not in r.raw:
        return None
    from cdc_lake.maintenance import MaintenanceSettings

    return MaintenanceSettings.parse(r.section("maintenance"))


def _parse_capture(r: _Reader, fmt: str, source_db: str | None,
                   tables: dict[str, TableConfig]) -> CaptureConfig | None:
    if r.raw.get("capture") is None:
        return None
    c = r.section("capture")
    c.check_known({"type", "conn_id", "databases", "tables", "server_id", "start", "state"})
    if fmt != "maxwell":
        raise c.fail("type", f"the capture module lands Maxwell JSON; set source.format: maxwell "
                     f"(got {fmt!r})")
    dbs = c.names("databases", default=None)
    if not dbs:
        found = sorted({t.database for t in tables.values() if t.database} |
                       ({source_db} if source_db else set()))
        if not found:
            raise c.fail("databases", "name the schemas to capture (or set source.database)")
        dbs = tuple(found)
    start = c.str("start", default="earliest") or "earliest"
    if not _START_RE.match(start):
        raise c.fail("start", f"{start!r}: use earliest, current or BINLOG_FILE:POS")
    return CaptureConfig(
        type=c.choice("type", ("mariadb",), default="mariadb"),  # type: ignore[arg-type]
        conn_id=c.str("conn_id", default="cdc_mariadb") or "cdc_mariadb",
        databases=dbs,
        tables=c.names("tables", default=()) or (),
        server_id=c.int("server_id", default=None),
        start=start,
        state_path=c.path("state"),
    )


def load_all(directory: str | os.PathLike[str]) -> tuple[list[Any], list[ConfigError]]:
    """Load every ``*.yaml``/``*.yml`` in a folder (any kind); broken files are returned, not skipped silently."""
    ok: list[Any] = []
    bad: list[ConfigError] = []
    files = sorted([*Path(directory).glob("*.yaml"), *Path(directory).glob("*.yml")])
    for f in files:
        try:
            ok.append(load_pipeline(f))
        except ConfigError as e:
            bad.append(e)
    names: dict[str, Path] = {}
    for cfg in list(ok):
        if cfg.name in names:
            bad.append(ConfigError(cfg.file, "pipeline", f"duplicate pipeline name {cfg.name!r} "
                                   f"(also in {names[cfg.name]})"))
            ok.remove(cfg)
        else:
            names[cfg.name] = cfg.file
    return ok, bad


# Shared building blocks for the other kinds' config modules (cdc_lake.enrich.config, ...), so
# every kind validates the same way and its errors name file, dotted key, value and fix.
Reader = _Reader
expand_env = _expand_env
parse_schedule = _parse_schedule
