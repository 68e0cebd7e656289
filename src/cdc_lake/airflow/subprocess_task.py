"""Run one of cdc-lake's Python CLIs as a child process of an Airflow task, streaming its output.

Used by the tasks that do not need Spark (capture, maintenance): the child gets its own memory
(delta-rs, pymysql) and its exit code carries the outcome (0 ok, 2 config, 75 locked, else
failure), exactly like the spark-submit tasks.

Example::

    result = run_module(self.log, [sys.executable, "-m", "cdc_lake.maintenance", "--pipeline", f],
                        summary_prefix="CDC_MAINTENANCE_SUMMARY ")
    result.code, result.summary, result.tail
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk.exceptions import AirflowException


@dataclass
class ModuleResult:
    code: int
    summary: dict[str, Any] | None = None
    tail: list[str] = field(default_factory=list)


def run_module(log: Any, argv: list[str], *, summary_prefix: str, env: dict[str, str] | None = None,
               timeout_s: float | None = None) -> ModuleResult:
    """Run ``argv``; every output line goes to ``log``; the line starting with ``summary_prefix``
    is parsed as the JSON summary. Raises ``AirflowException`` on timeout (the child is killed)."""
    result = ModuleResult(code=-1)
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith(summary_prefix):
                try:
                    result.summary = json.loads(line[len(summary_prefix):])
                except ValueError:
                    log.warning("unreadable summary line: %s", line[:500])
                continue
            log.info("%s", line)
            result.tail = [*result.tail[-19:], line]
        try:
            result.code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AirflowException(f"{argv[2] if len(argv) > 2 else argv[0]} did not finish in "
                                   f"{timeout_s} s; killed") from None
    return result
