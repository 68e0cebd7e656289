"""``foreachBatch`` handler: one parsed micro-batch -> every configured table, exactly once.

Per batch: one survey (counts, column types) routes events to tables; then every write's source
(quarantine rows, DDL rows, each table's and tombstone table's MERGE source) is planned and
computed together (:meth:`Engine.compute`: delta-rs gets them all from one Spark job), then
written: side tables first, then each table. Every write carries ``Txn(app_id, batch_id)``;
when Spark replays a batch after a crash (offset logged, commit not), writes that already
landed are skipped table by table (their sources are not even computed), and the rest are
done — so all tables converge, none twice.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.compute as pc

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdc_lake.cdc import changes as ch
from cdc_lake.cdc import side_tables as side
from cdc_lake.cdc.discovery import (UNKNOWN, observe, plan_table, refuse_non_objects, route,
                                   survey)
from cdc_lake.cdc.config import PipelineConfig
from cdc_lake.checkpoint_log import PipelineStateError
from cdc_lake.engines import Computed, Engine, Source, Txn, WriteResult
from cdc_lake.sources.landing_files import (check_batch_files_present, explain_read_failure,
                                            read_partitions)

CRASH_ENV = "CDC_CRASH_AT"  # fault injection for tests: SIGKILL this driver at a named point


@dataclass
class TableStats:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    changes: int = 0
    rejected: int = 0
    delta_version: int | None = None
    skipped_batches: int = 0


@dataclass
class RunStats:
    batch_ids: list[int] = field(default_factory=list)
    events: int = 0
    rows: int = 0
    quarantined: int = 0
    newly_quarantined: int = 0  # a full refresh: left-out lines the quarantine did not hold yet
    ddl_events: int = 0
    skipped_lines: int = 0
    ignored: int = 0
    quarantine_version: int | None = None
    ddl_log_version: int | None = None
    tables: dict[str, TableStats] = field(default_factory=dict)
    batch_seconds: list[float] = field(default_factory=list)
    startup_s: float = 0.0
    engine_label: str | None = None
    driver_jit: str | None = None  # what the driver JVM runs ("C1" / "C1+C2"), None: no Spark
    jvm_archive: str | None = None  # the driver JVM's class-data-sharing archive (jvm_archive)
    codegen: str | None = None  # "interpreted" / "generated" (launch.codegen_conf), None: no Spark


@dataclass(frozen=True)
class Targets:
    """Where this run writes each table (the real path, or a staging path for a full refresh)."""

    tables: dict[str, Path]
    tombstones: dict[str, Path]
    write_side_tables: bool  # quarantine + DDL log (not during a full refresh: already recorded)
    # A full refresh: the live tables whose column types a staging table starts from, so the
    # rebuild types (and quarantines) values as the incremental runs did. From empty staging
    # tables it typed the whole history as one first batch: a bigint column with one "three"
    # quarantined became a string column holding "three" (tester, 2026-11-28)
    type_seeds: dict[str, Path] = field(default_factory=dict)


class Phases:
    """Wall time per phase of one micro-batch, printed as a progress line."""

    def __init__(self) -> None:
        self.t = time.monotonic()
        self.parts: list[str] = []

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.parts.append(f"{name} {now - self.t:.1f}s")
        self.t = now


# A full refresh's frame of the lines it leaves out (counted, not written: see _process)
LEFT_OUT = "side:left_out"


def _union(parts: list[DataFrame]) -> DataFrame:
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out


def _crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        print(f"[cdc] fault injection: SIGKILL at {name}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def align(df: DataFrame, target: StructType | None) -> DataFrame:
    """Give ``df`` every column of the target table (missing ones null) in the table's types."""
    if target is None:
        return df
    have = set(df.columns)
    cols = [F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) if f.name in have
            else F.lit(None).cast(f.dataType).alias(f.name) for f in target.fields]
    extra = [F.col(f"`{c}`") for c in df.columns if c not in {f.name for f in target.fields}]
    return df.select(*cols, *extra)


class BatchWriter:
    def __init__(self, cfg: PipelineConfig, engine: Engine, *, app_id: str, run_id: str,
                 selected: set[str], targets: Targets, stats: RunStats) -> None:
        self.cfg, self.engine, self.app_id, self.run_id = cfg, engine, app_id, run_id
        self.selected, self.targets, self.stats = selected, targets, stats
        self._route = route(cfg, selected)
        self._side_ready: set[str] = set()
        # set by the job for the stream it runs: the batch's files are checked after the survey
        self.checkpoint: Path | None = None
        self.rerun = ""
        self.stop_error: PipelineStateError | None = None  # raised in a batch: the run's error

    def _widen(self, plan: ch.TablePlan, existing: StructType | None) -> StructType | None:
        """Widen the table's columns (and a widened key in its tombstones); the new schema."""
        path = str(self.targets.tables[plan.name])
        print(f"[cdc] widening {plan.name}: " + ", ".join(
            f"{c} {existing[c].dataType.simpleString() if existing else '?'} -> {t}"  # type: ignore[index]
            for c, t in plan.widen.items()), flush=True)
        self.engine.widen(path, plan.widen)
        keys = {k: t for k, t in plan.widen.items() if k in plan.keys}
        tomb = str(self.targets.tombstones[plan.name]) if plan.name in self.targets.tombstones else None
        if keys and plan.scd == 1 and tomb and self.engine.exists(tomb):
            self.engine.widen(tomb, keys)
        return self.engine.schema(path)

    def _type_seed(self, name: str) -> StructType | None:
        """The schema a table not written yet starts its column types from (a full refresh:
        the live table's, without the columns ``types`` pins: the rebuild applies the pin), else
        None."""
        seed = self.targets.type_seeds.get(name)
        if seed is None:
            return None
        try:
            live = self.engine.schema(str(seed))
        except Exception as e:  # noqa: BLE001 - a damaged live table: the rebuild infers anew
            print(f"[cdc] {name}: the live table's types could not be read ({type(e).__name__}); "
                  "the full refresh types its columns from the landing history", flush=True)
            return None
        if live is None:
            return None
        pinned = {c.lower() for c in self.cfg.tables[name].types}
        return StructType([f for f in live.fields if f.name.lower() not in pinned])

    # -- writes --------------------------------------------------------------------------------
    def _table_frames(self, plan: ch.TablePlan, changes: DataFrame, txn: Txn,
                      existing: StructType | None) -> dict[str, DataFrame]:
        """The MERGE sources of one table (and its tombstones) not yet committed for ``txn``.

        Widens the table first when the batch needs it (a write of its own, before the sources
        are aligned to the new schema).
        """
        path = str(self.targets.tables[plan.name])
        pending_table = not self.engine.already_committed(path, txn)
        if plan.widen and pending_table:
            existing = self._widen(plan, existing)
        if plan.scd == 2:
            if not pending_table:
                return {}
            rows = ch.scd2_rows(changes, plan.keys, self.engine.read(path))
            return {"table": align(rows, existing)}
        tomb_path = str(self.targets.tombstones[plan.name])
        pending_tomb = not self.engine.already_committed(tomb_path, txn)
        if not (pending_table or pending_tomb):
            return {}
        # delta-rs: the tombstone rule runs after the Spark job, on the batch's keys only
        tombstones = None if self.engine.computes_to_arrow else self.engine.read(tomb_path)
        source = ch.scd1_source(changes, plan.keys, tombstones)
        frames = {}
        if pending_table:
            frames["table"] = align(source, existing)
        if pending_tomb and pending_table and self.engine.computes_to_arrow:
            self._tombs_from_table.add(plan.name)  # derived on Arrow: no second window in Spark
        elif pending_tomb:
            frames["tombstones"] = ch.tombstone_source(source, plan.keys)
        return frames

    def _finish_scd1(self, work: list[tuple[ch.TablePlan, DataFrame, StructType | None]],
                     sources: dict[str, Source]) -> None:
        """SCD1 sources computed to Arrow without the tombstone rule: apply it
        (:func:`ch.drop_tombstoned`, one delta-rs lookup of the batch's keys per table), then
        derive the tombstone source from the table source where both are pending
        (:func:`ch.arrow_tombstone_source`)."""
        for plan, _, _ in work:
            names = [f"{part}:{plan.name}" for part in ("table", "tombstones")
                     if f"{part}:{plan.name}" in sources]
            if plan.scd != 1 or not names:
                continue
            computed = [sources[n] for n in names]
            assert all(isinstance(c, Computed) for c in computed), "engine computes to Arrow"
            # the table source (if pending) holds every key of the tombstone source
            first = computed[0].data[plan.keys[0]]  # type: ignore[union-attr]
            if len(first) == 0:
                continue
            lookup = self.engine.read_arrow(str(self.targets.tombstones[plan.name]),
                                            [*plan.keys, "_cdc_seq"],
                                            where_in=(plan.keys[0], pc.unique(first).to_pylist()))
            for n, c in zip(names, computed):
                sources[n] = Computed(ch.drop_tombstoned(c.data, lookup, plan.keys), c.schema)  # type: ignore[union-attr]
            if plan.name in self._tombs_from_table:
                table = sources[f"table:{plan.name}"]
                schema = StructType([table.schema[c] for c in (*plan.keys, "_cdc_seq")])
                sources[f"tombstones:{plan.name}"] = Computed(
                    ch.arrow_tombstone_source(table.data, plan.keys), schema)  # type: ignore[union-attr]

    def _write_table(self, plan: ch.TablePlan, sources: dict[str, Source], txn: Txn) -> WriteResult:
        path = str(self.targets.tables[plan.name])
        spec = ch.scd2_spec(plan.keys) if plan.scd == 2 else ch.scd1_spec(plan.keys)
        if "table" in sources:
            result = self.engine.merge(path, sources["table"], spec, txn=txn)
        else:  # an earlier attempt of this batch committed it (a replay after a crash)
            result = WriteResult(True, self.engine.version(path))
        if "tombstones" in sources:
            self.engine.merge(str(self.targets.tombstones[plan.name]), sources["tombstones"],
                              ch.tombstone_spec(plan.keys), txn=txn)
        return result

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        _crash_point("batch_start")
        txn = Txn(self.app_id, batch_id)
        if self.checkpoint is not None:  # many small files: one read task per core, not per 4 MiB
            parts = read_partitions(self.checkpoint, batch_id,
                                    batch.sparkSession.sparkContext.defaultParallelism)
            batch = batch.coalesce(parts) if parts else batch
        ev = batch.withColumn("_target", self._route).persist()
        self._cached: list[DataFrame] = [ev]
        try:
            self._process(ev, batch_id, txn)
        except Exception as e:
            if self.checkpoint is not None and self.stop_error is None:
                try:  # a file gone after the batch was planned: name it (exit 3)
                    explain_read_failure(e, self.checkpoint, batch_id, pipeline=self.cfg.name,
                                         glob=self.cfg.file_glob, rerun=self.rerun)
                except PipelineStateError as missing:
                    self.stop_error = missing
                    raise missing from None
            raise
        finally:
            for df in self._cached:
                df.unpersist()
        self.stats.batch_ids.append(batch_id)
        self.stats.batch_seconds.append(round(time.monotonic() - started, 3))
        _crash_point("before_commit")

    def _process(self, ev: DataFrame, batch_id: int, txn: Txn) -> None:
        phases = Phases()
        seen = survey(ev, self.selected)
        if seen.non_object_tables:  # rare (hostile input): flag those rows, survey again
            ev = refuse_non_objects(ev, seen.non_object_tables).persist()
            self._cached.append(ev)
            seen = survey(ev, self.selected)
        if self.checkpoint is not None:  # the survey read every file: were they all there?
            try:
                check_batch_files_present(self.checkpoint, batch_id, pipeline=self.cfg.name,
                                          glob=self.cfg.file_glob, rerun=self.rerun)
            except PipelineStateError as e:
                self.stop_error = e
                raise
        present = seen.present
        self.stats.events += seen.events
        self.stats.rows += seen.row_events
        self.stats.skipped_lines += seen.skipped
        self.stats.ignored += seen.ignored
        phases.mark("survey")
        # The survey's counts say which side outputs can have rows: skip the scans that cannot.
        rejected_parts: list[DataFrame] = []
        if seen.errors:
            rejected_parts.append(
                ev.where(F.col("_error").isNotNull()).select("_file", "_line", F.col("_error").alias("reason"),
                                                             F.col("tbl").alias("source_table")))
        if seen.unknown:
            rejected_parts.append(
                ev.where(F.col("_error").isNull() & (F.col("_kind") == "row") & (F.col("_target") == UNKNOWN))
                  .select("_file", "_line",
                          F.concat(F.lit("unknown table "), F.concat_ws(".", "db", "tbl"),
                                   F.lit(f" (not in {self.cfg.file.name}; list it under tables or "
                                         "ignore_tables)")).alias("reason"),
                          F.col("tbl").alias("source_table")))
        existing = {n: self.engine.schema(str(self.targets.tables[n])) for n in present}
        basis = {n: existing[n] if existing[n] is not None else self._type_seed(n) for n in present}
        observed = observe(ev, seen, self.cfg, basis)
        phases.mark("discover")
        work: list[tuple[ch.TablePlan, DataFrame, StructType | None]] = []
        self._tombs_from_table: set[str] = set()
        for name in present:
            rows = ev.where((F.col("_target") == name) & (F.col("_kind") == "row") & F.col("_error").isNull())
            plan = plan_table(self.cfg, name, observed[name], seen.pks.get(name, []), basis[name])
            if not isinstance(plan, str) and plan.widen and existing[name] is None:
                plan = replace(plan, widen={})  # (seeded: the new table gets the wider types)
            if isinstance(plan, str):
                rejected_parts.append(rows.select("_file", "_line", F.lit(plan).alias("reason"),
                                                  F.col("tbl").alias("source_table")))
                continue
            changes, rejected, cached = ch.typed_changes(rows, plan, self.run_id,
                                                         ordinal=name in seen.ordinal_tables)
            rejected_parts.append(rejected.select("*", F.lit(name).alias("source_table")))
            work.append((plan, changes, existing[name]))
            self._cached.append(cached)

        # Every source of this batch's writes, computed together (delta-rs: one Spark job).
        frames: dict[str, DataFrame] = {}
        if self.targets.write_side_tables:
            frames.update(self._side_frames(ev, rejected_parts, seen.ddl, batch_id, txn))
        elif rejected_parts:  # a full refresh: count what the rebuild leaves out; the quarantine
            # holds most of it from the runs that first read it, but not a line those runs stored
            # that a changed `types` pin or selection now rejects (tester: left out, its row back
            # to an older image, exit 0, "in the quarantine" said but not there): appended by
            # its natural key, so the lines already there add nothing
            frames[LEFT_OUT] = _union(rejected_parts).select("source_table")
            frames.update(self._side_frames(ev, rejected_parts, 0, batch_id, txn))
        for plan, changes, existing in work:
            for part, df in self._table_frames(plan, changes, txn, existing).items():
                frames[f"{part}:{plan.name}"] = df
        # (bound: the batch's lines; a table's sources hold at most one row or two per change)
        sources = self.engine.compute(frames, rows=2 * seen.events)
        if LEFT_OUT in sources:
            left_out = sources.pop(LEFT_OUT)
            self.stats.quarantined += (left_out.data.num_rows if isinstance(left_out, Computed)
                                       else left_out.count())
        if self.engine.computes_to_arrow:
            self._finish_scd1(work, sources)
        phases.mark("compute")
        if self.targets.write_side_tables:
            self._write_side_tables(sources, txn)
            phases.mark("quarantine+ddl")
        elif "side:quarantine" in sources:
            self.stats.newly_quarantined += self._append_quarantine(sources["side:quarantine"], txn)
        _crash_point("after_side_tables")
        for plan, _, _ in work:
            result = self._write_table(plan, {part: sources[f"{part}:{plan.name}"]
                                              for part in ("table", "tombstones")
                                              if f"{part}:{plan.name}" in sources}, txn)
            st = self.stats.tables.setdefault(plan.name, TableStats())
            st.skipped_batches += int(result.skipped)
            st.inserted += result.inserted
            st.updated += result.updated
            st.deleted += result.deleted
            st.delta_version = result.version
            phases.mark(plan.name)
            _crash_point(f"after_table:{plan.name}")
        print(f"[cdc] batch {batch_id}: " + ", ".join(phases.parts), flush=True)

    def _side_frames(self, ev: DataFrame, rejected_parts: list[DataFrame], n_ddl: int,
                     batch_id: int, txn: Txn) -> dict[str, DataFrame]:
        """Rows for the quarantine and the DDL log (only where this batch has not written yet)."""
        frames: dict[str, DataFrame] = {}
        q_path, d_path = str(self.cfg.quarantine_path), str(self.cfg.ddl_log_path)
        if rejected_parts and not self.engine.already_committed(q_path, txn):
            frames["side:quarantine"] = side.conform(_union(rejected_parts).select(
                F.col("_file").alias("source_file"),
                # a line that is not UTF-8 is shown with U+FFFD (Arrow/Delta strings are UTF-8)
                F.make_valid_utf8("_line").alias("raw_line"), "reason",
                "source_table", F.lit(self.cfg.name).alias("pipeline"),
                # batch_id, quarantined_at: set after the Spark job (side.stamp)
                F.lit(self.run_id).alias("run_id")), side.QUARANTINE)
        if n_ddl and not self.engine.already_committed(d_path, txn):
            # (the survey counted DDL events: otherwise an empty append would commit nothing)
            frames["side:ddl"] = side.conform(ev.where(
                (F.col("_kind") == "ddl") & F.col("_error").isNull()).select(
                F.col("db").alias("database"), F.col("tbl").alias("table"), "ddl_type",
                F.col("ddl_sql").alias("sql"), F.col("seq").alias("_cdc_seq"),
                F.col("commit_ts").alias("_cdc_commit_ts"), F.col("_file").alias("source_file"),
                F.lit(self.cfg.name).alias("pipeline"), F.lit(self.run_id).alias("run_id")),
                side.DDL_LOG)
        return frames

    def _write_side_tables(self, sources: dict[str, Source], txn: Txn) -> None:
        """Quarantine + DDL log: fixed schemas, created up front; appends idempotent by key."""
        if "side:quarantine" in sources:
            self.stats.quarantined += self._append_quarantine(sources["side:quarantine"], txn)
        if "side:ddl" in sources:
            d = self._side_append(str(self.cfg.ddl_log_path), sources["side:ddl"], side.DDL_LOG, txn)
            self.stats.ddl_events += int(d.metrics.get("num_added_rows", 0))
            self.stats.ddl_log_version = d.version

    def _append_quarantine(self, rows: Source, txn: Txn) -> int:
        """Stamp and append the batch's quarantine rows (idempotent by key); the rows added."""
        rows = side.stamp(rows, {"batch_id": txn.version, "quarantined_at": datetime.now(timezone.utc)})
        q = self._side_append(str(self.cfg.quarantine_path), rows, side.QUARANTINE, txn)
        self.stats.quarantine_version = q.version
        return int(q.metrics.get("num_added_rows", 0))

    def _side_append(self, path: str, rows: Source, table: side.SideTable, txn: Txn) -> WriteResult:
        if path not in self._side_ready:
            side.ensure(self.engine, path, table)
            self._side_ready.add(path)
        return side.append_new(self.engine, path, rows, table, txn=txn)
