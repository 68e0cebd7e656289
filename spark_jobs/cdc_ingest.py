"""spark-submit entry point: one pipeline run (availableNow/once), then exit.

    spark-submit spark_jobs/cdc_ingest.py --pipeline pipelines/shop_maxwell.yaml --run-id r1

Exit codes: 0 ok, 2 config/argument error, 3 stored state needs recovery (damaged checkpoint
file, table deleted behind the checkpoint, checkpoint set back behind its tables, a landing file
appended to after it was read; the message gives the command), 4 quarantine threshold
exceeded (data written, summary printed; do not retry), 75 pipeline locked by another run,
1 other failure.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

try:
    import cdc_lake  # noqa: F401  (installed: pip install -e . / the cluster image / --py-files)
except ImportError:  # a bare checkout: use the repo's src/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

EXIT_CONFIG, EXIT_STATE, EXIT_QUARANTINE, EXIT_LOCKED, EXIT_FAILED = 2, 3, 4, 75, 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        valid = sorted(o for a in self._actions for o in a.option_strings if o.startswith("--"))
        self.exit(EXIT_CONFIG, f"[cdc] ARGUMENT ERROR: {message}. Valid options: {', '.join(valid)}\n")


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    # No abbreviations (``--max-files 5`` or ``--full`` must not pass for an option), and an
    # unknown option names the valid ones: a mistyped run parameter never runs with defaults.
    p = _Parser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--pipeline", required=True, help="pipeline YAML file")
    p.add_argument("--run-id", default=None, help="run id (Airflow passes its run_id)")
    p.add_argument("--tables", default=None, help="comma-separated table subset (full refresh)")
    p.add_argument("--max-files-per-trigger", type=_positive_int, default=None)
    p.add_argument("--full-refresh", action="store_true")
    args = p.parse_args(argv)

    from cdc_lake.checkpoint import PipelineLocked
    from cdc_lake.checkpoint_log import PipelineStateError
    from cdc_lake.quarantine_limits import QuarantineThresholdExceeded
    from cdc_lake.summary import print_summary
    from cdc_lake.config import ConfigError, load_pipeline

    cfg = None
    try:
        cfg = load_pipeline(args.pipeline)
        if cfg.kind != "cdc":  # (tester: an enrich YAML ended in an AttributeError, exit 1)
            job = {"enrich": "enrich.py", "dimension": "dimension_refresh.py"}.get(cfg.kind, "")
            raise ConfigError(cfg.file, "kind", f"is {cfg.kind!r}; spark_jobs/cdc_ingest.py runs "
                              f"kind: cdc pipelines (use spark_jobs/{job})")
        tables = [t for t in (args.tables or "").split(",") if t] or None
        from cdc_lake.cdc.job import run_pipeline

        summary = run_pipeline(cfg, run_id=args.run_id, tables=tables,
                               max_files_per_trigger=args.max_files_per_trigger,
                               full_refresh=args.full_refresh)
    except ConfigError as e:
        print(f"[cdc] CONFIG ERROR: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except QuarantineThresholdExceeded as e:
        print_summary(e.summary, human=_human(e.summary))
        print(f"[cdc] QUARANTINE THRESHOLD EXCEEDED: {e}", file=sys.stderr, flush=True)
        return EXIT_QUARANTINE
    except PipelineStateError as e:
        print(f"[cdc] NEEDS RECOVERY: {e}", file=sys.stderr, flush=True)
        return EXIT_STATE
    except PipelineLocked as e:
        print(f"[cdc] PIPELINE LOCKED: {e}", file=sys.stderr, flush=True)
        return EXIT_LOCKED
    except Exception as e:  # noqa: BLE001 - print the Spark error for the Airflow log, then fail
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        if cfg is not None:
            from cdc_lake.cdc.state import missing_data_file

            state = missing_data_file(cfg, text)
            if state is not None:  # an operator has to act: say so last, exit 3 (no retry)
                print(f"[cdc] NEEDS RECOVERY: {state}", file=sys.stderr, flush=True)
                return EXIT_STATE
        from cdc_lake.spark_session import failure_line, stopped_context_hint

        hint = stopped_context_hint(text)
        if hint is not None:
            print(f"[cdc] {hint}", file=sys.stderr, flush=True)
        print(f"[cdc] RUN FAILED: {failure_line(e)} (traceback above)", file=sys.stderr, flush=True)
        return EXIT_FAILED
    print_summary(summary, human=_human(summary))
    return 0


def _human(s: dict) -> list[str]:
    lines = [f"[cdc] pipeline {s['pipeline']} run {s['run_id']}: {s['batches']} batch(es) "
             f"{s['batch_ids']}, {s['events_read']} events read, {s['quarantined']} quarantined, "
             f"{s['ddl_events']} DDL, engine {s['engine']}, {s['duration_s']} s, "
             f"status {s['status']}"]
    if s.get("quarantined") and s.get("full_refresh"):
        new = int(s.get("newly_quarantined") or 0)
        lines.append(f"[cdc]   LEFT OUT {s['quarantined']} of {s['events_read']} events (in the "
                     "quarantine table" + (f"; {new} of them added by this refresh: lines the "
                                           "runs that first read them stored, which the YAML "
                                           "now rejects; the others" if new else "") +
                     " from the runs that first read them)")
    elif s.get("quarantined"):
        lines.append(f"[cdc]   QUARANTINED {s['quarantined']} of {s['events_read']} events "
                     f"(see the quarantine table; run_id = {s['run_id']})")
    for r in (s.get("quarantine_threshold") or {}).get("top_reasons", []):
        lines.append(f"[cdc]     {r['count']}x {r['reason']}")
    for name, t in s["tables"].items():
        at = ("no table yet" if t["delta_version"] is None  # (tester: "Delta version None")
              else f"Delta version {t['delta_version']}")
        lines.append(f"[cdc]   {name:<16} +{t['inserted']} ~{t['updated']} -{t['deleted']} -> {at}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
