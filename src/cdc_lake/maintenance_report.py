"""The maintenance run's report on the console: one line per table, the machine-readable summary
line (``CDC_MAINTENANCE_SUMMARY {json}``), and the exit code (:mod:`cdc_lake.maintenance`).

Example::

    code = print_report(run_maintenance(cfg))   # 0 ok, 1 a table failed, 3 needs recovery
"""

from __future__ import annotations

import json
import sys
from typing import Any

from cdc_lake.maintenance import (EXIT_FAILED, EXIT_NEEDS_RECOVERY, MAINTENANCE_SUMMARY_PREFIX,
                                  NEEDS_RECOVERY)

# status -> (the table's line, the summary's clause naming the tables), in the summary's order
_NEEDS = {"damaged": ("its Delta log cannot be read", "the Delta log of {} cannot be read"),
          "changed_behind": ("not maintained, changed behind the pipeline",
                             "{} changed behind it (not maintained)"),
          "missing_file": ("not maintained, a data file is gone",
                           "{} lost a data file or the table (not maintained)"),
          "missing_table": ("the table is gone", "{} lost a data file or the table (not maintained)"),
          "owned_elsewhere": ("not maintained, another pipeline's table",
                              "{}: another pipeline's (not maintained)")}


def print_report(report: dict[str, Any]) -> int:
    """Print ``report`` (:func:`~cdc_lake.maintenance.run_maintenance`) and return the exit code."""
    for h in report["held_by_unloadable"]:
        print(f"[maintenance] WARNING: VACUUM and log cleanup of every table held back: {h}; it "
              "may read these tables' history", file=sys.stderr)
    for name, t in report["tables"].items():
        if t["status"] in (*NEEDS_RECOVERY, "failed"):
            what = (f"NEEDS RECOVERY: {_NEEDS[t['status']][0]}" if t["status"] in _NEEDS
                    else "FAILED")
            print(f"[maintenance] {name:<28} {what} ({t['path']}): {t['error']}"
                  + (f". Recovery: {t['recovery']}" if t.get("recovery") else ""), file=sys.stderr)
            continue
        if t["status"] != "ok":
            print(f"[maintenance] {name:<28} {t['status']}")
            continue
        print(_table_line(name, t))
    print(MAINTENANCE_SUMMARY_PREFIX + json.dumps(report, default=str), flush=True)
    clauses: dict[str, list[str]] = {clause: [] for _, clause in _NEEDS.values()}
    for n in report["failed"]:
        if (status := report["tables"][n]["status"]) in _NEEDS:
            clauses[_NEEDS[status][1]].append(n)
    if any(clauses.values()):
        what = "; ".join(clause.format(", ".join(map(repr, names)))
                         for clause, names in clauses.items() if names)
        print(f"[maintenance] NEEDS RECOVERY: pipeline {report['pipeline']!r}: {what} (recovery "
              "above); the other tables were maintained", file=sys.stderr)
        return EXIT_NEEDS_RECOVERY
    if report["failed"]:
        print(f"[maintenance] FAILED: pipeline {report['pipeline']!r}: "
              f"{', '.join(map(repr, report['failed']))} (errors above); the other tables were "
              "maintained", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _table_line(name: str, t: dict[str, Any]) -> str:
    vac = t.get("vacuum", {})
    held = f", held by {vac['held_back_by']}" if vac.get("held_back_by") else ""
    line = (f"[maintenance] {name:<28} files {t['files_before']} -> {t['files_after']}, "
            f"bytes {t['bytes_before']} -> {t['bytes_after']}, vacuumed "
            f"{vac.get('files_removed', vac.get('would_remove', 0))} + "
            f"{vac.get('change_files_removed', vac.get('change_files_would_remove', 0))} "
            f"change-data (retention {vac.get('retention_hours')} h{held})")
    if t.get("log_cleanup", {}).get("skipped"):
        line += f"; {t['log_cleanup']['reason']}"
    return line
