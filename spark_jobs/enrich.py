"""spark-submit entry point: one enrichment run (availableNow/once), then exit.

    spark-submit spark_jobs/enrich.py --pipeline pipelines/shop_order_lines.yaml [--run-id r1] [--reprocess]

Exit codes: 0 ok, 2 config/argument error, 3 change feed unavailable / upstream rewritten (the
message names table, versions and the recovery command ``--reprocess``) or an upstream fact /
dimension table holding two rows for one declared key (nothing written; the message names the
table, version, key values and the fix) or a damaged state file of the checkpoint (named, with its
recovery), 75 pipeline locked by another run, 1 other failure. Prints a human summary and one
line ``ENRICH_RUN_SUMMARY {json}``
(plus the shared ``CDC_RUN_SUMMARY {json}`` line the Airflow operator reads).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

try:
    import cdc_lake  # noqa: F401  (installed: pip install -e . / the cluster image / --py-files)
except ImportError:  # a bare checkout: use the repo's src/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

EXIT_CONFIG, EXIT_UNAVAILABLE, EXIT_LOCKED, EXIT_FAILED = 2, 3, 75, 1
ENRICH_PREFIX = "ENRICH_RUN_SUMMARY "


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        valid = sorted(o for a in self._actions for o in a.option_strings if o.startswith("--"))
        self.exit(EXIT_CONFIG, f"[enrich] ARGUMENT ERROR: {message}. Valid options: {', '.join(valid)}\n")


def main(argv: list[str] | None = None) -> int:
    p = _Parser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--pipeline", required=True, help="pipeline YAML file (kind: enrich)")
    p.add_argument("--run-id", default=None, help="run id (Airflow passes its run_id)")
    p.add_argument("--reprocess", action="store_true",
                   help="reset this pipeline's checkpoint and outputs; rebuild from the upstream snapshot")
    args = p.parse_args(argv)

    from cdc_lake.checkpoint import PipelineLocked
    from cdc_lake.config import ConfigError, load_pipeline

    cfg = None
    try:
        cfg = load_pipeline(args.pipeline)
        if cfg.kind != "enrich":
            raise ConfigError(cfg.file, "kind", f"is {cfg.kind!r}; spark_jobs/enrich.py runs "
                              "kind: enrich pipelines (use spark_jobs/"
                              + {"cdc": "cdc_ingest.py", "dimension": "dimension_refresh.py"}.get(
                                  cfg.kind, "") + ")")
        from cdc_lake.enrich.job import run_enrich

        summary = run_enrich(cfg, run_id=args.run_id, reprocess=args.reprocess)
    except ConfigError as e:
        print(f"[enrich] CONFIG ERROR: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except PipelineLocked as e:
        print(f"[enrich] PIPELINE LOCKED: {e}", file=sys.stderr, flush=True)
        return EXIT_LOCKED
    except Exception as e:  # noqa: BLE001 - print the error for the Airflow log, then fail
        if type(e).__name__ == "UpstreamKeyViolation":  # a fact/dimension key not unique
            print(f"[enrich] UPSTREAM KEY VIOLATION: {e}", file=sys.stderr, flush=True)
            return EXIT_UNAVAILABLE
        if type(e).__name__ == "EnrichNeedsReprocess" or _is_unavailable(e):
            print(f"[enrich] NEEDS REPROCESS: {e}", file=sys.stderr, flush=True)
            return EXIT_UNAVAILABLE
        if any(c.__name__ == "PipelineStateError" for c in type(e).__mro__):  # e.g. a damaged
            print(f"[enrich] NEEDS RECOVERY: {e}", file=sys.stderr, flush=True)  # state file
            return EXIT_UNAVAILABLE
        if type(e).__name__ == "FactTableMissing":  # upstream not there yet: retried, no traceback
            print(f"[enrich] FACT TABLE NOT FOUND: {e}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        if getattr(cfg, "kind", None) == "enrich":
            from cdc_lake.enrich.table_damage import damaged_log, missing_data_file

            state = missing_data_file(cfg, text) or damaged_log(cfg)
            if state is not None:  # an operator has to act: say so last, exit 3 (no retry)
                print(f"[enrich] NEEDS RECOVERY: {state}", file=sys.stderr, flush=True)
                return EXIT_UNAVAILABLE
        from cdc_lake.spark_session import stopped_context_hint

        hint = stopped_context_hint(text)
        if hint is not None:
            print(f"[enrich] {hint}", file=sys.stderr, flush=True)
        print(f"[enrich] RUN FAILED: {type(e).__name__}: {str(e)[:1000]}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    from cdc_lake.summary import print_summary

    print(ENRICH_PREFIX + json.dumps(summary, default=str), flush=True)
    print_summary(summary, human=_human(summary))
    return 0


def _is_unavailable(e: BaseException) -> bool:
    return type(e).__name__ == "ChangeFeedUnavailable"


def _human(s: dict) -> list[str]:
    return [f"[enrich] pipeline {s['pipeline']} run {s['run_id']}: {s['batches']} batch(es) "
            f"{s['batch_ids']}, {s['facts_read']} fact changes, {s['enriched_upserted']} enriched "
            f"upserts, {s['enriched_deleted']} deleted, {s['parked']} parked, {s['released']} "
            f"released, {s['released_unknown']} released unknown, {s['restated']} restated, "
            f"{s['pending_rows']} pending, {s['duration_s']} s",
            f"[enrich]   dimension versions {s['dimension_versions']}; tables {s['tables']}"] + (
        [f"[enrich]   --reprocess snapshot (before those batches): {snap['facts_read']} facts, "
         f"{snap['enriched_upserted']} enriched, {snap['parked']} parked, {snap['seconds']} s"]
        if (snap := s.get("reprocess_snapshot")) else []) + (
        [f"[enrich]   re-join pass {rj['passes']} (no fact change; {rj['reason'] or 'finishing an interrupted pass'}): "
         f"{rj['released']} released, {rj['released_unknown']} released unknown, "
         f"{rj['restated']} restated, {rj['seconds']} s"]
        if (rj := s.get("rejoin")) else [])


if __name__ == "__main__":
    sys.exit(main())
