"""Per-run quarantine threshold: a run that quarantines too much fails instead of "succeeding".

Pipeline YAML (both keys optional; no ``quarantine:`` section = no threshold)::

    quarantine:
      max_fraction: 0.5   # fail when quarantined rows / events read in this run > 0.5
      max_rows: 1000      # fail when this run quarantined more than 1000 rows

Evaluated at the end of every incremental run, over what *this* run quarantined. When a limit is
exceeded the run still keeps what it wrote (the good rows are in their tables, the rejected ones
in the quarantine table: nothing is rolled back, nothing is lost), its summary gets status
``failed_quarantine_threshold`` plus a ``quarantine_threshold`` block with the limits, what was
exceeded and the top reasons with counts, and the job exits 4 with the same in its message.
A retry would find nothing new and succeed, so the Airflow task must not retry on exit 4.

Example::

    limits = QuarantineLimits(max_fraction=0.5, max_rows=None)
    limits.exceeded(quarantined=7, events=10)    # ['7 of 10 events quarantined (70.0%) > max_fraction 0.5']
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATUS = "failed_quarantine_threshold"


class QuarantineThresholdExceeded(RuntimeError):
    """The run quarantined more than ``quarantine.max_fraction`` / ``max_rows`` allow."""

    def __init__(self, message: str, summary: dict[str, Any]) -> None:
        self.summary = summary
        super().__init__(message)


@dataclass(frozen=True)
class QuarantineLimits:
    max_fraction: float | None = None
    max_rows: int | None = None

    @property
    def active(self) -> bool:
        return self.max_fraction is not None or self.max_rows is not None

    def exceeded(self, *, quarantined: int, events: int) -> list[str]:
        """What this run's counts exceed (empty: within limits)."""
        out = []
        if self.max_rows is not None and quarantined > self.max_rows:
            out.append(f"{quarantined} rows quarantined > max_rows {self.max_rows}")
        if self.max_fraction is not None and events > 0 and quarantined / events > self.max_fraction:
            out.append(f"{quarantined} of {events} events quarantined "
                       f"({100.0 * quarantined / events:.1f}%) > max_fraction {self.max_fraction:g}")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"max_fraction": self.max_fraction, "max_rows": self.max_rows}


def parse_quarantine_limits(r: Any) -> QuarantineLimits:
    """``quarantine:`` of a pipeline YAML, read with a :class:`cdc_lake.config.Reader`."""
    if r.raw.get("quarantine") is None:
        return QuarantineLimits()
    q = r.section("quarantine")
    q.check_known({"max_fraction", "max_rows"})
    frac = q.raw.get("max_fraction")
    if isinstance(frac, str) and re.fullmatch(r"\s*(0|0?\.\d+|\d+\.?\d*(e[+-]?\d+)?)\s*", frac, re.I):
        frac = float(frac)  # ${MAX_FRACTION:-0.5} expands to text
    if frac is not None and (isinstance(frac, bool) or not isinstance(frac, (int, float))
                             or not 0 <= frac < 1):
        raise q.fail("max_fraction", f"expected a number from 0 up to (not including) 1, e.g. 0.5, "
                     f"got {frac!r} (omit it for no fraction limit)")
    rows = q.int("max_rows", default=None, minimum=0)
    return QuarantineLimits(max_fraction=None if frac is None else float(frac), max_rows=rows)


_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")  # not the digits of a name (e1.yaml)


def reason_kind(reason: str) -> str:
    """A quarantine reason without its row's particulars (quoted values become ``'…'``, numbers
    ``N``), so that "line of 8 bytes '{bad'" and "line of 7 bytes '{bd'" count as one kind.

    Example: ``reason_kind("line of 8 bytes '{bad'")`` -> ``"line of N bytes '…'"``; digits inside
    a name stay (``not in e1.yaml``)."""
    return _NUMBER.sub("N", _QUOTED.sub("'…'", reason))


def top_reasons(quarantine_path: Path, run_id: str, n: int = 5) -> list[dict[str, Any]]:
    """The ``n`` most frequent kinds of quarantine reason of one run (:func:`reason_kind`), each
    with its count and one reason as it was recorded (``example``); read with delta-rs."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(quarantine_path)):
        return []
    table = DeltaTable(str(quarantine_path)).to_pyarrow_table(
        columns=["reason", "run_id"], filters=[("run_id", "=", run_id)])
    counts: Counter[str] = Counter()
    example: dict[str, str] = {}
    for r in table.column("reason").to_pylist():
        kind = reason_kind(str(r))
        counts[kind] += 1
        example.setdefault(kind, str(r))
    return [{"reason": kind, "count": c, "example": example[kind]} for kind, c in counts.most_common(n)]


def enforce(limits: QuarantineLimits, summary: dict[str, Any], quarantine_path: Path) -> None:
    """Mark ``summary`` failed and raise if this run exceeded a limit; else leave it alone."""
    if not limits.active:
        return
    exceeded = limits.exceeded(quarantined=int(summary.get("quarantined") or 0),
                               events=int(summary.get("events_read") or 0))
    if not exceeded:
        return
    try:
        reasons = top_reasons(quarantine_path, str(summary["run_id"]))
    except Exception as e:  # noqa: BLE001 - the threshold verdict must not depend on this read
        reasons = [{"reason": f"(top reasons unavailable: {type(e).__name__}: {e})", "count": None}]
    summary["status"] = STATUS
    summary["quarantine_threshold"] = {**limits.as_dict(), "exceeded": exceeded,
                                       "top_reasons": reasons}
    listed = "; ".join(f"{r['count']}x {r['reason']}" for r in reasons) or "none recorded"
    raise QuarantineThresholdExceeded(
        f"pipeline {summary.get('pipeline')!r} run {summary['run_id']!r}: quarantine threshold "
        f"exceeded: {', '.join(exceeded)}. Top reasons: {listed}. The rows that were good are "
        f"written; the rejected ones are in the quarantine table {quarantine_path} "
        f"(run_id = {summary['run_id']!r}). Fix the producer or the config, then re-land or "
        "accept them; raise quarantine.max_fraction / max_rows if this much is expected.",
        summary)
