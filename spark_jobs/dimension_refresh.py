"""spark-submit entry point: refresh one dimension table from the snapshot of one date, then exit.

    spark-submit spark_jobs/dimension_refresh.py --pipeline pipelines/product_categories.yaml \
        --date 2026-01-02 [--run-id r1]

Exit codes: 0 ok (also: the date is older than the last applied one, or already applied —
nothing changed, the summary says which), 2 config/argument error, 3 the snapshot is not a valid
full snapshot (NULL/duplicate keys, a table column missing, a value the table's column type
cannot hold exactly; do not retry), 66 the snapshot file of
that date is missing (the message names the expected path; retried by Airflow, it may still be
landing), 75 pipeline locked by another run, 1 other failure.
Prints a human summary and one line ``CDC_RUN_SUMMARY {json}``.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

try:
    import cdc_lake  # noqa: F401
except ImportError:  # a bare checkout: use the repo's src/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

EXIT_CONFIG, EXIT_INVALID, EXIT_MISSING, EXIT_LOCKED, EXIT_FAILED = 2, 3, 66, 75, 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        valid = sorted(o for a in self._actions for o in a.option_strings if o.startswith("--"))
        self.exit(EXIT_CONFIG, f"[dimension] ARGUMENT ERROR: {message}. Valid options: {', '.join(valid)}\n")


def _human(s: dict) -> list[str]:  # type: ignore[type-arg]
    changes = (f"+{s.get('inserted')} ~{s.get('updated')} -{s.get('deleted')}"
               + (f" closed {s.get('closed')}" if s.get("scd") == 2 else "")
               + f" ={s.get('unchanged')}")
    lines = [f"[dimension] {s.get('pipeline')} {s.get('date')} run {s.get('run_id')}: {s.get('status')} "
             f"in {s.get('duration_s')} s (engine {s.get('engine')}); last applied date "
             f"{s.get('last_applied_before')} -> {s.get('last_applied_date')}"]
    if s.get("status") == "succeeded":
        lines.append(f"[dimension]   snapshot rows {s.get('snapshot_rows')}: {changes}; "
                     f"table delta v{s.get('delta_version')}")
    elif s.get("message"):
        lines.append(f"[dimension]   {s['message']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = _Parser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--pipeline", required=True, help="dimension pipeline YAML file")
    p.add_argument("--date", required=True, help="snapshot date YYYY-MM-DD (Airflow: {{ ds }})")
    p.add_argument("--run-id", default=None, help="run id (Airflow passes its run_id)")
    args = p.parse_args(argv)

    from cdc_lake.checkpoint import PipelineLocked
    from cdc_lake.checkpoint_log import PipelineStateError
    from cdc_lake.config import ConfigError, load_pipeline
    from cdc_lake.summary import print_summary

    cfg = None
    try:
        cfg = load_pipeline(args.pipeline)
        if cfg.kind != "dimension":
            raise ConfigError(cfg.file, "kind", f"is {cfg.kind!r}; this job runs kind: dimension "
                              "pipelines (cdc: spark_jobs/cdc_ingest.py, enrich: spark_jobs/enrich.py)")
        from cdc_lake.dimensions.refresh import SnapshotInvalid, SnapshotMissing, run_refresh

        try:
            summary = run_refresh(cfg, date=args.date, run_id=args.run_id)
        except SnapshotMissing as e:
            print(f"[dimension] SNAPSHOT MISSING: {e}", file=sys.stderr, flush=True)
            return EXIT_MISSING
        except SnapshotInvalid as e:
            print(f"[dimension] INVALID SNAPSHOT: {e}", file=sys.stderr, flush=True)
            return EXIT_INVALID
    except ConfigError as e:
        print(f"[dimension] CONFIG ERROR: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except PipelineLocked as e:
        print(f"[dimension] PIPELINE LOCKED: {e}", file=sys.stderr, flush=True)
        return EXIT_LOCKED
    except PipelineStateError as e:  # its state file or the table's commits: an operator acts
        print(f"[dimension] NEEDS RECOVERY: {e}", file=sys.stderr, flush=True)
        return EXIT_INVALID
    except Exception as e:  # noqa: BLE001 - print the Spark error for the Airflow log, then fail
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        if getattr(cfg, "kind", None) == "dimension":
            from cdc_lake.dimensions.refresh import damaged_table

            why = damaged_table(cfg, text)
            if why is not None:  # an operator has to act: say so last, exit 3 (no retry)
                print(f"[dimension] NEEDS RECOVERY: {why}", file=sys.stderr, flush=True)
                return EXIT_INVALID
        from cdc_lake.spark_session import failure_line, stopped_context_hint

        hint = stopped_context_hint(text)
        if hint is not None:
            print(f"[dimension] {hint}", file=sys.stderr, flush=True)
        print(f"[dimension] RUN FAILED: {failure_line(e)} (traceback above)", file=sys.stderr, flush=True)
        return EXIT_FAILED
    print_summary(summary, human=_human(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
