"""Demo report of the enrichment pipeline: what got parked, released, and which category version
each order line was enriched with. Reads the Delta tables with delta-rs (no Spark).

    python -m cdc_lake.demo.enrich_report --pipeline pipelines/shop_order_lines.yaml \\
        --plan data/snapshots/product_categories.plan.json --step 1
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def _rows(path: Path) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    if not (path / "_delta_log").is_dir():
        return []
    # single-threaded scan: see cdc_lake.demo.categories._column (abort at exit otherwise)
    return DeltaTable(str(path)).to_pyarrow_dataset().to_table(use_threads=False).to_pylist()


def _dim_version(row: dict[str, Any], dim: str) -> Any:
    v = row.get("_dim_versions")
    if isinstance(v, list):  # a map comes back as [(key, value), ...]
        v = dict(v)
    return (v or {}).get(dim)


def _key(r: dict[str, Any]) -> list[Any]:
    return [r.get("order_id"), r.get("line_no")]


def report(cfg: Any, plan: dict[str, Any], step: int, parked_file: Path | None = None) -> list[str]:
    """The step's lines; step 1 keeps the keys of the late product's parked lines in
    ``parked_file`` so that step 2 can say how many of exactly those were released."""
    late, changed = plan.get("late_product"), plan.get("changed_product")
    enriched, pending = _rows(cfg.outputs.enriched), _rows(cfg.outputs.pending)
    out = [f"[demo]   order_lines: {len(enriched)} rows; pending (parked): {len(pending)} rows"]
    waiting = Counter(" + ".join(sorted(r.get("_missing") or [])) or "?" for r in pending)
    if waiting:
        out.append("[demo]   pending rows by the dimension they wait for: "
                   + ", ".join(f"{d}: {n}" for d, n in sorted(waiting.items()))
                   + " (a member not captured yet, or deleted upstream)")
    parked = [r for r in pending if r.get("product_id") == late]
    late_lines = [r for r in enriched if r.get("product_id") == late]
    if step == 1:
        if parked:
            ex = parked[0]
            out.append(f"[demo]   parked: {len(parked)} line(s) of product {late} (its category is not in "
                       f"the 2026-01-01 export), e.g. order {ex.get('order_id')} line {ex.get('line_no')}, "
                       f"missing {list(ex.get('_missing') or [])}, parked at {ex.get('_parked_at')}")
        else:
            out.append(f"[demo]   WARNING: no parked line of product {late} (expected its lines to wait)")
        if parked_file is not None:
            parked_file.write_text(json.dumps([_key(r) for r in parked]), encoding="utf-8")
    else:
        before = (json.loads(parked_file.read_text(encoding="utf-8"))
                  if parked_file is not None and parked_file.is_file() else [])
        in_enriched = {tuple(_key(r)) for r in late_lines if not r.get("_unknown_members")}
        released = [k for k in before if tuple(k) in in_enriched]
        if late_lines and not parked:
            ex = late_lines[0]
            out.append(f"[demo]   released: {len(released)} of the {len(before)} parked line(s) of "
                       f"product {late}; its {len(late_lines)} line(s) in order_lines (later ones "
                       f"enriched directly) carry category {ex.get('category')!r}")
        else:
            out.append(f"[demo]   WARNING: product {late}: {len(parked)} line(s) still parked, "
                       f"{len(released)} of the {len(before)} parked in run 1 released")
        seen = Counter((_dim_version(r, "categories"), r.get("category"))
                       for r in enriched if r.get("product_id") == changed)
        if seen:
            text = ", ".join(f"categories v{v}: {c!r} x{n}" for (v, c), n in sorted(seen.items(), key=str))
            out.append(f"[demo]   product {changed} (category changed in the 2026-01-02 export): {text} "
                       "- each line keeps the category of the version it was enriched with")
        versions = sorted({_dim_version(r, "categories") for r in enriched} - {None})
        out.append(f"[demo]   category dimension versions used so far: {versions}")
        for a in cfg.outputs.aggregates:
            rows = sorted(_rows(a.path), key=lambda r: (str(r.get("day")), str(r.get("category"))))
            out.append(f"[demo]   {a.name}: {len(rows)} groups, e.g.")
            for r in rows[:4]:
                out.append(f"[demo]     {r.get('day')}  {str(r.get('category')):<14} revenue "
                           f"{r.get('revenue')}  units {r.get('units')}  lines {r.get('count')}")
    return out


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(prog="python -m cdc_lake.demo.enrich_report")
    a.add_argument("--pipeline", required=True)
    a.add_argument("--plan", required=True, type=Path)
    a.add_argument("--step", type=int, choices=(1, 2), required=True)
    args = a.parse_args(argv)
    from cdc_lake.config import load_pipeline

    cfg = load_pipeline(args.pipeline)
    plan = json.loads(args.plan.read_text(encoding="utf-8"))
    parked = args.plan.with_name(args.plan.name + ".parked.json")
    print("\n".join(report(cfg, plan, args.step, parked)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
