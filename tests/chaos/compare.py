"""Compare a lake with the reference model: every table, the quarantine and the DDL log, exactly.

Example::

    res = compare_lake(RefConfig.from_yaml(yaml), landing, lake)
    assert not res.problems, "\\n".join(res.problems)
    res.rows_compared, res.rows_lost, res.rows_duplicated, res.quarantine_checked
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from reference_model import ReferenceModel, RefConfig, diff_scd2, diff_table, read_delta_rows


@dataclass
class Comparison:
    rows_compared: int = 0        # expected rows (SCD1) / versions (SCD2) checked
    rows_lost: int = 0            # expected but absent
    rows_duplicated: int = 0      # present more often than expected (duplicate keys/versions)
    quarantine_checked: int = 0
    ddl_checked: int = 0
    problems: list[str] = field(default_factory=list)


def model_for(cfg: RefConfig, landing: Path) -> ReferenceModel:
    model = ReferenceModel(cfg)
    for f in sorted(landing.glob("*.json")):
        model.add_file(f)
    return model


def compare_lake(cfg: RefConfig, landing: Path, lake: Path) -> Comparison:
    """The lake after a completed run vs the model fed every landed file."""
    model = model_for(cfg, landing)
    res = Comparison()
    for name, spec in cfg.tables.items():
        rows = read_delta_rows(lake / name)
        keys = tuple(spec.keys or ())
        if spec.scd == 2:
            exp = model.scd2(name)
            want = Counter(r["_ref_key"] for r in exp)
            got = Counter(tuple(r.get(k) for k in keys) for r in rows)
            diff = diff_scd2(exp, rows, keys, table=name)
        else:
            exp1 = model.scd1(name)
            want = Counter(exp1.keys())
            got = Counter(tuple(r.get(k) for k in keys) for r in rows)
            diff = diff_table(exp1, rows, keys, table=name)
        res.rows_compared += sum(want.values())
        res.rows_lost += sum((want - got).values())
        res.rows_duplicated += sum((got - want).values())
        res.problems += diff
    q = read_delta_rows(lake / "_quarantine")
    got_q = Counter((Path(r["source_file"]).name, r["raw_line"].strip()) for r in q)
    want_q = Counter((Path(x.source_file).name, x.raw_line.strip()) for x in model.quarantine)
    res.quarantine_checked = sum(want_q.values())
    if got_q != want_q:
        res.problems.append(f"quarantine: {sum(got_q.values())} rows, expected "
                            f"{sum(want_q.values())}; missing {list((want_q - got_q).items())[:3]}, "
                            f"extra {list((got_q - want_q).items())[:3]}")
    no_reason = [r for r in q if not r.get("reason")]
    if no_reason:
        res.problems.append(f"quarantine: {len(no_reason)} rows without a reason")
    d = read_delta_rows(lake / "_ddl_log")
    got_d = Counter((Path(r["source_file"]).name, (r.get("sql") or "").strip()) for r in d)
    want_d = Counter((Path(x.source_file).name, x.sql.strip()) for x in model.ddl)
    res.ddl_checked = sum(want_d.values())
    if got_d != want_d:
        res.problems.append(f"ddl log: {sum(got_d.values())} rows, expected "
                            f"{sum(want_d.values())}; missing {list((want_d - got_d).items())[:3]}, "
                            f"extra {list((got_d - want_d).items())[:3]}")
    return res
