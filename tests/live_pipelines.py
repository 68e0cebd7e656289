"""Pipeline data for the live Airflow tests: the repo's pipelines copied for a test, one picked
by format, hand-written Maxwell change files with their expected tables (``MaxwellScenario``)
and a task's run summary read back through the REST API.

Example::

    cfg = pick_pipeline(copy_dir, "maxwell")
    sc = MaxwellScenario(cfg)
    sc.write_batch(0)           # landing files + sc.expected
    ...                         # trigger the DAG, wait for success
    sc.assert_lake_matches()
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from live_airflow import REPO, LiveAirflow

# ----------------------------------------------------------------------------- pipeline data


def real_pipeline_parts() -> tuple[bool, str]:
    """(ready, reason): the real DAG file and Spark job exist in the repo."""
    missing = [p for p in ("dags/cdc_pipelines.py", "spark_jobs/cdc_ingest.py", "src/cdc_lake/cdc/job.py")
               if not (REPO / p).is_file()]
    if missing:
        return False, f"not written yet: {', '.join(missing)} (real pipeline tests skipped)"
    return True, ""


def copy_pipelines_for_test(src: Path, dst: Path) -> list[Path]:
    """Copy ``src/*.yaml`` to ``dst`` with ``schedule`` removed and ``retries: 0``.

    Without a schedule, unpausing a DAG creates no scheduled run that would race the runs a test
    triggers; without retries a failing job fails the test in one attempt instead of three.
    Everything else (paths with ``${CDC_DATA_DIR}``, tables, keys, engine) is the real config.
    """
    import yaml

    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for f in sorted([*src.glob("*.yaml"), *src.glob("*.yml")]):
        try:
            raw = yaml.safe_load(f.read_text(encoding="utf-8"))
        except yaml.YAMLError:
            raw = None
        if isinstance(raw, dict):
            raw.pop("schedule", None)
            raw["retries"] = 0
            text = yaml.safe_dump(raw, sort_keys=False)
        else:  # keep broken files broken: the DAG factory must still report them
            text = f.read_text(encoding="utf-8")
        (dst / f.name).write_text(text, encoding="utf-8")
        out.append(dst / f.name)
    return out


def pick_pipeline(pipelines_dir: Path, fmt: str = "maxwell"):
    """The first valid pipeline config of format ``fmt`` (prefers ``shop_<fmt>``), or None."""
    if str(REPO / "src") not in sys.path:
        sys.path.insert(0, str(REPO / "src"))
    from cdc_lake.config import load_all

    configs, _errors = load_all(pipelines_dir)
    found = [c for c in configs if getattr(c, "source_format", None) == fmt]  # cdc kind only
    found.sort(key=lambda c: (c.name != f"shop_{fmt}", c.name))
    return found[0] if found else None


class MaxwellScenario:
    """Hand-written Maxwell change files for every table of a pipeline, and the expected result.

    Each table gets rows keyed 1..N with a string column ``note``; the key columns get ints (or
    strings where the config types them as string). ``write_batch`` lands one file per step and
    updates :attr:`expected` (key tuple -> note of the live row) so tests can compare the Delta
    tables exactly. Positions increase monotonically across batches (``mysql-bin.000001:N``).
    """

    BATCHES = [
        # one inner list per landing file: (op, id, note)
        [[("insert", 1, "a1"), ("insert", 2, "b1"), ("insert", 3, "c1")],
         [("update", 2, "b2"), ("insert", 4, "d1"), ("delete", 3, None), ("update", 1, "a2")]],
        [[("insert", 5, "e1"), ("update", 4, "d2")],
         [("delete", 1, None), ("insert", 6, "f1")]],
    ]

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.pos = 1000
        self.files_written = 0
        self.events_written = 0
        self.events_processed = 0
        self._mtime = 0.0
        # per table: row events landed / already processed (SCD1 summaries count one per event
        # here, as no key changes twice within one landing file)
        self.table_events_written: dict[str, int] = {t: 0 for t in cfg.tables}
        self.table_events_processed: dict[str, int] = {t: 0 for t in cfg.tables}
        self.expected: dict[str, dict[tuple, str]] = {t: {} for t in cfg.tables}
        self._rows: dict[str, dict[int, dict[str, Any]]] = {t: {} for t in cfg.tables}

    def _key_value(self, table: str, col: str, i: int) -> Any:
        typ = self.cfg.tables[table].types.get(col, "bigint")
        return f"k{i}" if typ == "string" else i

    def key_of(self, table: str, i: int) -> tuple:
        return tuple(self._key_value(table, k, i) for k in self.cfg.tables[table].keys)

    def _line(self, table: str, op: str, i: int, note: str | None) -> str:
        t = self.cfg.tables[table]
        self.pos += 100
        base = {k: self._key_value(table, k, i) for k in t.keys}
        old = None
        if op == "delete":
            data = dict(self._rows[table][i])
            del self._rows[table][i]
            self.expected[table].pop(self.key_of(table, i), None)
        else:
            data = {**base, "note": note}
            if op == "update":
                old = {"note": self._rows[table][i]["note"]}
            self._rows[table][i] = data
            self.expected[table][self.key_of(table, i)] = note
        ev = {"database": t.database or self.cfg.source_database or "shop", "table": t.source_table,
              "type": op, "ts": 1_790_000_000 + self.pos // 100, "xid": self.pos, "xoffset": 0,
              "commit": True, "position": f"mysql-bin.000001:{self.pos}",
              "primary_key_columns": list(t.keys), "data": data}
        if old is not None:
            ev["old"] = old
        return json.dumps(ev)

    def write_batch(self, n: int) -> list[Path]:
        """Land batch ``n`` (0-based) of :attr:`BATCHES`; returns the new files."""
        landing = Path(self.cfg.landing_path)
        landing.mkdir(parents=True, exist_ok=True)
        files = []
        for steps in self.BATCHES[n]:
            lines = [self._line(table, op, i, note) for table in self.cfg.tables for op, i, note in steps]
            for table in self.cfg.tables:
                self.table_events_written[table] += len(steps)
            self.files_written += 1
            self.events_written += len(lines)
            f = landing / f"maxwell-{self.files_written:06d}.json"
            tmp = landing / f".{f.name}.tmp"
            tmp.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
            # Spark's file source orders new files by modification time; files written in the
            # same millisecond would come in any order. Landed files arrive one after another.
            self._mtime = max(time.time(), self._mtime + 1.0)
            os.utime(tmp, (self._mtime, self._mtime))
            os.replace(tmp, f)
            files.append(f)
        return files

    def pending_table_events(self) -> dict[str, int]:
        return {t: self.table_events_written[t] - self.table_events_processed[t] for t in self.cfg.tables}

    def mark_processed(self) -> None:
        self.events_processed = self.events_written
        self.table_events_processed = dict(self.table_events_written)

    def scd1_tables(self) -> list[str]:
        return [t for t, tc in self.cfg.tables.items() if tc.scd == 1]

    # -- checking the lake ----------------------------------------------------

    def live_rows(self, table: str) -> list[dict[str, Any]]:
        from deltalake import DeltaTable

        rows = DeltaTable(str(self.cfg.tables[table].path)).to_pyarrow_table().to_pylist()
        if self.cfg.tables[table].scd == 2:
            rows = [r for r in rows if r.get("_is_current")]
        return rows

    def assert_lake_matches(self) -> None:
        """Every table holds exactly the expected live rows: no duplicates, nothing missing."""
        problems = []
        for table, want in self.expected.items():
            rows = self.live_rows(table)
            keys = [tuple(r[k] for k in self.cfg.tables[table].keys) for r in rows]
            dups = sorted({k for k in keys if keys.count(k) > 1})
            got = {tuple(r[k] for k in self.cfg.tables[table].keys): r.get("note") for r in rows}
            if dups:
                problems.append(f"{table}: duplicate keys {dups}")
            if got != want:
                problems.append(f"{table}: got {sorted(got.items())}, want {sorted(want.items())}")
        assert not problems, "; ".join(problems)


def find_summary(af: LiveAirflow, dag_id: str, run_id: str) -> tuple[str | None, dict | None]:
    """(task_id, run summary) from the XCom ``return_value`` of whichever task returned one."""
    for ti in af.task_instances(dag_id, run_id):
        value = af.xcom(dag_id, run_id, ti["task_id"], map_index=ti.get("map_index", -1))
        if isinstance(value, dict) and "tables" in value and "pipeline" in value:
            return ti["task_id"], value
    return None, None
