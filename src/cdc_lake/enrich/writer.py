"""``foreachBatch`` handler of the enrichment job: one micro-batch -> every output table, once.

Per batch: pin the plan (dimension versions, batch start, own tables' versions; see
:mod:`cdc_lake.enrich.plan`), normalize the fact changes (latest per key), join the new
versions, the parked facts and the restatement candidates to the dimensions, decide each one's
fate (:mod:`cdc_lake.enrich.pending`), compute every output's source together
(:meth:`Engine.compute`: one Spark job with delta-rs), then write in this order, each write
idempotent per ``Txn(f"enrich-{pipeline}-{instance}-{table}", batch_id)``: ``enriched``,
``pending``, ``aggregate:<name>`` ..., ``quarantine``, ``manifest``. A replay after a crash skips the tables
already committed and writes the rest from the same plan, so no aggregate counts twice.

Example (what the streaming query calls; tests call it on static DataFrames too)::

    batch = EnrichBatch(cfg, engine, instance="4f1c...", run_id="r1", stats=EnrichStats())
    batch(change_feed_rows_df, 0)
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_lake.cdc.batch_writer import CRASH_ENV, Phases, align
from cdc_lake.checkpoint_log import batch_source_offsets
from cdc_lake.engines import Engine, MergeSpec, Txn, WriteResult
from cdc_lake.enrich import aggregate as agg_mod
from cdc_lake.enrich import keys as keys_mod
from cdc_lake.enrich import outputs as out
from cdc_lake.enrich import pending as pd
from cdc_lake.enrich.columns import CORRUPT, SOURCE_FILE
from cdc_lake.enrich.config import EnrichConfig
from cdc_lake.enrich.counts import EnrichStats, batch_counts
from cdc_lake.enrich.joins import DimensionFrame, check_dimension, join_dimensions
from cdc_lake.enrich.normalize import cols, fact_rows, latest_per_key
from cdc_lake.enrich.plan import (BatchPlan, commit_fingerprint, load_or_create_plan, now_utc,
                                  plan_file, read_at, source_mismatch)
from cdc_lake.enrich.rejoin import label as rejoin_label
from cdc_lake.enrich.rejoin import record_join, restate_needed
from cdc_lake.enrich.state import EnrichNeedsReprocess, record_versions, recovery_command
from cdc_lake.enrich.table_types import as_types, fit_table
from cdc_lake.pinned import pin, release
from cdc_lake.sources.landing_files import (LandedFileMissing, check_batch_files_present,
                                            explain_read_failure, rerun_command)


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        print(f"[enrich] fault injection: SIGKILL at {name}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


class EnrichBatch:
    def __init__(self, cfg: EnrichConfig, engine: Engine, *, instance: str, run_id: str,
                 stats: EnrichStats, hook: Callable[[int], None] | None = None,
                 plan_root: Path | None = None, rejoin: bool = False) -> None:
        self.cfg, self.engine, self.instance, self.run_id = cfg, engine, instance, run_id
        self.stats, self.hook = stats, hook
        self.plan_root = plan_root or cfg.checkpoint_path
        # a re-join pass (enrich.rejoin): no fact batch of the stream; its rows and manifest
        # carry the negative label of the pass, its transaction ids the pass number
        self.rejoin = rejoin
        self.kind = ("re-join pass" if rejoin else "batch" if self.plan_root == cfg.checkpoint_path
                     else "--reprocess snapshot batch")  # (the printed name)
        self.label: Callable[[int], int] = rejoin_label if rejoin else (lambda b: b)
        self.keys = cfg.fact.keys
        self.dim_outputs = [o for d in cfg.dimensions for o in d.outputs]

    def txn(self, table: str, batch_id: int) -> Txn:
        return Txn(f"enrich-{self.cfg.name}-{self.instance}-{table}", batch_id)

    # -- plan -------------------------------------------------------------------------------
    def _new_plan(self, batch_id: int, source: dict[str, Any] | None) -> BatchPlan:
        v: dict[str, int | None] = {f"dim:{d.name}": self.engine.version(str(d.table))
                                    for d in self.cfg.dimensions}
        v["enriched"] = self.engine.version(str(self.cfg.outputs.enriched))
        v["pending"] = self.engine.version(str(self.cfg.outputs.pending))
        paths = {**{f"dim:{d.name}": str(d.table) for d in self.cfg.dimensions},
                 "enriched": str(self.cfg.outputs.enriched), "pending": str(self.cfg.outputs.pending)}
        commits = {k: f for k, f in ((k, commit_fingerprint(paths[k], v[k])) for k in v) if f}
        dims = [d.name for d in self.cfg.dimensions]
        restate = restate_needed(self.cfg, {n: v[f"dim:{n}"] for n in dims},
                                 {n: commits.get(f"dim:{n}") for n in dims})
        return BatchPlan(batch_id, now_utc(), v, source, commits, restate)

    def _source(self, batch_id: int) -> dict[str, Any] | None:
        """The fact source offsets Spark logged for this batch (None: not a streaming batch of
        this checkpoint, or not readable)."""
        if self.plan_root != self.cfg.checkpoint_path:
            return None
        span = batch_source_offsets(self.cfg.checkpoint_path, batch_id)
        return None if span is None else {"start": span[0], "end": span[1]}

    def _check_replay(self, plan: BatchPlan, source: dict[str, Any] | None) -> None:
        if not source_mismatch(plan, source):
            return
        assert plan.source is not None and source is not None
        raise EnrichNeedsReprocess(
            f"pipeline {self.cfg.name}: micro-batch {plan.batch_id} was planned in "
            f"{plan_file(self.plan_root, plan.batch_id)} for the fact source offsets "
            f"{json.dumps(plan.source['start'])} .. {json.dumps(plan.source['end'])}, but Spark "
            f"now runs batch {plan.batch_id} over {json.dumps(source['start'])} .. "
            f"{json.dumps(source['end'])} (its offsets log file was damaged or removed and the "
            f"batch re-planned). The writes of this batch id were committed for the first range, "
            f"so they would be skipped and the changes in between lost; nothing was written. "
            f"Recovery: {recovery_command(self.cfg)}")

    def _dims(self, plan: BatchPlan) -> dict[str, DimensionFrame]:
        frames = {}
        for d in self.cfg.dimensions:
            version = plan.versions.get(f"dim:{d.name}")
            frame = DimensionFrame(d, read_at(self.engine, str(d.table), version,
                                              recovery_command(self.cfg),
                                              plan.commits.get(f"dim:{d.name}")), version)
            check_dimension(frame, str(self.cfg.file))
            frames[d.name] = frame
        return frames

    # -- the batch --------------------------------------------------------------------------
    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        crash_point("enrich:batch_start")
        source = self._source(batch_id)
        self._check_plan(batch_id)
        plan, replayed = load_or_create_plan(self.plan_root, batch_id,
                                             lambda: self._new_plan(batch_id, source))
        if replayed:
            self._check_replay(plan, source)
        self.stats.replayed_batches += int(replayed)
        if self.stats.planned_from is None or plan.started_at < self.stats.planned_from:
            self.stats.planned_from = plan.started_at
        cached: list[DataFrame] = []
        try:
            self._process(batch, batch_id, plan, cached)
        except Exception as e:
            if self.cfg.fact.kind == "events" and not self.rejoin and not isinstance(e, LandedFileMissing):
                try:  # a file gone after the batch was planned: name it (exit 3)
                    explain_read_failure(e, self.cfg.checkpoint_path, batch_id, pipeline=self.cfg.name,
                                         glob=None, rerun=rerun_command("enrich.py", self.cfg.file))
                except LandedFileMissing as missing:
                    self._stop(batch_id, missing)
            raise
        finally:
            for df in cached:
                release(df)
        self.stats.batch_ids.append(batch_id)
        self.stats.batch_seconds.append(round(time.monotonic() - started, 3))
        if self.hook is not None:
            self.hook(batch_id)
        crash_point("enrich:before_commit")

    def _process(self, batch: DataFrame, batch_id: int, plan: BatchPlan,
                 cached: list[DataFrame]) -> None:
        cfg, k = self.cfg, list(self.keys)
        phases = Phases()
        frames = self._dims(plan)
        dim_versions = {n: f.version for n, f in frames.items()}
        self.stats.dimension_versions = dict(dim_versions)
        enriched0 = read_at(self.engine, str(cfg.outputs.enriched), plan.versions.get("enriched"),
                            recovery_command(cfg), plan.commits.get("enriched"))
        pending0 = read_at(self.engine, str(cfg.outputs.pending), plan.versions.get("pending"),
                           recovery_command(cfg), plan.commits.get("pending"))
        label = self.label(batch_id)
        rows = fact_rows(cfg, batch, label)
        norm = pin(latest_per_key(cfg, rows, batch_id, stream_batch=not self.rejoin))
        cached.append(norm)
        # counted with the fates below, in one Spark job (nothing is written before either)
        norm_counts = norm.groupBy("_bad", F.col("_reason").startswith("late event").alias("late")).agg(
            F.count("*").alias("n"), F.sum(F.col("_tie").cast("int")).alias("ties"),
            F.sum((~F.col("_bad") & F.coalesce(F.col("_is_delete"), F.lit(False))).cast("int")).alias("dels"))
        phases.mark("read")
        changes = norm.where(~F.col("_bad")).drop("_bad", "_reason", "_tie", CORRUPT, SOURCE_FILE)
        # The enriched rows of the batch's fact keys and of the parked facts' (one scan of the
        # table, pinned): all the guard, the delete markers and, unless unknown members are
        # re-joined, the aggregates' old contributions need of it. (Each read the whole table
        # before: its cost grew with the table's history.)
        hits = None
        if enriched0 is not None:
            touched = changes.select(*cols(k))
            if pending0 is not None:
                touched = touched.unionByName(pending0.select(*cols(k)))
            hits = pin(enriched0.join(touched, k, "left_semi"))
            cached.append(hits)
        # Guard: a change not newer than the stored version of its fact changes nothing.
        stored = [df.select(*cols(k), "_fact_version") for df in (hits, pending0) if df is not None]
        if stored:
            s = stored[0] if len(stored) == 1 else stored[0].unionByName(stored[1])
            # the stored rows of the batch's keys only: the aggregate then has the batch's size
            s = (s.join(changes.select(*cols(k)), k, "left_semi")
                 .groupBy(*cols(k)).agg(F.max("_fact_version").alias("_stored_version")))
            changes = (changes.join(s, k, "left")
                       .where(F.col("_stored_version").isNull()
                              | (F.col("_fact_version") > F.col("_stored_version")))
                       .drop("_stored_version"))
        new_keys = changes.select(*cols(k))
        deletes = changes.where("_is_delete").drop("_is_delete")
        ups = changes.where(~F.col("_is_delete")).drop("_is_delete")
        # the enriched facts with unknown members, unless the last batch joined them to these
        # same dimension versions (then all would be kept as they are: no read of the table)
        cands = pd.candidates(ups, new_keys, pending0, enriched0 if plan.restate else None,
                              self.keys, set(self.dim_outputs))
        all_fact_cols = [c for c in cands.columns if c not in
                         ("_fact_version", "_parked_at", "_origin", "_prev_missing")]
        joined = join_dimensions(cands, cfg.dimensions, frames, cfg.event_time)
        fated = pin(pd.with_fate(joined, plan.started_at, cfg.late_wait))
        cached.append(fated)
        counts, ties, n_deletes, fates = batch_counts(norm_counts, fated)
        if cfg.fact.kind == "events" and not self.rejoin:  # every file read: were they all still there?
            try:
                check_batch_files_present(cfg.checkpoint_path, batch_id, pipeline=cfg.name,
                                          glob=None, rerun=rerun_command("enrich.py", cfg.file))
            except LandedFileMissing as e:
                self._stop(batch_id, e)
        if ties:  # two changes of one fact key in one commit: keeping one loses the other
            self._stop(batch_id, keys_mod.fact_violation(cfg, rows, norm, batch_id, ties))
        n_bad = sum(n for (b, _), n in counts.items() if b)
        self.stats.dropped_late += counts.get((True, True), 0)
        self.stats.facts_read += sum(counts.values())
        self._count_fates(fates)
        phases.mark("join+fate")

        upserts = out.no_void(pd.enriched_upserts(fated, all_fact_cols, self.dim_outputs, label,
                                               dim_versions), self.engine.schema(str(cfg.outputs.enriched)))
        # no parked fact and no delete in the batch: no delete marker can come of it, so the
        # enriched table is not scanned for them (an events batch never has deletes)
        dels = (pd.enriched_deletes(fated, deletes, hits, self.keys)  # parked / deleted: batch keys
                if fates.get("park", 0) or n_deletes else None)
        self.stats.enriched_upserted += sum(fates.get(f, 0) for f in pd.RELEASED)
        enriched_src = upserts if dels is None else upserts.unionByName(dels, allowMissingColumns=True)
        enriched_src = pin(enriched_src)
        cached.append(enriched_src)
        if dels is not None:
            self.stats.enriched_deleted += enriched_src.where("_enriched_batch IS NULL").count()
        # Every enriched source row a new fact (no stored row of the batch's or the parked facts'
        # keys, no delete marker, no restated fact): the MERGE would only insert, so append; a
        # MERGE scans its whole target (0.5-0.6 s at 442k rows, growing with the table).
        append_enriched = dels is None and not plan.restate and (hits is None or hits.isEmpty())

        # Every output's source, planned first and computed together (delta-rs: one Spark job);
        # then the writes, in their fixed order.
        pend_src = out.no_void(pd.pending_changes(fated, deletes, pending0, self.keys, all_fact_cols),
                            self.engine.schema(str(cfg.outputs.pending)))
        # aggregates: old contribution = the enriched rows this batch replaces or deletes
        # (read at the batch's planned version: in this batch's types if a column was widened since)
        # (the written keys are the batch's, the parked facts' and, when re-joined, the unknown-
        # member facts': those are read from the whole table)
        old = None if enriched0 is None else as_types(
            (enriched0 if plan.restate else hits).join(enriched_src.select(*cols(k)), k, "left_semi"),
            upserts.schema)
        writes: list[tuple[str, Any, DataFrame, MergeSpec | None]] = [
            ("enriched", cfg.outputs.enriched, enriched_src, out.enriched_merge(self.keys)),
            ("pending", cfg.outputs.pending, pend_src, out.pending_merge(self.keys))]
        for a in cfg.outputs.aggregates:
            agg_mod.check_columns(upserts, a, str(cfg.file))
            deltas = agg_mod.aggregate_deltas(old, upserts, a, cfg.event_time)
            target = (self.engine.schema(str(a.path))
                      if self.engine.already_committed(str(a.path), self.txn(f"aggregate:{a.name}", batch_id))
                      else fit_table(self.engine, cfg, f"aggregate:{a.name}", str(a.path), deltas.schema,
                                     group_columns=a.group_columns))
            types = {f.name: f.dataType.simpleString() for f in target.fields} if target else {}
            writes.append((f"aggregate:{a.name}", a.path, deltas, agg_mod.merge_spec(a, types)))
        if n_bad:
            self.stats.quarantined += n_bad
            writes.append(("quarantine", cfg.outputs.quarantine, out.quarantine_rows(
                cfg, norm, all_fact_cols, run_id=self.run_id, batch_id=label), None))
        manifest = out.manifest_row(self.engine.spark, cfg, plan, batch_id=label,
                                    run_id=self.run_id, dim_versions=dim_versions)
        writes.append(("manifest", cfg.outputs.manifest, manifest, None))
        if dels is not None:
            phases.mark("deletes")
        prepared = {table: self._prepare(table, path, df, spec, batch_id)
                    for table, path, df, spec in writes}
        sources = self.engine.compute({t: f for t, f in prepared.items() if f is not None},
                                      rows=2 * (sum(counts.values()) + sum(fates.values())))
        phases.mark("compute")
        # an integer sum that would leave its type (the MERGE would wrap it): stop before writes
        agg_mod.check_ranges(self.engine, cfg, sources)
        # a fact twice in a MERGE source matched two rows of a dimension: stop before any write
        if keys_mod.duplicated_merge_keys(sources, ("enriched", "pending"), self.keys):
            self._stop(batch_id, keys_mod.dimension_violation(cfg, cands, fated, frames, batch_id))
        versions: dict[str, int | None] = {}
        for table, path, _, spec in writes:
            if table == "manifest" and not n_bad:
                crash_point("enrich:after:quarantine")  # (the kill point exists in every batch)
            txn = self.txn(table, batch_id)
            if table not in sources:  # committed by an earlier attempt of this batch
                result = WriteResult(True, self.engine.version(str(path)))
            elif spec is None or (table == "enriched" and append_enriched):
                result = self.engine.append(str(path), sources[table], txn=txn)
            else:
                result = self.engine.merge(str(path), sources[table], spec, txn=txn)
            if table.startswith("aggregate:"):
                self.stats.aggregate_rows_touched += result.inserted + result.updated + result.deleted
            versions[table] = result.version
            self._done(table, result)
            phases.mark(table)
        # what the next run checks its own tables against (enrich.state.check_tables)
        record_versions(cfg, versions)
        record_join(cfg, plan.started_at, dim_versions,  # what enrich.rejoin compares with
                    {d.name: plan.commits.get(f"dim:{d.name}") for d in cfg.dimensions})
        print(f"[enrich] {self.kind} {batch_id}: dims {dim_versions}, fates {fates}"
              + ("" if plan.restate else " (unknown members not re-joined: dimensions as last joined)")
              + "; "
              + ", ".join(phases.parts), flush=True)

    def _committed(self, batch_id: int) -> list[str]:
        """The outputs that already hold a commit of this batch id (its transaction id)."""
        o = self.cfg.outputs
        outs = [("enriched", o.enriched), ("pending", o.pending), ("quarantine", o.quarantine),
                ("manifest", o.manifest), *[(f"aggregate:{a.name}", a.path) for a in o.aggregates]]
        return [t for t, p in outs if self.engine.already_committed(str(p), self.txn(t, batch_id))]

    def _check_plan(self, batch_id: int) -> None:
        """A batch whose plan file is missing or unreadable: re-planned when none of its writes
        was committed (a plan of a batch that wrote nothing pins nothing that was used); else
        exit 3. A new plan would pin the output versions that already hold this batch's writes,
        the replay would take its own changes for old ones, and the aggregates would miss them
        with exit 0 (tester: the plan of a killed batch deleted by hand)."""
        f = plan_file(self.plan_root, batch_id)
        damage = None
        if f.is_file():
            try:
                plan = BatchPlan.from_json(f.read_text(encoding="utf-8"))
                need = [f"dim:{d.name}" for d in self.cfg.dimensions] + ["enriched", "pending"]
                lacking = [k for k in need if k not in plan.versions]
                if not lacking:
                    return
                damage = f"incomplete (no version pinned for {lacking})"
            except Exception as e:  # noqa: BLE001 - any content that is not a plan: damaged
                damage = f"unreadable ({type(e).__name__}: {str(e)[:200]})"
        done = self._committed(batch_id)
        if not done:
            if damage is not None:
                print(f"[enrich] batch {batch_id}: plan file {f} is {damage}; no write of this "
                      "batch was committed, so it is planned again", flush=True)
                f.unlink()
            return
        raise EnrichNeedsReprocess(
            f"pipeline {self.cfg.name}: the plan of micro-batch {batch_id} ({f}) is "
            f"{damage or 'missing'}, but the batch already committed its writes to {done} (an "
            "earlier attempt was interrupted). The plan pins the versions the batch read; without "
            "it the rest of the batch cannot be written consistently (its changes would be taken "
            "for replays and the aggregates would miss them); nothing was written now. Put the "
            f"file back if you have it, else recover with: {recovery_command(self.cfg)}")

    def _stop(self, batch_id: int, error: Exception) -> None:
        """Raise ``error`` for a batch that wrote nothing; its plan is dropped (when no write of
        this batch id was ever committed) so the rerun after the upstream fix reads the
        dimensions' new versions instead of the pinned ones."""
        if not self._committed(batch_id):
            plan_file(self.plan_root, batch_id).unlink(missing_ok=True)
        raise error

    def _count_fates(self, fates: dict[str, int]) -> None:
        s = self.stats
        s.parked += fates.get("park", 0)
        s.released += fates.get("release", 0)
        s.released_unknown += fates.get("unknown", 0)
        s.restated += fates.get("restate", 0)

    def _prepare(self, table: str, path: Any, source: DataFrame, spec: MergeSpec | None,
                 batch_id: int) -> DataFrame | None:
        """The write's source, aligned to its table (created all-nullable when absent, for a
        MERGE: delete markers carry nulls); None when this batch already committed it."""
        if self.engine.already_committed(str(path), self.txn(table, batch_id)):
            return None
        if spec is None:
            return source
        existing = fit_table(self.engine, self.cfg, table, str(path), source.schema)
        if existing is None:
            self.engine.create(str(path), out.nullable(source.schema))
            existing = self.engine.schema(str(path))
        return align(source, existing)

    def _done(self, table: str, result: Any) -> None:
        self.stats.skipped_writes += int(result.skipped)
        if result.version is not None:
            self.stats.tables[table] = result.version
        crash_point(f"enrich:after:{table}")
