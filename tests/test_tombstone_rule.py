"""The SCD1 tombstone rule, both ways it runs, against a model written here.

The rule: of a key's changes in a batch the latest wins, unless the key's tombstone (its last
recorded delete) has a greater ``_cdc_seq``; a change with the tombstone's own seq (the same
delete, re-delivered) stays. delta-spark applies it in the Spark plan
(``changes.scd1_source`` with the tombstone table); delta-rs applies it after the Spark job on
Arrow (``changes.drop_tombstoned``, with a lookup of the batch's keys). Both are checked on the
same random batches against a plain-Python model; the seed is printed on failure.
"""

from __future__ import annotations

import os
import random

import pyarrow as pa

from cdc_lake.cdc.changes import drop_tombstoned, latest_per_key, scd1_source

SEED = int(os.environ.get("CDC_TEST_SEED", random.randrange(10**6)))


def _cases(seed: int, n: int) -> tuple[list[tuple], list[tuple]]:
    """``n`` random batches side by side (``case`` is part of the key): changes, tombstones."""
    rng = random.Random(seed)
    changes, tombs = [], []
    for case in range(n):
        keys = [(rng.randrange(3), f"k{rng.randrange(4)}") for _ in range(rng.randrange(1, 9))]
        seqs = rng.sample(range(100, 999), len(keys))  # unique per change, as the parsers give
        for (a, b), seq in zip(keys, seqs):
            changes.append((case, a, b, rng.choice(["insert", "update", "delete"]), f"s{seq}"))
        mine = list(zip(keys, seqs))
        tombed: dict[tuple, int] = {}
        for _ in range(rng.randrange(0, 5)):
            if rng.random() < 0.3:  # a change's own key and seq (its delete, re-delivered)
                (a, b), seq = rng.choice(mine)
            else:  # any key, a seq around the batch's
                a, b, seq = rng.randrange(3), f"k{rng.randrange(4)}", rng.randrange(100, 999)
            tombed[(a, b)] = seq  # one tombstone per key
        tombs += [(case, a, b, f"s{seq}") for (a, b), seq in tombed.items()]
    return changes, tombs


def _model(changes: list[tuple], tombs: list[tuple]) -> set[tuple]:
    latest: dict[tuple, tuple] = {}
    for c in changes:
        key = c[:3]
        if key not in latest or c[4] > latest[key][4]:
            latest[key] = c
    tomb = {t[:3]: t[3] for t in tombs}
    return {c for k, c in latest.items() if k not in tomb or c[4] >= tomb[k]}


def test_tombstone_rule_in_spark_and_in_arrow_agree_with_the_model(spark):  # type: ignore[no-untyped-def]
    changes, tombs = _cases(SEED, 60)
    keys = ("case", "a", "b")
    cdf = spark.createDataFrame(changes, "case int, a bigint, b string, _cdc_op string, _cdc_seq string")
    tdf = spark.createDataFrame(tombs, "case int, a bigint, b string, _cdc_seq string")
    want = _model(changes, tombs)
    cols = [*keys, "_cdc_op", "_cdc_seq"]

    in_spark = {tuple(r) for r in scd1_source(cdf, keys, tdf).select(*cols).collect()}
    # the Arrow side gets the lookup delta-rs would give: other types (string_view, int64) too
    lookup = pa.table({"case": pa.array([t[0] for t in tombs], pa.int64()),
                       "a": pa.array([t[1] for t in tombs], pa.int64()),
                       "b": pa.array([t[2] for t in tombs], pa.string_view()),
                       "_cdc_seq": pa.array([t[3] for t in tombs], pa.large_string())})
    latest = latest_per_key(cdf, keys).select(*cols).toArrow()
    in_arrow = {tuple(r.values()) for r in drop_tombstoned(latest, lookup, keys).to_pylist()}

    assert in_spark == want, f"seed {SEED} (CDC_TEST_SEED={SEED} reproduces): Spark rule differs"
    assert in_arrow == want, f"seed {SEED} (CDC_TEST_SEED={SEED} reproduces): Arrow rule differs"
    assert len(want) < len({c[:3] for c in changes}), f"seed {SEED}: no row was dropped"


def test_arrow_rule_without_tombstones_keeps_everything() -> None:
    latest = pa.table({"id": [1, 2], "_cdc_seq": ["a", "b"]})
    assert drop_tombstoned(latest, None, ("id",)) is latest
    empty = pa.table({"id": pa.array([], pa.int64()), "_cdc_seq": pa.array([], pa.string())})
    assert drop_tombstoned(latest, empty, ("id",)).equals(latest)
