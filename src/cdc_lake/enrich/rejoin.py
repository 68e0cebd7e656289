"""Re-join pass: parked and unknown-member facts re-joined in a run without fact changes for them.

A micro-batch re-joins the pending facts (and the facts released with unknown members) to the
dimensions' newest versions. Micro-batches exist only where the fact source has new changes, so
without this pass a member that arrived in a dimension, or a ``late_members.wait`` that ran out,
changed nothing until the next fact change: at the end of a day's facts, the parked ones waited
for the next day's (issue 7: "re-joined by every later micro-batch/run").

So after its stream a run checks (:func:`due`) whether the facts parked or flagged unknown could
now have another fate than the last batch gave them:

* a dimension's Delta version differs from the versions the last batch or pass joined
  (``<checkpoint>/enrich_last_join.json``, written after every batch), and there are pending
  facts or enriched facts with unknown members; or
* the oldest pending fact was parked before this run started and its wait has run out.

If so, the run makes one **re-join pass**: a batch of the enrichment writer with no fact
change, planned, written and replayed exactly like a micro-batch (pinned plan, Delta
transaction ids per table), numbered by its own counter ``n`` = 0, 1, ...: its plans are
``<checkpoint>/enrich_rejoin/enrich_batches/<n>.json``, its transaction ids
``enrich-<pipeline>-<instance>-rejoin-<table>`` with version ``n``, and the rows it writes carry
``_enriched_batch`` = ``-(n + 1)`` (the manifest's ``batch_id`` too): negative, so they are never
taken for a micro-batch of the stream. A pass interrupted by a crash is finished at the start
of the next run, before the stream (:func:`resume`): a stream batch planned on its half-written
tables would release its facts a second time.

Example (what ``enrich.job`` does around its stream)::

    passes = Passes()
    if (n := interrupted(cfg, engine, instance)) is not None:
        passes.run(cfg, engine, instance, run_id, n)          # before the stream
    ...                                                       # the stream's micro-batches
    if due(cfg, engine, run_started):                         # None: nothing could change
        passes.run(cfg, engine, instance, run_id, next_pass(cfg, engine, instance))
    summary["rejoin"] = passes.summary()
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StringType, StructField, StructType

from cdc_lake.engines import Engine
from cdc_lake.engines.base import empty_frame
from cdc_lake.enrich.config import EnrichConfig
from cdc_lake.enrich.plan import PLANS_DIR

LAST_JOIN_FILE = "enrich_last_join.json"
RUN_FILE = "enrich_run.json"  # the start of a run that has not finished (removed when it does)
PLAN_ROOT = "enrich_rejoin"
SUFFIX = "rejoin"


def label(n: int) -> int:
    """The ``_enriched_batch`` / manifest ``batch_id`` of pass ``n``: -1, -2, ..."""
    return -(n + 1)


def run_started(cfg: EnrichConfig, started_at: datetime) -> datetime:
    """When the run that is now going on started, for "parked by this run": ``started_at``, or
    the start of an earlier run that did not finish (killed, failed), which this run completes:
    a fact parked by a batch that run committed has not waited through a later run either, so
    a rerun after a crash leaves the tables an uninterrupted run would have left."""
    f = cfg.checkpoint_path / RUN_FILE
    try:
        earlier = datetime.fromisoformat(json.loads(f.read_text(encoding="utf-8"))["started_at"])
        if earlier.tzinfo is None:
            raise ValueError("naive")
    except (OSError, ValueError, KeyError, TypeError):
        earlier = None
    if earlier is None:
        cfg.checkpoint_path.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(json.dumps({"started_at": started_at.isoformat()}), encoding="utf-8")
        os.replace(tmp, f)
        return started_at
    return min(earlier, started_at)


def run_finished(cfg: EnrichConfig) -> None:
    (cfg.checkpoint_path / RUN_FILE).unlink(missing_ok=True)


def record_join(cfg: EnrichConfig, started_at: datetime, dims: dict[str, int | None],
                commits: dict[str, str | None] | None = None) -> None:
    """After a batch's writes: the dimension versions it joined (and their commit fingerprints,
    the join's definition: what :func:`restate_needed` compares) and when it started."""
    f = cfg.checkpoint_path / LAST_JOIN_FILE
    tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps({"dimension_versions": dims, "dimension_commits": commits or {},
                               "definition": join_definition(cfg),
                               "started_at": started_at.isoformat()}, sort_keys=True), encoding="utf-8")
    os.replace(tmp, f)


def last_join(cfg: EnrichConfig) -> dict[str, Any] | None:
    """The record of the last batch or pass (None: none recorded, or not readable: the caller
    then treats every dimension as changed, which costs at most one pass)."""
    try:
        data = json.loads((cfg.checkpoint_path / LAST_JOIN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("dimension_versions"), dict) else None


def join_definition(cfg: EnrichConfig) -> str:
    """A fingerprint of what the dimension join depends on besides the tables' data: each
    dimension's table, keys, SCD type, ``on`` and ``columns``, and ``event_time``."""
    spec = [[d.name, str(d.table), list(d.keys), d.scd, [list(p) for p in d.on],
             [list(p) for p in d.columns]] for d in cfg.dimensions]
    return hashlib.sha256(json.dumps([spec, cfg.event_time]).encode()).hexdigest()[:16]


def restate_needed(cfg: EnrichConfig, versions: dict[str, int | None],
                   commits: dict[str, str | None]) -> bool:
    """Whether a batch must re-join the enriched facts with unknown members (restatement
    candidates): False only when the last batch or pass joined them to these very dimension
    versions (same version numbers, same commit fingerprints, same join definition). Every such
    fact was then joined to exactly these dimension rows and left with a member missing, so
    joining it again can only give ``keep`` (nothing written), and the batch skips reading the
    whole enriched table for them: its cost then follows the batch, not the table's history.
    Any doubt (no readable record, a version without a fingerprint) means True: re-join."""
    last = last_join(cfg)
    if last is None or last.get("definition") != join_definition(cfg):
        return True
    if last["dimension_versions"] != versions or any(
            v is not None and commits.get(n) is None for n, v in versions.items()):
        return True
    return last.get("dimension_commits") != {n: commits.get(n) for n in versions}


def due(cfg: EnrichConfig, engine: Engine, run_started: datetime,
        now: datetime | None = None) -> str | None:
    """Why a re-join pass is due now, or None (see the module doc). ``run_started``: facts
    parked from then on were parked by this run (its start, or the start a replayed batch of
    it pinned): a wait running out never makes a pass for them (with a wait of 0s they are
    released by the next run, as by the next micro-batch before). Reads the pending table's row
    count (delta-rs: from the Parquet footers) and, when that can decide, one column of the
    pending or enriched table (delta-rs; a Spark aggregate on delta-spark)."""
    now = now or datetime.now(timezone.utc)
    pending = str(cfg.outputs.pending)
    n_pending = engine.count(pending) if engine.exists(pending) else 0
    current = {d.name: engine.version(str(d.table)) for d in cfg.dimensions}
    last = last_join(cfg)
    joined = None if last is None else last["dimension_versions"]
    if joined != current:
        changed = ("no record of the versions the last batch joined" if joined is None else
                   "dimension versions " + ", ".join(
                       f"{n} {joined.get(n)} -> {v}" for n, v in current.items() if joined.get(n) != v))
        if n_pending:
            return f"{changed}; {n_pending} pending fact(s)"
        unknown = _unknown_count(engine, str(cfg.outputs.enriched))
        if unknown:
            return f"{changed}; {unknown} enriched fact(s) with unknown members"
    if n_pending and _may_have_waited(engine, pending, cfg.late_wait, run_started, now):
        oldest = _oldest_parked(engine, pending)
        if oldest is not None and oldest < run_started and oldest + cfg.late_wait <= now:
            return (f"pending facts parked since {oldest.isoformat()} have waited "
                    f"late_members.wait ({_span(cfg.late_wait)})")
    return None


def _may_have_waited(engine: Engine, pending: str, wait: timedelta, run_started: datetime,
                     now: datetime) -> bool:
    """False when the file statistics of the pending table prove that no parked fact older than
    ``run_started`` has waited ``wait``: their smallest ``_parked_at`` is a lower bound of the
    oldest one (statistics may be truncated to milliseconds). Decides the common run without
    reading a row (no ``pyarrow.dataset`` and its pandas import: 0.3 s of a run that then finds
    nothing to do, 2026-12-01); otherwise (True) the rows decide (:func:`_oldest_parked`)."""
    low = _stats_min_micros(engine, pending, "_parked_at")
    if low is None:
        return True
    lower = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=low)
    return lower < run_started and lower + wait <= now


def _stats_min_micros(engine: Engine, path: str, column: str) -> int | None:
    """The smallest minimum of a timestamp column in the table's file statistics (delta-rs reads
    the log only), in microseconds; None when a file has none (no statistics, only nulls), the
    table has no file, or the engine is not delta-rs."""
    if engine.name != "deltalake":
        return None
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        from deltalake import DeltaTable

        actions = DeltaTable(path).get_add_actions(flatten=True)
        if actions.num_rows == 0:
            return None
        col = pa.chunked_array(actions.column(f"min.{column}"))
        if col.null_count:
            return None
        return pc.min(pc.cast(col, pa.timestamp("us", tz="UTC"))).cast(pa.int64()).as_py()
    except Exception:  # noqa: BLE001 - no such statistics column, a reader feature: the rows decide
        return None


def _arrow_column(engine: Engine, path: str, column: str) -> Any:
    """One column of the table as Arrow, read by delta-rs (no Spark job); None: not the
    deltalake engine, or a table delta-rs cannot read (then Spark reads it)."""
    if engine.name != "deltalake":
        return None
    try:
        from deltalake import DeltaTable

        return DeltaTable(path).to_pyarrow_dataset().to_table(columns=[column]).column(column)
    except Exception:  # noqa: BLE001 - e.g. a reader feature delta-rs lacks: Spark's read below
        return None


def _unknown_count(engine: Engine, path: str) -> int:
    schema = engine.schema(path) if engine.exists(path) else None
    if schema is None or "_unknown_members" not in schema.fieldNames():
        return 0
    col = _arrow_column(engine, path, "_unknown_members")
    if col is not None:
        import pyarrow.compute as pc

        return int(pc.sum(pc.greater(pc.fill_null(pc.list_value_length(col), 0), 0)).as_py() or 0)
    df = engine.read(path)
    return 0 if df is None else df.where(F.size("_unknown_members") > 0).limit(1000).count()


def _oldest_parked(engine: Engine, path: str) -> datetime | None:
    schema = engine.schema(path)
    if schema is None or "_parked_at" not in schema.fieldNames():
        return None
    col = _arrow_column(engine, path, "_parked_at")
    if col is not None:
        import pyarrow as pa
        import pyarrow.compute as pc

        micros = pc.min(pc.cast(col, pa.timestamp("us", tz="UTC"))).cast(pa.int64()).as_py()
    else:  # as microseconds: a collected timestamp would be the Python process's local time
        df = engine.read(path)
        micros = None if df is None else df.agg(F.unix_micros(F.min("_parked_at"))).first()[0]  # type: ignore[index]
    if micros is None:
        return None
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=int(micros))


def _span(d: timedelta) -> str:
    return f"{int(d.total_seconds())}s"


def plan_root(cfg: EnrichConfig) -> Path:
    return cfg.checkpoint_path / PLAN_ROOT


def next_pass(cfg: EnrichConfig, engine: Engine, instance: str) -> int:
    """The number of the next pass: one more than the last whose manifest row (its last write)
    is committed."""
    manifest = str(cfg.outputs.manifest)
    done = (engine.txn_version(manifest, f"enrich-{cfg.name}-{instance}-{SUFFIX}-manifest")
            if engine.exists(manifest) else None)
    return 0 if done is None else done + 1


def interrupted(cfg: EnrichConfig, engine: Engine, instance: str) -> int | None:
    """The number of a pass that was planned but did not finish (its plan exists, its manifest
    row is not committed), or None. Plans of finished passes (left by a crash right after the
    last write) are removed: a plan file here holds VACUUM back (:mod:`cdc_lake.retention`)."""
    n = next_pass(cfg, engine, instance)
    for f in (plan_root(cfg) / PLANS_DIR).glob("*.json"):
        if f.stem.isdigit() and int(f.stem) < n:
            f.unlink(missing_ok=True)
    return n if (plan_root(cfg) / PLANS_DIR / f"{n}.json").is_file() else None


def finished(cfg: EnrichConfig, n: int) -> None:
    """Pass ``n`` wrote everything: its plan is not needed for a replay any more."""
    (plan_root(cfg) / PLANS_DIR / f"{n}.json").unlink(missing_ok=True)


def no_facts(cfg: EnrichConfig, engine: Engine) -> DataFrame:
    """An empty frame of the fact source's batch schema (what the writer gets as its facts)."""
    from cdc_lake.enrich.columns import CORRUPT, SOURCE_FILE

    spark = engine.spark
    if cfg.fact.kind == "events":
        ev = cfg.fact.events
        assert ev is not None
        read = DataType.fromDDL(f"{ev.ddl}, `{CORRUPT}` string, `{SOURCE_FILE}` string")
        assert isinstance(read, StructType)
        return empty_frame(spark, read)
    from pyspark.sql.types import LongType, TimestampType

    table = engine.schema(str(cfg.fact.change_feed))
    fields = list(table.fields) if table is not None else []
    return empty_frame(spark, StructType([
        *fields, StructField("_change_type", StringType()), StructField("_commit_version", LongType()),
        StructField("_commit_timestamp", TimestampType())]))


class Passes:
    """The re-join passes of a run (:mod:`cdc_lake.enrich.rejoin`): finished after an
    interruption (``resumed``), run after the stream (``ran``, with ``reason``)."""

    def __init__(self) -> None:
        from cdc_lake.enrich.counts import EnrichStats

        self.stats = EnrichStats()
        self.resumed: list[int] = []
        self.ran: list[int] = []
        self.reason: str | None = None

    def run(self, cfg: EnrichConfig, engine: Engine, instance: str, run_id: str, n: int) -> None:
        """Pass ``n``: the enrichment writer on no fact change (its plans and transaction ids
        apart from the stream's, see the module doc); its plan removed once it wrote all."""
        from cdc_lake.enrich.writer import EnrichBatch

        batch = EnrichBatch(cfg, engine, instance=f"{instance}-{SUFFIX}", run_id=run_id,
                            stats=self.stats, plan_root=plan_root(cfg), rejoin=True)
        batch(no_facts(cfg, engine), n)
        finished(cfg, n)

    def summary(self) -> dict[str, Any] | None:
        if not (self.resumed or self.ran):
            return None
        s = self.stats
        return {"passes": [label(n) for n in self.resumed + self.ran],
                "resumed": [label(n) for n in self.resumed], "reason": self.reason,
                "released": s.released, "released_unknown": s.released_unknown,
                "restated": s.restated, "enriched_upserted": s.enriched_upserted,
                "aggregate_rows_touched": s.aggregate_rows_touched,
                "enriched_deleted": s.enriched_deleted, "dimension_versions": s.dimension_versions,
                "seconds": round(sum(s.batch_seconds), 3)}
