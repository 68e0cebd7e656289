"""``fact.events.archive_dir``: an events pipeline's stream moves the files of committed
micro-batches out of the landing folder (Spark's ``cleanSource=archive``), so the folder it lists
on every run holds only what is new (issue 9's flat cost, as ``source.archive_dir`` for CDC),
and ``--reprocess`` moves them back before it rebuilds, so the rebuild reads every event again.

Random histories (``test_random_runs_and_rebuilds_match_the_late_event_rule``: a new seed per
test run, printed on failure, replay with ``CDC_SEED=<n>``; ``CDC_SLOW=1``) land
files of events on either side of the watermarks, run at random points and rebuild at random
points (slow tier). Truth: the documented late-event rule computed from the landed files
(:class:`test_enrich_late_events.Landing`, one micro-batch per file), the rows before the
rebuild, and the folders as listed here. Real Spark, real delta-rs, through :func:`run_enrich`.
"""

from __future__ import annotations

import json
import os
import random
import textwrap
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from test_enrich_late_events import YAML, Landing, _check, _rows, _t

from cdc_lake.checkpoint_log import PipelineStateError
from cdc_lake.config import ConfigError, load_pipeline
from cdc_lake.sources.landing_history import archived


def _setup(tmp_path: Path, archive: str = "arc"):  # type: ignore[no-untyped-def]
    write_deltalake(str(tmp_path / "products"), pa.table({"id": pa.array([1], pa.int64()), "cat": ["fruit"]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    f = tmp_path / "p.yaml"
    text = (YAML.replace("TRIGGER", "available_now").replace("ID_TYPE", "string")
            .replace("max_files_per_trigger: 1,", f"max_files_per_trigger: 1, archive_dir: {archive},"))
    f.write_text(textwrap.dedent(text))
    landing = Landing(tmp_path, "string")
    return load_pipeline(f), landing, Path(archived(tmp_path / "arc", landing.dir))


def _listed(folder: Path) -> list[str]:
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def test_taken_files_move_to_the_archive_and_reprocess_reads_them_again(spark, tmp_path: Path) -> None:
    from cdc_lake.enrich.job import run_enrich

    cfg, landing, arc = _setup(tmp_path)
    landing.land("a.json", [("e1", 1, "2026-01-02T10:00:00Z")])
    landing.land("b.json", [("e2", 2, "2026-01-02T13:00:00Z")])   # batch 1: watermark 09:00
    s = [run_enrich(cfg, spark=spark, run_id="r1")]
    # Spark archives a batch's files when it plans the next one: the last batch's wait
    assert (_listed(landing.dir), _listed(arc)) == (["b.json"], ["a.json"])
    landing.land("c.json", [("e3", 4, "2026-01-02T16:00:00Z"),    # batch 2: watermark 12:00
                            ("e4", 8, "2026-01-02T12:00:00Z"),    # late: on it
                            (None, 3, "2026-01-02T16:00:00Z")])   # no id: quarantined
    s.append(run_enrich(cfg, spark=spark, run_id="r2"))
    landing.land("d.json", [("x1", 16, "2026-01-02T11:00:00Z"),   # batch 3: watermark 15:00;
                            ("x2", 32, "2026-01-02T15:30:00Z"),   # x1 dropped by Spark's dedup
                            ("x3", 64, "2026-01-02T15:00:00Z")])  # (re-read from the landed file)
    s.append(run_enrich(cfg, spark=spark, run_id="r3"))
    assert (_listed(landing.dir), _listed(arc)) == (["d.json"], ["a.json", "b.json", "c.json"])
    late = _check(tmp_path, landing, s, null_ids=1)
    assert late == {"e4", "x1", "x3"}
    # a run with nothing new reads nothing and moves nothing
    s.append(run_enrich(cfg, spark=spark, run_id="r4"))
    assert s[-1]["facts_read"] == 0 and _listed(landing.dir) == ["d.json"]

    enriched, per_cat = _rows(tmp_path / "gold/ev"), _rows(tmp_path / "gold/per_cat")
    rebuilt = run_enrich(cfg, spark=spark, run_id="r5", reprocess=True)
    assert rebuilt["facts_read"] == sum(len(f) for f in landing.files), rebuilt
    assert sorted(map(str, _rows(tmp_path / "gold/ev"))) == sorted(map(str, enriched))
    assert _rows(tmp_path / "gold/per_cat") == per_cat
    assert (_listed(landing.dir), _listed(arc)) == (["d.json"], ["a.json", "b.json", "c.json"])
    # the stream goes on from the rebuild
    landing.land("e.json", [("y1", 128, "2026-01-02T17:00:00Z")])
    run_enrich(cfg, spark=spark, run_id="r6")
    enriched_ids, _ = landing.truth()
    assert {r["event_id"] for r in _rows(tmp_path / "gold/ev")} == enriched_ids
    assert (_listed(landing.dir), _listed(arc)) == (["e.json"], ["a.json", "b.json", "c.json", "d.json"])


def test_reprocess_stops_on_a_landing_file_named_as_an_archived_one(spark, tmp_path: Path) -> None:
    from cdc_lake.enrich.job import run_enrich

    cfg, landing, arc = _setup(tmp_path)
    landing.land("a.json", [("e1", 1, "2026-01-02T10:00:00Z")])
    landing.land("b.json", [("e2", 2, "2026-01-02T11:00:00Z")])
    run_enrich(cfg, spark=spark, run_id="r1")
    (landing.dir / "a.json").write_text('{"event_id": "z9", "product_id": 1, "qty": 1, '
                                       '"event_ts": "2026-01-02T12:00:00Z"}\n')
    cp = cfg.checkpoint_path
    checkpoint = {d: _listed(cp / d) for d in ("offsets", "commits", "sources/0", "state")}
    with pytest.raises(PipelineStateError) as e:
        run_enrich(cfg, spark=spark, run_id="r2", reprocess=True)
    msg = str(e.value)
    assert str(landing.dir / "a.json") in msg and str(arc / "a.json") in msg, msg
    assert "Nothing was moved or reset" in msg, msg
    assert {d: _listed(cp / d) for d in checkpoint} == checkpoint
    assert not (cp / "enrich_reprocess.json").exists()
    assert {r["event_id"] for r in _rows(tmp_path / "gold/ev")} == {"e1", "e2"}
    assert (_listed(landing.dir), _listed(arc)) == (["a.json", "b.json"], ["a.json"])


@pytest.mark.parametrize(("archive", "says"), [
    ("landing/done", "lies inside fact.events.path"),
    (".", "contains fact.events.path"),
    ("gold/ev", "is outputs.enriched"),
    ("products", "is dimensions.products.table"),
    ("'s3://bucket/arc'", "must be a local folder"),
])
def test_an_archive_overlapping_the_pipeline_s_folders_or_not_local_is_refused(
        tmp_path: Path, archive: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        _setup(tmp_path, archive)
    assert e.value.key == "fact.events.archive_dir" and says in str(e.value), str(e.value)


def test_reprocess_stops_when_an_event_file_read_before_is_in_no_folder_it_reads(
        spark, tmp_path: Path) -> None:
    from cdc_lake.enrich.job import run_enrich

    cfg, landing, arc = _setup(tmp_path)
    landing.land("a.json", [("e1", 1, "2026-01-02T10:00:00Z")])
    landing.land("b.json", [("e2", 2, "2026-01-02T10:30:00Z")])
    landing.land("c.json", [("e3", 4, "2026-01-02T11:00:00Z")])
    run_enrich(cfg, spark=spark, run_id="r1")
    assert (_listed(landing.dir), _listed(arc)) == (["c.json"], ["a.json", "b.json"])
    # archive_dir unset in the YAML: the archived files are in no folder the rebuild reads
    cfg.file.write_text(cfg.file.read_text().replace(" archive_dir: arc,", ""))
    cfg = load_pipeline(cfg.file)
    assert cfg.fact.events.archive_dir is None
    cp = cfg.checkpoint_path
    with pytest.raises(PipelineStateError) as e:
        run_enrich(cfg, spark=spark, run_id="r2", reprocess=True)
    msg = str(e.value)
    assert "2 event file(s)" in msg and str(landing.dir / "a.json") in msg, msg
    assert str(landing.dir / "b.json") in msg and "c.json" not in msg, msg
    assert "nothing was reset" in msg and "mv " in msg, msg
    assert (cp / "commits").is_dir() and not (cp / "enrich_reprocess.json").exists()
    assert {r["event_id"] for r in _rows(tmp_path / "gold/ev")} == {"e1", "e2", "e3"}
    # a file deleted by hand stops it the same way, with the archive named again
    cfg.file.write_text(cfg.file.read_text().replace(
        "max_files_per_trigger: 1,", "max_files_per_trigger: 1, archive_dir: arc,"))
    cfg = load_pipeline(cfg.file)
    (arc / "a.json").unlink()
    with pytest.raises(PipelineStateError) as e:
        run_enrich(cfg, spark=spark, run_id="r3", reprocess=True)
    assert "1 event file(s)" in str(e.value) and str(landing.dir / "a.json") in str(e.value)
    assert _listed(arc) == ["b.json"]  # nothing moved back
    # on purpose, as the message says: the checkpoint moved aside, the rebuild reads what is left
    cp.rename(cp.with_name(cp.name + ".before-reprocess"))
    run_enrich(cfg, spark=spark, run_id="r4", reprocess=True)
    assert {r["event_id"] for r in _rows(tmp_path / "gold/ev")} == {"e2", "e3"}
    assert _listed(landing.dir) == ["c.json"]


def test_a_file_that_cannot_move_back_stops_the_restore_naming_it(tmp_path: Path) -> None:
    import tempfile

    from cdc_lake.sources.landing_history import restore_archived

    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "sub").write_text("a file where the archive holds a folder\n")
    arc = tmp_path / "arc"
    copy = Path(archived(arc, landing))
    (copy / "sub").mkdir(parents=True)
    (copy / "a.json").write_text("{}\n")
    (copy / "sub" / "b.json").write_text("{}\n")
    with pytest.raises(PipelineStateError) as e:
        restore_archived(landing, arc, pipeline="p", key="fact.events.archive_dir")
    msg = str(e.value)
    assert str(copy / "sub" / "b.json") in msg and "1 of 2 moved" in msg and "run it again" in msg, msg
    assert _listed(landing) == ["a.json", "sub"] and _listed(copy) == ["sub"]
    (landing / "sub").unlink()
    assert restore_archived(landing, arc, pipeline="p", key="fact.events.archive_dir") == 1
    assert (landing / "sub" / "b.json").is_file() and not (copy / "sub" / "b.json").exists()
    # an archive on another file system (Spark cannot archive there either)
    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        shm_copy = Path(archived(other, landing))
        shm_copy.mkdir(parents=True)
        (shm_copy / "c.json").write_text("{}\n")
        with pytest.raises(PipelineStateError) as e:
            restore_archived(landing, Path(other), pipeline="p", key="fact.events.archive_dir")
        assert "another file system" in str(e.value) and "0 of 1 moved" in str(e.value), str(e.value)


SLOW = os.environ.get("CDC_SLOW") == "1"


@pytest.mark.slow  # adds volume: the default tier's archive and rebuild tests above are fixed cases
@pytest.mark.parametrize("i", range(4))
def test_random_runs_and_rebuilds_match_the_late_event_rule(spark, tmp_path: Path, i: int) -> None:
    from cdc_lake.enrich.job import run_enrich

    seed = int(os.environ.get("CDC_SEED") or random.SystemRandom().randrange(2**31)) + i
    rng = random.Random(seed)
    cfg, landing, arc = _setup(tmp_path)
    newest, n, runs, rebuilds = _t("2026-01-02T10:00:00"), 0, 0, 0
    for step in range(rng.randint(4, 9 if SLOW else 6)):
        rows = []
        for _ in range(rng.randint(1, 4)):
            n += 1  # ids unique: the rule's truth counts each once
            back = timedelta(minutes=rng.choice([-90, -60, -30, 0, 20, 61, 150]))
            rows.append((None if rng.random() < 0.1 else f"e{n}", n,
                         (newest - back).strftime("%Y-%m-%dT%H:%M:%S") + "Z"))
        landing.land(f"f{step:02d}.json", rows)
        newest = max([newest] + [_t(t.rstrip("Z")) for _, _, t in rows])
        if rng.random() < 0.5:
            rebuild = rng.random() < 0.3 and runs > 0
            run_enrich(cfg, spark=spark, run_id=f"r{step}", reprocess=rebuild)
            runs, rebuilds = runs + 1, rebuilds + rebuild
    run_enrich(cfg, spark=spark, run_id="last", reprocess=rebuilds == 0)  # at least one rebuild
    context = f"CDC_SEED={seed} runs={runs + 1} rebuilds={max(rebuilds, 1)} files={landing.names}"
    enriched, late = landing.truth()
    got = {r["event_id"] for r in _rows(tmp_path / "gold/ev")}
    assert got == enriched, (context, got ^ enriched)
    q = _rows(tmp_path / "gold/_quarantine")  # a log: a rebuild appends its rows again
    got_late = {json.loads(r["raw_line"])["event_id"] for r in q if r["reason"].startswith("late event")}
    assert got_late == late, (context, got_late ^ late)
    qty = sum(r["qty"] for rows in landing.files for r in rows if r["event_id"] in enriched)
    assert [(r["units"], r["count"]) for r in _rows(tmp_path / "gold/per_cat")] == (
        [(qty, len(enriched))] if enriched else []), context
    # every file read is in the archive but the last batch's (one file per batch)
    assert (_listed(landing.dir), _listed(arc)) == (landing.names[-1:], landing.names[:-1]), context
