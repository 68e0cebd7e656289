"""Pipeline configuration shared by every job kind: one YAML file -> one frozen, validated config.

``load_pipeline(path)`` reads the YAML, expands ``${VAR}`` / ``${VAR:-default}`` from the
environment, and hands the mapping to its kind (``kind:``; default ``cdc``):
:mod:`cdc_lake.cdc.config`, :mod:`cdc_lake.enrich.config`, :mod:`cdc_lake.dimensions.config`.
They share what is here: :class:`ConfigError` (file, dotted key, value, fix), the typed
:class:`Reader`, schedules, the ``engine:``/``spark:``/``lock:`` sections (:func:`parse_runtime`).
The driver's launch options per backlog are :mod:`cdc_lake.launch`. Validated once, up front, so
spark-submit exits non-zero before any Spark work and the Airflow DAG factory turns the same
message into a DAG import error.

Example::

    cfg = load_pipeline("pipelines/shop_maxwell.yaml")   # a cdc_lake.cdc.config.PipelineConfig
    cfg.tables["orders"].keys        # ('id',)
    cfg.table_path("orders")         # PosixPath('/abs/data/lake/shop_maxwell/orders')

Relative paths are resolved against the YAML file's directory, so one file serves laptops and
clusters.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import yaml

from cdc_lake.locks import parse_lock_settings
from cdc_lake.yaml_text import UniqueKeyLoader, yaml_error_message

KINDS = ("cdc", "enrich", "dimension")
TRIGGERS = ("available_now", "once")
ENGINES = ("auto", "deltalake", "delta-spark")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_DURATION_RE = re.compile(r"^(\d+)\s*([smhd])$")
# Spark SQL type names accepted in `types:`; checked here so a typo fails before Spark starts.
TYPE_RE = re.compile(
    r"^(string|boolean|tinyint|smallint|int|integer|bigint|float|double|date|timestamp|binary"
    r"|decimal\(\s*\d{1,2}\s*,\s*\d{1,2}\s*\))$",
    re.IGNORECASE,
)
# Spark SQL's other names of those types (``types: {x: long}`` was refused: tester)
_TYPE_ALIASES = {"long": "bigint", "short": "smallint", "byte": "tinyint", "real": "float"}


def spark_type(t: object) -> str | None:
    """A ``types:`` / ``schema:`` value as the Spark SQL type name the job records, or None when
    it is not one of :data:`TYPE_RE` (or Spark's other names: ``long``, ``short``, ``byte``,
    ``real``, ``dec(p,s)`` / ``numeric(p,s)``).

    Example::

        spark_type("Long")            # 'bigint'
        spark_type("numeric(10, 2)")  # 'decimal(10,2)'
        spark_type("varchar")         # None
    """
    if not isinstance(t, str):
        return None
    name = t.strip().lower().replace(" ", "")
    name = _TYPE_ALIASES.get(name, name)
    name = re.sub(r"^(dec|numeric)(?=\()", "decimal", name)
    return name if TYPE_RE.match(name) else None


def split_type_hint(*parts: object) -> str:
    """A hint when YAML split a type at its comma (``{price: decimal(10,2)}`` in a flow mapping
    is ``price: 'decimal(10'`` and a key ``'2)'``: the comma separates entries there), else ''."""
    if any(isinstance(x, str) and (x.count("(") > x.count(")") or x.strip().endswith(")")
                                   and "(" not in x) for x in parts):
        return (" (YAML split a type at its comma: inside { } quote it, price: \"decimal(10,2)\", "
                "or write the mapping one entry per line)")
    return ""


DEFAULT_DELTA_PACKAGES = "io.delta:delta-spark_2.13:4.4.1"
# Spark's file source forgets (and then ignores) files whose mtime is older than the newest seen
# file minus maxFileAge (default 7 days): a late-landed file with an old mtime would be skipped
# silently — and an archive unpacked without timestamps gives mtime 0 (1970). A thousand years:
# never, for any real clock. Every file stream of the product sets it (CDC landing, enrichment
# events).
FILE_SOURCE_MAX_AGE = "365000d"


class ConfigError(ValueError):
    """A pipeline config problem, located by file and dotted key."""

    def __init__(self, file: str | os.PathLike[str], key: str, message: str) -> None:
        self.file = str(file)
        self.key = key
        self.message = message
        super().__init__(f"{self.file}: {key}: {message}" if key else f"{self.file}: {message}")


@dataclass(frozen=True)
class DeltaSparkSettings:
    packages: str
    repositories: str | None
    jars_dir: Path | None


@dataclass(frozen=True)
class Schedule:
    kind: Literal["none", "cron", "interval", "assets", "assets_or_time"]
    cron: str | None = None
    interval: timedelta | None = None
    assets: tuple[str, ...] = ()


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


def expand_env(value: Any, file: Path, key: str) -> Any:
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
            out[_text(k, file, sub) if isinstance(k, str) else k] = expand_env(v, file, sub)
        return out
    if isinstance(value, list):
        return [expand_env(v, file, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


class Reader:
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

    def section(self, name: str, required: bool = False) -> Reader:
        v = self.raw.get(name)
        if v is None:
            if required:
                raise self.fail(name, "is required")
            v = {}
        if not isinstance(v, dict):
            raise self.fail(name, f"expected a mapping, got {v!r}")
        return Reader(self.file, v, self.key(name))

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
        """An integer setting; a string of digits counts (``${N:-10}`` expands to text)."""
        v = self.raw.get(name, default)
        if v is None:
            return None
        given = v
        if isinstance(v, str) and re.fullmatch(r"\s*[+-]?\d{1,30}\s*", v):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.fail(name, f"expected an integer >= {minimum}, got {given!r}")
        return v

    def scd(self, name: str = "scd") -> int:
        """``scd: 1`` (latest row per key, the default) or ``2`` (history); text counts
        (``${SCD:-2}``)."""
        v = self.raw.get(name, 1)
        if isinstance(v, str) and v.strip() in ("1", "2"):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v not in (1, 2):
            raise self.fail(name, f"expected 1 or 2, got {v!r}")
        return v

    def bool(self, name: str, default: bool) -> bool:
        """A boolean setting; the text ``true``/``false`` counts (``${FLAG:-true}`` expands to text)."""
        v = self.raw.get(name, default)
        if isinstance(v, str) and v.strip().lower() in ("true", "false"):
            v = v.strip().lower() == "true"
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
            dups = sorted({x for x in v if v.count(x) > 1})
            raise self.fail(name, f"lists {', '.join(repr(x) for x in dups)} more than once "
                            "(each name once)")
        return tuple(v)

    def folder(self, name: str, required: bool = False) -> Path | None:
        """A folder Spark lists (landing files, snapshots): Spark's file source and readers take
        the path as a Hadoop glob pattern, so a folder named ``land[1]`` read nothing, or the
        folder ``land1`` instead, with exit 0 (tester). Such a name is refused."""
        p = self.path(name, required=required)
        hit = sorted({ch for ch in str(p or "") if ch in "*?[]{}\\"})
        if hit:
            raise self.fail(name, (
                f"{str(p)!r} holds {', '.join(repr(c) for c in hit)}: Spark reads this path as a "
                "glob pattern, so it would read another folder or none. Use a folder without "
                "these characters (a file filter belongs in its own setting)"))
        return p

    def path(self, name: str, default: Path | None = None, required: bool = False) -> Path | None:
        v = self.str(name, required=required)
        if v is None:
            return default
        if "\x00" in v:
            raise self.fail(name, f"a path cannot contain a NUL character, got {v!r}")
        p = Path(v).expanduser()
        return (p if p.is_absolute() else (self.file.parent / p)).resolve()


def parse_schedule(r: Reader) -> Schedule:
    v = r.raw.get("schedule")
    if v is None:
        return Schedule("none")
    if isinstance(v, str):
        if v.startswith("@") or len(v.split()) in (5, 6):
            return Schedule("cron", cron=v)
        raise r.fail("schedule", f"{v!r} is not a cron expression or preset like '@hourly'")
    if isinstance(v, dict) and set(v) == {"cron"}:
        return parse_schedule(Reader(r.file, {**r.raw, "schedule": v["cron"]}, r.prefix))
    if isinstance(v, dict) and "assets" in v and len(v) == 2 and set(v) - {"assets"} <= {"every", "cron"}:
        # both: run when the Assets update AND on time (Airflow AssetOrTimeSchedule)
        assets = parse_schedule(Reader(r.file, {**r.raw, "schedule": {"assets": v["assets"]}}, r.prefix))
        time_key = next(iter(set(v) - {"assets"}))
        timed = parse_schedule(Reader(r.file, {**r.raw, "schedule": {time_key: v[time_key]}}, r.prefix))
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
        from cdc_lake.enrich.config import load_enrich_pipeline as load
    elif kind == "dimension":
        from cdc_lake.dimensions.config import load_dimension_pipeline as load
    elif kind == "cdc":
        from cdc_lake.cdc.config import load_cdc_pipeline as load
    else:
        raise ConfigError(file, "kind", f"unknown value {kind!r}; expected one of: {', '.join(KINDS)}")
    cfg = load(file, raw)
    from cdc_lake.paths import check_path_escapes
    check_path_escapes(cfg)
    return cfg


def read_yaml(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """The resolved file and its top-level mapping, ``${VAR}`` already expanded.

    Raises:
        ConfigError: the file is missing, not YAML, or not a mapping.
    """
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ConfigError(file, "", "pipeline config file not found")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:  # a Latin-1 or binary file: a config error, not a crash of
        raise ConfigError(file, "", f"not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}); "
                          "save the YAML as UTF-8") from None  # every folder loader (tester)
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(file, "", yaml_error_message(text, e, _ENV_RE)) from None
    if not isinstance(raw, dict):
        raise ConfigError(file, "", f"expected a mapping at top level, got {type(raw).__name__}")
    return file, expand_env(raw, file, "")


def parse_runtime(r: Reader, spark_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The sections every pipeline kind shares, as keyword arguments of its config dataclass:
    ``engine:`` (``name``, ``delta_spark``), ``spark:`` (``conf``, ``conn_id``) and ``lock:``.
    ``spark_keys``: further ``spark:`` keys the kind reads itself.

    Example::

        return EnrichConfig(file=file, name=name, ..., **parse_runtime(r))
    """
    eng = r.section("engine")
    eng.check_known({"name", "delta_spark"})
    ds = eng.section("delta_spark")
    ds.check_known({"packages", "repositories", "jars_dir"})
    spark = r.section("spark")
    spark.check_known({"conf", "conn_id", *spark_keys})
    spark_conf = spark.raw.get("conf") or {}
    if not isinstance(spark_conf, dict):
        raise spark.fail("conf", f"expected a mapping of Spark conf keys to values, got {spark_conf!r}")
    tz = spark_conf.get("spark.sql.session.timeZone")
    if tz is not None and str(tz).strip().upper() not in ("UTC", "ETC/UTC"):
        # the job sets UTC on every session; another value here was dropped silently (tester)
        raise spark.fail("conf.spark.sql.session.timeZone", (
            f"is {tz!r}, but the tables' timestamps are UTC by contract and every job runs its "
            "Spark session in UTC; remove the setting (convert in the reading query instead)"))
    return {
        "engine": eng.choice("name", ENGINES, default="auto"),
        "delta_spark": DeltaSparkSettings(
            packages=ds.str("packages", default=DEFAULT_DELTA_PACKAGES) or DEFAULT_DELTA_PACKAGES,
            repositories=ds.str("repositories"), jars_dir=ds.path("jars_dir")),
        "spark_conf": {str(k): str(v) for k, v in spark_conf.items()},
        "spark_conn_id": spark.str("conn_id", default="spark_default") or "spark_default",
        "lock": parse_lock_settings(r),
    }


def parse_maintenance(r: Reader) -> Any:
    """``maintenance:`` (absent: no maintenance DAG); see :mod:`cdc_lake.maintenance`."""
    if "maintenance" not in r.raw:
        return None
    from cdc_lake.maintenance import MaintenanceSettings

    return MaintenanceSettings.parse(r.section("maintenance"))


def load_all(directory: str | os.PathLike[str]) -> tuple[list[Any], list[ConfigError]]:
    """Load every ``*.yaml``/``*.yml`` in a folder (any kind); broken files are returned, not skipped silently.
    Hidden files (a name starting with ``.``: an editor's backup or lock file, a YAML staged
    under a hidden name) are not pipelines: Airflow ignores them too (tester: a hidden copy
    unloaded the real pipeline as a duplicate name).

    Besides each file's own checks: two pipelines with one name, or whose written paths overlap
    (:func:`cdc_lake.paths.check_shared_paths`), are returned as errors, and none of them as a config.
    """
    ok: list[Any] = []
    bad: list[ConfigError] = []
    files = sorted(f for f in [*Path(directory).glob("*.yaml"), *Path(directory).glob("*.yml")]
                   if not f.name.startswith("."))
    for f in files:
        try:
            ok.append(load_pipeline(f))
        except ConfigError as e:
            bad.append(e)
    # One name in two files: both are refused (keeping the first by file order let a copied
    # YAML with the name left unchanged take over the DAG of the original).
    by_name: dict[str, list[Any]] = {}
    for cfg in ok:
        by_name.setdefault(cfg.name, []).append(cfg)
    for name, same in by_name.items():
        if len(same) > 1:
            for cfg in same:
                others = ", ".join(str(c.file) for c in same if c is not cfg)
                bad.append(ConfigError(cfg.file, "pipeline", (
                    f"duplicate pipeline name {name!r} (also in {others}): neither pipeline is "
                    "loaded; give each file its own pipeline name")))
                ok.remove(cfg)
    from cdc_lake.paths import check_shared_paths

    clashes = check_shared_paths(ok)
    bad.extend(clashes)
    refused = {e.file for e in clashes}
    return [c for c in ok if str(c.file) not in refused], bad
