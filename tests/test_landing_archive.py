"""``source.archive_dir``: Spark's ``cleanSource=archive`` moves the landing files of committed
micro-batches out of the landing folder, so the folder the file source lists on every run holds
only what is new (issue 9's flat-cost item). Random histories with the archive on, checked
against the reference model after every run, after a full refresh and after a no-op run, are in
``tests/test_cdc_properties.py::test_random_histories_with_landing_archive``; here: the YAML
rules, the layout Spark archives to, and a file missing from the archive stopping a full
refresh before it rebuilds anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from job_helpers import event, land, rows

from cdc_lake.cdc.job import run_pipeline
from cdc_lake.config import ConfigError, load_pipeline
from cdc_lake.paths import check_shared_paths
from cdc_lake.sources.landing_history import archived, history_pattern

YAML = """pipeline: {name}
source: {{format: maxwell, path: {landing}, database: shop, archive_dir: {archive}}}
storage: {{root: {root}}}
engine: {{name: deltalake}}
tables:
  orders: {{keys: [id]}}
"""


def _pipeline(tmp_path: Path, archive: str, name: str = "arc", landing: str = "landing",
              root: str = "lake", yaml_name: str = "p.yaml"):  # type: ignore[no-untyped-def]
    (tmp_path / landing).mkdir(parents=True, exist_ok=True)
    p = tmp_path / yaml_name
    p.write_text(YAML.format(name=name, landing=landing, archive=archive, root=root),
                 encoding="utf-8")
    return load_pipeline(p)


def test_archive_layout_and_the_full_refresh_pattern():
    assert archived("/arc", "/data/landing/f.json") == "/arc/data/landing/f.json"
    assert archived("/arc/", "/data/landing") == "/arc/data/landing"
    assert history_pattern("/data/landing", None) == "/data/landing"
    assert history_pattern("/data/landing", "/arc") == "/{data/landing,arc/data/landing}"


@pytest.mark.parametrize(("archive", "landing", "key", "says"), [
    ("landing/done", "landing", "source.archive_dir", "lies inside source.path"),
    ("outer", "outer/landing", "source.archive_dir", "contains source.path"),
    ("lake/orders", "landing", "tables.orders.path", "is source.archive_dir"),
    ("'arc,hive'", "landing", "source.archive_dir", "holds ','"),
    ("arc", "'land,ing'", "source.path", "holds ','"),
])
def test_an_archive_overlapping_the_pipeline_s_folders_or_holding_a_comma_is_refused(
        tmp_path, archive, landing, key, says):
    with pytest.raises(ConfigError) as e:
        _pipeline(tmp_path, archive, landing=landing)
    assert e.value.key.startswith(key) and says in str(e.value), str(e.value)


def test_two_pipelines_may_share_one_archive_folder(tmp_path):
    """Spark files each landing folder's files under their own full path, so one archive folder
    serves several pipelines; a table or checkpoint there is still refused."""
    a = _pipeline(tmp_path, "archive", name="a", landing="land_a", root="lake_a", yaml_name="a.yaml")
    b = _pipeline(tmp_path, "archive", name="b", landing="land_b", root="lake_b", yaml_name="b.yaml")
    assert a.archive_path == b.archive_path == (tmp_path / "archive").resolve()
    assert check_shared_paths([a, b]) == []
    c = _pipeline(tmp_path, "lake_a/orders", name="c", landing="land_c", root="lake_c",
                  yaml_name="c.yaml")
    errors = check_shared_paths([a, c])
    assert errors and "source.archive_dir" in str(errors[-1]) + str(errors[0]), errors


def test_archived_files_serve_a_full_refresh_and_a_missing_one_stops_it(spark, tmp_path):
    cfg = _pipeline(tmp_path, "archive")
    landing = cfg.landing_path
    first = land(landing, "a.json", event(1), event(2))
    land(landing, "b.json", event(3))
    run_pipeline(cfg, spark=spark, run_id="r1", max_files_per_trigger=1)
    assert archived(cfg.archive_path, first) and Path(archived(cfg.archive_path, first)).is_file()
    assert not first.exists() and (landing / "b.json").exists()  # the last batch's file waits
    land(landing, "c.json", event(5, typ="update", id=2, status="changed"), event(4))
    run_pipeline(cfg, spark=spark, run_id="r2")
    assert sorted(p.name for p in landing.iterdir()) == ["c.json"]
    truth = {1: "s1", 2: "changed", 3: "s3", 4: "s4"}
    assert rows(cfg.tables["orders"].path) == truth

    run_pipeline(cfg, spark=spark, run_id="refresh", full_refresh=True)
    assert rows(cfg.tables["orders"].path) == truth

    gone = Path(archived(cfg.archive_path, landing / "b.json"))
    gone.unlink()
    from cdc_lake.cdc.backlog import LandingHistoryIncomplete

    with pytest.raises(LandingHistoryIncomplete) as e:
        run_pipeline(cfg, spark=spark, run_id="refresh2", full_refresh=True)
    assert str(landing / "b.json") in str(e.value) and "its archive" in str(e.value), str(e.value)
    assert rows(cfg.tables["orders"].path) == truth
