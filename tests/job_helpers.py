"""Tiny hand-written Maxwell pipelines for the job tests (test_job_*.py, test_full_refresh.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from cdc_lake.config import load_pipeline

YAML = """pipeline: {name}
source: {{format: maxwell, path: landing, database: shop}}
storage: {{root: {root}}}
engine: {{name: deltalake}}
tables:
  orders: {{keys: [id]}}
  customers: {{keys: [id]}}
{extra}"""


def event(i: int, table: str = "orders", typ: str = "insert", **data: Any) -> str:
    """One Maxwell line; ``i`` orders it (binlog position) and is the default key."""
    row = {"id": i, "status": f"s{i}", **data}
    return json.dumps({"database": "shop", "table": table, "type": typ, "ts": 1795000000 + i,
                       "xid": 100 + i, "xoffset": 0, "position": f"mysql-bin.000001:{1000 + i}",
                       "data": row})


def land(landing: Path, name: str, *lines: str) -> Path:
    tmp = landing / f".{name}.tmp"
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, landing / name)
    return landing / name


def pipeline(tmp_path: Path, name: str = "jobtest", root: str = "lake", extra: str = "",
             yaml_name: str = "p.yaml"):  # type: ignore[no-untyped-def]
    (tmp_path / "landing").mkdir(exist_ok=True)
    p = tmp_path / yaml_name
    p.write_text(YAML.format(name=name, root=root, extra=extra), encoding="utf-8")
    return load_pipeline(p)


def rows(path: Path) -> dict[int, Any]:
    from deltalake import DeltaTable

    return {r["id"]: r.get("status") for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()}


def moved_aside(path: Any, then: str = "", suffix: str = ".damaged") -> str:
    """Regex of the printed move-aside command ``mv <path> <path><suffix>-<UTC stamp>``
    (``cdc_lake.paths.mv_aside``), followed by ``then``."""
    p = re.escape(str(path))
    return rf"mv {p} {p}{re.escape(suffix)}-\d{{8}}T\d{{6}}Z" + re.escape(then)


def run_cli(spark, yaml: Path, *args: str, run_id: str = "cli"):  # type: ignore[no-untyped-def]
    """``spark_jobs/cdc_ingest.py --pipeline <yaml> --run-id <run_id> <args>`` in this process:
    its ``main()`` on the test's Spark session (``getOrCreate`` finds it), as a
    ``CompletedProcess`` holding the exit code main() returns and what it printed.

    The same exit codes and messages as the script run as a process (``sys.exit(main())``) without
    a JVM start per call; that the entry point works as a process is shown by test_job_cli.py,
    test_crash_recovery.py and one state test (test_job_state.py), which run it so.
    """
    import contextlib
    import importlib.util
    import io
    import subprocess

    assert spark is not None  # the session main() will find (a fixture, so it exists first)
    job = Path(__file__).resolve().parents[1] / "spark_jobs" / "cdc_ingest.py"
    spec = importlib.util.spec_from_file_location("cdc_ingest_cli", job)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    argv = ["--pipeline", str(yaml), "--run-id", run_id, *args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = mod.main(argv)
    return subprocess.CompletedProcess([str(job), *argv], code, out.getvalue(), err.getvalue())


def stream_stage_tasks(spark, run):  # type: ignore[no-untyped-def]
    """``(run(), tasks)``: ``tasks`` maps each Spark stage that the streaming queries started
    during ``run()`` ran (their jobs: Spark's job group is the query's run id) to its number of
    tasks, from Spark's status tracker."""
    import time

    from pyspark.sql.streaming import StreamingQueryListener

    class Started(StreamingQueryListener):
        def __init__(self) -> None:
            self.run_ids: list[str] = []

        def onQueryStarted(self, event) -> None:  # type: ignore[no-untyped-def]
            self.run_ids.append(str(event.runId))

        def onQueryProgress(self, event) -> None:  # type: ignore[no-untyped-def]
            pass

        def onQueryIdle(self, event) -> None:  # type: ignore[no-untyped-def]
            pass

        def onQueryTerminated(self, event) -> None:  # type: ignore[no-untyped-def]
            pass

    listener = Started()
    spark.streams.addListener(listener)
    try:
        result = run()
        deadline = time.monotonic() + 30  # the listener bus delivers asynchronously
        while not listener.run_ids and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        spark.streams.removeListener(listener)
    assert listener.run_ids, "no streaming query started"
    tracker = spark.sparkContext.statusTracker()
    tasks: dict[int, int] = {}
    for run_id in listener.run_ids:
        for job in tracker.getJobIdsForGroup(run_id):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info else []:
                s = tracker.getStageInfo(stage)
                if s is not None:
                    tasks[stage] = s.numTasks
    return result, tasks
