"""Independent reference model of an enrichment pipeline (``kind: enrich``, issue 7).

Plain Python that shares no code with ``cdc_lake.enrich`` (nor copies its logic): it replays the
upstream commits itself and computes, after every run of the job, the rows the enriched fact
table, the pending table and each aggregate table must hold, following
``/work/team/ENRICH_SPEC.md`` / ``docs/enrichment.md``:

- Batches: the fact table's change feed, ``max_versions_per_trigger`` Delta versions per
  micro-batch, availableNow runs (a run processes every fact version committed before it
  starts). Dimensions are read at their latest version when the batch runs — in these tests no
  commit happens during a run, so every batch of a run sees the dimensions as of the run start.
- Joins in config order; SCD1 = row by key; SCD2 = version with
  ``_valid_from <= event_time < _valid_to`` (``_valid_to`` null = open). A dimension is
  *missing* when its ``on`` columns are null (e.g. they come from an earlier missing
  dimension), the event time is null (SCD2), or no row/version matches.
- Per batch: for each fact key a commit touched, the fact's state after that commit (the row
  the fact table holds under the key, or none: deleted, or an UPDATE moved the row to another
  key); the newest such state per key wins.
  Keys without a change in the batch: pending rows are re-joined (all matched → released;
  parked in an earlier batch and ``wait`` elapsed → released with ``_unknown_members``);
  enriched rows flagged unknown are re-joined and *restated* once every member matches.
  Keys with a change: a change whose version is not newer than the stored ``_fact_version`` is
  ignored (replay); a delete removes the key from enriched and pending; an upsert is joined
  with the current dimensions → enriched (and removed from pending) or parked (and removed from
  enriched).
- Aggregates: every enriched row contributes ``count`` 1 and each sum to the group
  ``group_by`` (+ ``day`` of the event time); an enriched row that changes withdraws exactly what
  it contributed before (point-in-time attributes), a group at count 0 disappears.

The waiting time is modelled in batches: ``wait_zero=True`` is ``late_members: {wait: 0s}``
(released at the next batch after parking), ``False`` a wait longer than any test.

- Runs without fact changes for the parked facts (issue 7: parked facts are "re-joined by every
  later micro-batch/run"): after a run's micro-batches, if a dimension table has a newer
  version than the last batch (or re-join pass) saw and there are pending facts or enriched
  facts flagged unknown — or, with ``wait_zero``, a pending fact was parked in an earlier run
  and is still pending — the run makes one re-join pass: a batch with no fact change. It is
  not a micro-batch of the stream (``passes``, not ``batches``).

Example::

    cfg = ModelConfig(fact_keys=("order_id", "line_no"), dims=(...), event_time="order_time",
                      aggregates=(...,), wait_zero=True)
    model = EnrichModel(cfg)
    model.apply(Commit("order_items", ("order_id", "line_no"), upserts=(row,), create=True))
    model.run()                       # one availableNow run of the job
    model.enriched, model.pending, model.aggregate("revenue_by_category_day")
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

Key = tuple[Any, ...]
Row = dict[str, Any]


@dataclass(frozen=True)
class Commit:
    """One Delta commit of one upstream table: a MERGE on ``merge_on`` (or the first write).

    ``upserts`` are full rows (inserted, or replacing the row with the same ``merge_on`` key);
    ``deletes`` are rows holding at least the ``merge_on`` columns; ``rekeys`` are
    ``(old row, new row)`` pairs: an UPDATE in place that changes the row's ``merge_on`` key.
    """

    table: str
    merge_on: tuple[str, ...]
    upserts: tuple[Row, ...] = ()
    deletes: tuple[Row, ...] = ()
    create: bool = False
    rekeys: tuple[tuple[Row, Row], ...] = ()


@dataclass(frozen=True)
class DimSpec:
    """A dimension: ``on`` = ((enriched column, dimension key column), ...), ``columns`` =
    ((output column, dimension column), ...). SCD2 tables carry ``_valid_from``/``_valid_to``."""

    name: str
    table: str
    keys: tuple[str, ...]
    scd: int
    on: tuple[tuple[str, str], ...]
    columns: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class AggSpec:
    """``sums`` = ((column, (SQL text for the YAML, python function of an enriched row)), ...)."""

    name: str
    group_by: tuple[str, ...]
    time_bucket: str | None
    sums: tuple[tuple[str, tuple[str, Callable[[Row], Any]]], ...]

    def group_columns(self) -> tuple[str, ...]:
        return self.group_by + (("day",) if self.time_bucket == "day" else ())


@dataclass(frozen=True)
class ModelConfig:
    fact_table: str
    fact_keys: tuple[str, ...]
    dims: tuple[DimSpec, ...]
    event_time: str
    aggregates: tuple[AggSpec, ...]
    wait_zero: bool = True
    max_versions_per_trigger: int = 1


@dataclass
class BatchLog:
    batch_id: int
    fact_versions: tuple[int, ...]
    dimension_versions: dict[str, int]


@dataclass
class Counters:
    parked: int = 0
    released: int = 0
    released_unknown: int = 0
    restated: int = 0
    upserted: int = 0
    deleted: int = 0


@dataclass
class _Table:
    version: int = -1
    rows: dict[Key, Row] = field(default_factory=dict)


def _day(value: Any) -> date | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC).date()
    return value if isinstance(value, date) else None


class EnrichModel:
    """The truth an enrichment pipeline must converge to (see the module docstring)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self.tables: dict[str, _Table] = {}
        self._queued: list[tuple[int, list[tuple[Key, Row | None]]]] = []  # (fact version, states)
        self.enriched: dict[Key, Row] = {}
        self.pending: dict[Key, Row] = {}
        self._agg: dict[str, dict[Key, Row]] = {a.name: {} for a in cfg.aggregates}
        self.batches: list[BatchLog] = []
        self.passes: list[BatchLog] = []  # re-join passes (no fact change)
        self._evaluations = 0  # batches and passes, in order (what "parked earlier" compares)
        self.runs: list[Counters] = []

    # ---------------------------------------------------------------- upstream commits
    def apply(self, commit: Commit) -> int:
        """Apply one upstream commit; returns the table's new Delta version."""
        t = self.tables.setdefault(commit.table, _Table())
        if commit.create and t.version >= 0:
            raise ValueError(f"{commit.table} already exists")
        t.version += 1
        touched: list[Row] = []  # rows whose key this commit touched (before or after it)
        for row in commit.upserts:
            k = tuple(row[c] for c in commit.merge_on)
            touched.append(dict(row))
            t.rows[k] = dict(row)
        for row in commit.deletes:
            k = tuple(row[c] for c in commit.merge_on)
            old = t.rows.pop(k, None)
            if old is not None:
                touched.append(old)
        for old_row, new_row in commit.rekeys:
            old = t.rows.pop(tuple(old_row[c] for c in commit.merge_on))
            touched += [old, dict(new_row)]
            t.rows[tuple(new_row[c] for c in commit.merge_on)] = dict(new_row)
        if commit.table == self.cfg.fact_table:
            # The fact's state after this commit, per fact key it touched: the row the table
            # holds under that key now, or None (deleted, or its key changed away). Read from
            # the table's rows, not from change-feed images.
            fk = self.cfg.fact_keys
            now = {tuple(r[c] for c in fk): r for r in t.rows.values()}
            keys = dict.fromkeys(tuple(r[c] for c in fk) for r in touched)
            self._queued.append((t.version, [(k, dict(now[k]) if k in now else None) for k in keys]))
        return t.version

    # ---------------------------------------------------------------- joins
    def _lookup(self, d: DimSpec, row: Row) -> Row | None:
        vals = tuple(row.get(c) for c, _ in d.on)
        if any(v is None for v in vals):
            return None
        rows = self.tables.get(d.table, _Table()).rows.values()
        cands = [r for r in rows if tuple(r.get(k) for _, k in d.on) == vals]
        if d.scd == 1:
            return cands[0] if cands else None
        t = row.get(self.cfg.event_time)
        if t is None:
            return None
        for r in cands:
            if r["_valid_from"] <= t and (r.get("_valid_to") is None or t < r["_valid_to"]):
                return r
        return None

    def join(self, fact: Row) -> tuple[Row, list[str]]:
        """Fact columns + every dimension's output columns (null when missing), missing dims."""
        out = {k: v for k, v in fact.items()}
        missing: list[str] = []
        for d in self.cfg.dims:
            hit = self._lookup(d, out)
            if hit is None:
                missing.append(d.name)
            for o, c in d.columns:
                out[o] = None if hit is None else hit.get(c)
        return out, missing

    def _fact_columns(self, row: Row) -> Row:
        dim_out = {o for d in self.cfg.dims for o, _ in d.columns}
        return {k: v for k, v in row.items() if not k.startswith("_") and k not in dim_out}

    # ---------------------------------------------------------------- aggregates
    def _contribute(self, row: Row, sign: int) -> None:
        for a in self.cfg.aggregates:
            g = tuple(row.get(c) for c in a.group_by)
            if a.time_bucket == "day":
                g += (_day(row.get(self.cfg.event_time)),)
            groups = self._agg[a.name]
            cur = groups.setdefault(g, {"count": 0, **{n: 0 for n, _ in a.sums}})
            cur["count"] += sign
            for n, (_, fn) in a.sums:
                cur[n] += sign * fn(row)
            if cur["count"] == 0:
                del groups[g]

    def _set_enriched(self, k: Key, row: Row | None) -> None:
        old = self.enriched.pop(k, None)
        if old is not None:
            self._contribute(old, -1)
        if row is not None:
            self.enriched[k] = row
            self._contribute(row, +1)

    # ---------------------------------------------------------------- runs and batches
    def run(self) -> Counters:
        """One availableNow run: every queued fact version, in bounded micro-batches."""
        c = Counters()
        n = max(1, self.cfg.max_versions_per_trigger)
        queued, self._queued = self._queued, []
        run_start = self._evaluations
        for i in range(0, len(queued), n):
            self._batch(queued[i:i + n], c)
        seen = (self.batches + self.passes)
        last = max(seen, key=lambda x: x.batch_id).dimension_versions if seen else None
        now = {d.name: self.tables[d.table].version for d in self.cfg.dims if d.table in self.tables}
        flagged = bool(self.pending) or any(e["_unknown_members"] for e in self.enriched.values())
        waited = self.cfg.wait_zero and any(p["_parked_batch"] < run_start for p in self.pending.values())
        if (last is not None and last != now and flagged) or waited:
            self._batch([], c, rejoin=True)
        self.runs.append(c)
        return c

    def _batch(self, versions: list[tuple[int, list[tuple[Key, Row | None]]]], c: Counters,
               rejoin: bool = False) -> None:
        b = self._evaluations
        self._evaluations += 1
        (self.passes if rejoin else self.batches).append(BatchLog(b, tuple(v for v, _ in versions), {
            d.name: self.tables[d.table].version for d in self.cfg.dims if d.table in self.tables}))
        latest: dict[Key, tuple[int, str, Row]] = {}
        for v, states in versions:
            for key, row in states:
                latest[key] = (v, "delete", {}) if row is None else (v, "upsert", row)
        for k in sorted(self.pending, key=repr):
            if k in latest:
                continue
            p = self.pending[k]
            out, missing = self.join(self._fact_columns(p))
            if not missing:
                del self.pending[k]
                self._set_enriched(k, {**out, "_unknown_members": [], "_fact_version": p["_fact_version"]})
                c.released += 1
            elif self.cfg.wait_zero and b > p["_parked_batch"]:
                del self.pending[k]
                self._set_enriched(k, {**out, "_unknown_members": missing,
                                       "_fact_version": p["_fact_version"]})
                c.released_unknown += 1
            else:
                p["_missing"] = missing
        for k in sorted(self.enriched, key=repr):
            e = self.enriched[k]
            if k in latest or not e["_unknown_members"]:
                continue
            out, missing = self.join(self._fact_columns(e))
            if not missing:
                self._set_enriched(k, {**out, "_unknown_members": [], "_fact_version": e["_fact_version"]})
                c.restated += 1
        for k, (v, kind, row) in sorted(latest.items(), key=lambda kv: repr(kv[0])):
            stored = self.enriched.get(k) or self.pending.get(k)
            if stored is not None and v <= stored["_fact_version"]:
                continue
            if kind == "delete":
                if k in self.enriched:
                    c.deleted += 1
                self._set_enriched(k, None)
                self.pending.pop(k, None)
                continue
            fact = self._fact_columns(row)
            out, missing = self.join(fact)
            if missing:
                self._set_enriched(k, None)
                self.pending[k] = {**fact, "_missing": missing, "_fact_version": v, "_parked_batch": b}
                c.parked += 1
            else:
                self.pending.pop(k, None)
                self._set_enriched(k, {**out, "_unknown_members": [], "_fact_version": v})
                c.upserted += 1

    # ---------------------------------------------------------------- expected tables
    def aggregate(self, name: str) -> list[Row]:
        a = next(x for x in self.cfg.aggregates if x.name == name)
        return [{**dict(zip(a.group_columns(), g)), **vals} for g, vals in self._agg[name].items()]

    def enriched_rows(self) -> list[Row]:
        return [dict(r) for r in self.enriched.values()]

    def pending_rows(self) -> list[Row]:
        return [{k: v for k, v in r.items() if k != "_parked_batch"} for r in self.pending.values()]


# -------------------------------------------------------------------- comparison helpers
def norm(value: Any) -> Any:
    """Comparable form: aware datetimes in UTC, lists as tuples, maps as sorted tuples."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    if isinstance(value, list | tuple):
        return tuple(norm(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((k, norm(v)) for k, v in value.items()))
    return value


def row_set(rows: Iterable[Row], columns: Iterable[str]) -> set[tuple[Any, ...]]:
    cols = tuple(columns)
    return {tuple(norm(r.get(c)) for c in cols) for r in rows}


def diff_rows(expected: Iterable[Row], actual: Iterable[Row], columns: Iterable[str],
              keys: Iterable[str], table: str) -> list[str]:
    """Human-readable differences between two row sets on ``columns``, matched by ``keys``."""
    cols, ks = tuple(columns), tuple(keys)
    exp, act = list(expected), list(actual)
    problems: list[str] = []
    by_key: dict[str, dict[Key, list[Row]]] = {"exp": {}, "act": {}}
    for side, rows in (("exp", exp), ("act", act)):
        for r in rows:
            by_key[side].setdefault(tuple(norm(r.get(k)) for k in ks), []).append(r)
    for k in sorted(set(by_key["exp"]) | set(by_key["act"]), key=repr):
        e, a = by_key["exp"].get(k, []), by_key["act"].get(k, [])
        if len(a) > 1:
            problems.append(f"{table}: key {k} appears {len(a)} times")
        if not e:
            problems.append(f"{table}: unexpected row {_show(a[0], cols)}")
        elif not a:
            problems.append(f"{table}: missing row {_show(e[0], cols)}")
        else:
            bad = {c: (norm(e[0].get(c)), norm(a[0].get(c))) for c in cols
                   if norm(e[0].get(c)) != norm(a[0].get(c))}
            if bad:
                problems.append(f"{table}: key {k}: " + ", ".join(
                    f"{c} expected {x!r} got {y!r}" for c, (x, y) in bad.items()))
    return problems


def _show(row: Row, cols: tuple[str, ...]) -> str:
    return "{" + ", ".join(f"{c}={norm(row.get(c))!r}" for c in cols) + "}"
