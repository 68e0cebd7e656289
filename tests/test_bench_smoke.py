"""``make bench-quick`` as a smoke test (slow tier: ``CDC_SLOW=1``): the benchmark harness runs end to end on tiny data
and writes its report, plots and JSON. Nothing about the timings is asserted (issue 9)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~6 min of spark-submits: over the CI budget; `make bench-quick` runs it
def test_benchmark_quick_size_runs_and_writes_the_report(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench.py"), "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = (tmp_path / "benchmarks.md").read_text()
    for case in ("small increment", "large batch", "flat cost", "peer", "peer, long history",
                 "enrichment: small increment", "enrichment: large batch",
                 "enrichment, events: small increment", "enrichment, events: large batch",
                 "enrichment, events: flat cost", "enrichment, events: large history",
                 "flat cost, landing history (no archive)",
                 "flat cost, landing history (source.archive_dir)",
                 "enrichment, events: flat cost, landing history (no archive)",
                 "enrichment, events: flat cost, landing history (fact.events.archive_dir)",
                 "many small files, CDC", "many small files, enrichment, events"):
        assert f"| {case} |" in report
    assert (tmp_path / "img" / "bench-history.png").stat().st_size > 1000
    assert (tmp_path / "img" / "bench-ratios.png").stat().st_size > 1000
    assert (tmp_path / "img" / "bench-peer.png").stat().st_size > 1000
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["large"]["events"] == 4000 and len(res["flat"]["run_s"]) == 5
    assert res["peer_long"]["events_per_run"] == 400 and len(res["peer_long"]["run_s"]) == 5
    assert res["small"]["median_count_s"] > 0 and res["large"]["median_scan_s"] > 0
    assert res["enrich"]["large"]["events"] == 4000 and res["enrich"]["small"]["median_job_s"] > 0
    assert res["events"]["large"]["events"] == 4000 and res["events"]["small"]["median_job_s"] > 0
    assert len(res["events"]["small"]["noop_wall_s"]) == 1 and "| enrichment, events: nothing new |" in report
    h = res["events_history"]
    assert len(h["run_s"]) == 5 and h["big_events"] == 4000 and h["enriched_rows"] == 5 * 200 + 4000 + 3 * 200
    lh = res["landing"]
    assert lh["history_files"] == 300 and lh["archive"]["landing_files_now"] == 1 \
        and lh["plain"]["landing_files_now"] == 2 + 300 + 1 + 1 + 3, lh
    el = res["events_landing"]
    assert el["history_files"] == 300 and el["archive"]["landing_files_now"] == 1 \
        and el["plain"]["landing_files_now"] == 2 + 300 + 1 + 1 + 3, el
    fc = res["files"]
    assert fc["files"] == 100 and len(fc["cdc"]["many_s"]) == len(fc["events_source"]["one_s"]) == 1, fc
    assert res["small"]["profile"]["job"]["phases"], "the job's per-batch phase line was not captured"
