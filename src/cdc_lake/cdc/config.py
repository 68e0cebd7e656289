"""The CDC kind's pipeline config: one YAML file -> one frozen, validated :class:`PipelineConfig`.

Loaded through :func:`cdc_lake.config.load_pipeline` (every kind; ``kind: cdc`` is the default),
with the rules all kinds share: every problem raises :class:`~cdc_lake.config.ConfigError`
naming the file, the dotted key, the bad value and what to change.

Example::

    from cdc_lake.config import load_pipeline

    cfg = load_pipeline("pipelines/shop_maxwell.yaml")
    cfg.tables["orders"].keys        # ('id',)
    cfg.table_path("orders")         # PosixPath('/abs/data/lake/shop_maxwell/orders')
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cdc_lake.config import (NAME_RE, TRIGGERS, ConfigError, DeltaSparkSettings, Reader, Schedule,
                             parse_maintenance, parse_runtime, parse_schedule, spark_type,
                             split_type_hint)
from cdc_lake.launch import FULL_JIT_FROM_MB, INTERPRETED_BELOW_MB
from cdc_lake.locks import LockSettings
from cdc_lake.paths import overlap
from cdc_lake.quarantine_limits import QuarantineLimits, parse_quarantine_limits

FORMATS = ("debezium", "maxwell", "canal")


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
    # ``spark.full_jit_from_mb``: a run whose backlog reaches it gets the full JIT (launch.launch_conf)
    full_jit_from_mb: int = FULL_JIT_FROM_MB
    # ``spark.interpreted_below_mb``: a run whose backlog is under it evaluates expressions
    # without generated code (launch.codegen_conf)
    interpreted_below_mb: int = INTERPRETED_BELOW_MB
    # ``source.archive_dir``: files of committed micro-batches move there (Spark's
    # ``cleanSource=archive``); a full refresh reads it with the landing folder
    archive_path: Path | None = None

    def table_path(self, table: str) -> Path:
        return self.tables[table].path

    def tombstone_path(self, table: str) -> Path:
        """Side table of deleted keys (SCD1), so late events never resurrect a delete."""
        return self.lake_root / "_tombstones" / table

    @property
    def roots(self) -> tuple[Path, ...]:
        """Folders this pipeline may read or write; params must stay inside them."""
        return (self.landing_path, self.lake_root, self.checkpoint_path.parent)


def _parse_table(r: Reader, name: str, source_format: str, default_db: str | None,
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
        spark_t = spark_type(t)
        if spark_t is None:
            raise r.fail(f"types.{col}", f"unsupported type {t!r}; use a Spark SQL type such as "
                         "bigint, string, decimal(10,2), date, timestamp" + split_type_hint(col, t))
        types[str(col)] = spark_t
    scd = r.scd()
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


def load_cdc_pipeline(file: Path, raw: dict[str, Any]) -> PipelineConfig:
    """Validate the mapping of a ``kind: cdc`` pipeline YAML (see :func:`load_pipeline`)."""
    r = Reader(file, raw)
    r.check_known({"kind", "pipeline", "description", "owner", "tags", "schedule", "start_date", "retries",
                   "source", "trigger", "storage", "engine", "spark", "tables", "ignore_tables",
                   "infer_temporal", "capture", "lock", "maintenance", "quarantine"})
    name = r.str("pipeline", required=True) or ""  # required=True raised if missing
    if not NAME_RE.match(name):
        raise r.fail("pipeline", f"{name!r} must match {NAME_RE.pattern} (it becomes the DAG id)")

    src = r.section("source", required=True)
    src.check_known({"format", "path", "database", "glob", "max_files_per_trigger",
                     "max_bytes_per_trigger", "archive_dir"})
    fmt = src.choice("format", FORMATS, default="")
    landing = src.folder("path", required=True)
    archive = src.folder("archive_dir")
    storage = r.section("storage", required=True)
    storage.check_known({"root", "checkpoint", "quarantine", "ddl_log", "runs"})
    root = storage.path("root", required=True)
    if landing is None or root is None:  # unreachable: required=True raised; narrows the types
        raise r.fail("storage.root", "is required")

    runtime = parse_runtime(r, spark_keys=("full_jit_from_mb", "interpreted_below_mb"))

    tables_raw = r.raw.get("tables")
    if not isinstance(tables_raw, dict) or not tables_raw:
        raise r.fail("tables", "expected a non-empty mapping of table name -> settings")
    source_db = src.str("database")
    tables: dict[str, TableConfig] = {}
    seen_sources: dict[tuple[str | None, str], str] = {}
    for tname, traw in tables_raw.items():
        tr = Reader(file, traw or {}, f"tables.{tname}")
        if traw is not None and not isinstance(traw, dict):
            raise tr.fail("", f"expected a mapping, got {traw!r}")
        t = _parse_table(tr, str(tname), fmt, source_db, root)
        ident = (t.database, t.source_table)
        if ident in seen_sources:
            raise tr.fail("source_table", f"{t.database}.{t.source_table} is already replicated by "
                          f"tables.{seen_sources[ident]}")
        seen_sources[ident] = t.name
        tables[t.name] = t
    named = list(tables.values())
    for i, a in enumerate(named):
        for b in named[i + 1:]:
            how = overlap(b.path.resolve(), a.path.resolve())  # b relative to a
            if how is not None:
                what = {"is": "is the path of", "lies inside": "lies inside the path of",
                        "contains": "contains the path of"}[how]
                raise r.fail(f"tables.{b.name}.path", (
                    f"{b.path} {what} tables.{a.name} ({a.path}): each table needs a path of "
                    "its own (one MERGE would overwrite the other's rows, a full refresh of one "
                    "delete both)"))
    checkpoint = storage.path("checkpoint", default=root / "_checkpoints" / name)
    quarantine = storage.path("quarantine", default=root / "_quarantine")
    ddl_log = storage.path("ddl_log", default=root / "_ddl_log")
    runs = storage.path("runs", default=root / "_runs")
    _check_own_paths(file, tables, landing, root, [
        ("storage.quarantine", quarantine), ("storage.ddl_log", ddl_log),  # type: ignore[list-item]
        ("storage.checkpoint", checkpoint), ("storage.runs", runs),  # type: ignore[list-item]
        ("storage.root/_tombstones (the tombstone tables)", root / "_tombstones"),
        ("storage.root/_staging (full-refresh staging)", root / "_staging"),
        *([("source.archive_dir", archive)] if archive is not None else [])])
    if archive is not None:
        _check_archive(file, landing, archive)

    max_files = src.int("max_files_per_trigger", default=1000) or 1000
    return PipelineConfig(
        file=file,
        name=name,
        description=r.str("description", default="") or "",
        owner=r.str("owner", default="data-engineering") or "data-engineering",
        tags=r.names("tags", default=()) or (),
        schedule=parse_schedule(r),
        start_date=str(r.raw.get("start_date", "2026-01-01")),
        retries=r.int("retries", default=2, minimum=0) or 0,
        source_format=fmt,  # type: ignore[arg-type]
        landing_path=landing,
        archive_path=archive,
        source_database=source_db,
        file_glob=src.str("glob"),
        max_files_per_trigger=max_files,
        max_bytes_per_trigger=src.int("max_bytes_per_trigger", default=None),
        trigger=r.choice("trigger", TRIGGERS, default="available_now"),  # type: ignore[arg-type]
        lake_root=root,
        checkpoint_path=checkpoint,  # type: ignore[arg-type]
        quarantine_path=quarantine,  # type: ignore[arg-type]
        ddl_log_path=ddl_log,  # type: ignore[arg-type]
        runs_path=runs,  # type: ignore[arg-type]
        **runtime,
        infer_temporal=r.bool("infer_temporal", default=True),
        tables=tables,
        ignore_tables=r.names("ignore_tables", default=()) or (),
        capture=_parse_capture(r, fmt, source_db, tables),
        quarantine_limits=parse_quarantine_limits(r),
        maintenance=parse_maintenance(r),
        full_jit_from_mb=_int_or(r.section("spark").int("full_jit_from_mb", default=FULL_JIT_FROM_MB,
                                                         minimum=0), FULL_JIT_FROM_MB),
        interpreted_below_mb=_int_or(r.section("spark").int(
            "interpreted_below_mb", default=INTERPRETED_BELOW_MB, minimum=0), INTERPRETED_BELOW_MB),
    )


def _check_own_paths(file: Path, tables: dict[str, TableConfig], landing: Path, root: Path,
                     side: list[tuple[str, Path]]) -> None:
    """Each table's path must be a folder of its own: not equal to, inside or containing another
    table, the quarantine, DDL log, tombstones, checkpoint, runs or staging folder, or the landing
    folder (compared after resolving symlinks and ``..``); the side paths likewise among
    themselves. A table sharing a side table's folder loses its rows: the side-table append
    and the table's MERGE carry the same transaction id, so the second write is skipped as done.
    (The overlap rule: :func:`cdc_lake.paths.overlap`.)"""

    owned = [(f"tables.{t.name}.path" + (" (default: storage.root/<table name>)"
                                          if t.path == root / t.name else ""), t.path)
             for t in tables.values()] + side
    landing_key = ("source.path", landing)
    resolved = [(k, p, Path(p).resolve()) for k, p in owned]
    for i, (key, path, rp) in enumerate(resolved):
        for other_key, other, ro in [(*landing_key, Path(landing).resolve()), *resolved[i + 1:]]:
            how = overlap(rp, ro)
            if how is None:
                continue
            raise ConfigError(file, key, (
                f"{path} {how} {other_key} = {other}"
                + (f" (resolved: {rp} and {ro})" if ro != Path(other) or rp != Path(path) else "")
                + "; "
                "every table, side table (quarantine, DDL log, tombstones), the checkpoint, the "
                "runs folder and the landing folder need a folder of their own that neither holds "
                f"nor lies inside another (a table sharing a side table's folder loses its rows): "
                f"give {key.split(' ')[0]} a path of its own"))


def _check_archive(file: Path, landing: Path, archive: Path) -> None:
    """With ``source.archive_dir`` (outside the landing folder: the own-path check) both folders
    must be local (Spark moves ``<landing>/f.json`` to ``<archive_dir>/<landing>/f.json``), and
    neither path may hold a ``,``: a full refresh reads both through one Hadoop pattern
    ``/{<landing>,<archived>}``, whose alternatives a comma separates. (Both are absolute:
    :meth:`Reader.path` resolves them.)"""
    for key, p in (("source.path", landing), ("source.archive_dir", archive)):
        if ":" in str(p):
            raise ConfigError(file, key, (
                f"{str(p)!r}: with source.archive_dir both folders must be local paths (Spark "
                "archives by renaming within one file system; a URI is not supported here)"))
        if "," in str(p):
            raise ConfigError(file, key, (
                f"{str(p)!r} holds ',': a full refresh reads the landing folder and the archive "
                "as one Hadoop pattern /{<landing>,<archive>}, where ',' separates alternatives; "
                "use folders without ',' or leave source.archive_dir unset"))


def _int_or(value: int | None, default: int) -> int:
    return default if value is None else value


_START_RE = re.compile(r"^(earliest|current|[A-Za-z0-9_.-]+:\d+)$")


def _parse_capture(r: Reader, fmt: str, source_db: str | None,
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
