"""Fuzz the pipeline config loader (hypothesis, real random examples, no Spark).

A valid pipeline mapping is mutated at a random dotted key (junk value of a random type, key
deleted, unknown key added) or replaced by random text. ``load_pipeline`` must either accept it
or raise :class:`cdc_lake.config.ConfigError` whose message names the file and — for a
mutation of a key — a dotted key; never another exception. The falsifying mutation is printed
on failure. ``CDC_SLOW=1`` runs many more examples.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from cdc_lake.config import ConfigError, load_pipeline

SLOW = os.environ.get("CDC_SLOW") == "1"
VALID: dict[str, Any] = {
    "pipeline": "fuzz_p", "description": "d", "owner": "o", "tags": ["a"],
    "schedule": {"every": "30m"}, "start_date": "2026-01-01", "retries": 2,
    "trigger": "available_now", "infer_temporal": True,
    "source": {"format": "maxwell", "path": "landing", "database": "shop", "glob": "*.json",
               "max_files_per_trigger": 10},
    "storage": {"root": "lake"},
    "engine": {"name": "deltalake"},
    "spark": {"conf": {"spark.sql.shuffle.partitions": "2"}},
    "ignore_tables": ["shop.audit_log"],
    "tables": {"orders": {"keys": ["id"], "scd": 2, "types": {"amount": "decimal(10,2)"},
                          "exclude_columns": ["note"]},
               "customers": {"keys": ["id"], "source_table": "customers"}},
}

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
    st.text(max_size=30), st.sampled_from(["", "0", "-1", "3", "yes", "decimal(99,99)", "${NOPE}",
                                           "${NOPE:-x}", "../..", "a.b", "int", "every"]),
    st.lists(st.one_of(st.integers(), st.text(max_size=8)), max_size=3),
    st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=8)), max_size=3),
)


def _paths(obj: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    return out


PATHS = _paths(VALID)


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, tuple[str, ...], Any]:
    kind = draw(st.sampled_from(["set", "set", "set", "delete", "unknown"]))
    path = draw(st.sampled_from(PATHS))
    return kind, path, draw(JUNK) if kind != "delete" else None


def _apply(raw: dict[str, Any], kind: str, path: tuple[str, ...], value: Any) -> None:
    node = raw
    for k in path[:-1]:
        node = node[k]
    if kind == "set":
        node[path[-1]] = value
    elif kind == "delete":
        node.pop(path[-1], None)
    else:
        target = node[path[-1]] if isinstance(node[path[-1]], dict) else node
        target["zz_unknown_key"] = value


def _settings(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=False, database=None,
                    print_blob=True, suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_valid_config_loads(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(json.dumps(VALID))
    cfg = load_pipeline(f)
    assert cfg.name == "fuzz_p" and set(cfg.tables) == {"orders", "customers"}


def test_a_path_with_a_nul_character_is_a_config_error(tmp_path: Path) -> None:
    """Found by the property test below: a NUL in a path setting was a bare ValueError
    ("embedded null byte") from pathlib, a traceback instead of exit 2 naming the key."""
    raw = copy.deepcopy(VALID)
    raw["source"]["path"] = "landing\x00x"
    f = tmp_path / "p.yaml"
    f.write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as e:
        load_pipeline(f)
    assert e.value.key == "source.path" and "NUL" in str(e.value), str(e.value)


@_settings(2000 if SLOW else 150)
@given(muts=st.lists(mutations(), min_size=1, max_size=3))
def test_mutated_config_is_accepted_or_named(tmp_path_factory: Any, muts: list) -> None:
    raw = copy.deepcopy(VALID)
    for kind, path, value in muts:
        try:
            _apply(raw, kind, path, value)
        except (KeyError, TypeError, AttributeError):
            pass  # an earlier mutation removed/replaced the parent: nothing to mutate
    f = tmp_path_factory.mktemp("fz") / "pipeline.yaml"
    f.write_text(json.dumps(raw, default=str), encoding="utf-8")
    note(f"mutations={muts!r}")
    try:
        load_pipeline(f)
    except ConfigError as e:
        msg = str(e)
        assert str(f) in msg or f.name in msg, f"error does not name the file: {msg}"
        assert e.key, f"error names no key for a key mutation: {msg}"
        assert e.key.split(".")[0].split("[")[0] in {*VALID, "kind", "zz_unknown_key"} | \
            {p[0] for p in PATHS}, f"error key {e.key!r} is not a config key: {msg}"
        assert e.key in msg and e.message.strip(), msg


@_settings(500 if SLOW else 60)
@given(text=st.one_of(st.text(max_size=200),
                      st.binary(max_size=120).map(lambda b: b.decode("latin-1"))))
def test_random_text_is_a_config_error(tmp_path_factory: Any, text: str) -> None:
    f = tmp_path_factory.mktemp("fzt") / "pipeline.yaml"
    f.write_text(text, encoding="utf-8")
    try:
        load_pipeline(f)
    except ConfigError as e:
        assert str(f.resolve()) in str(e) or f.name in str(e), str(e)
    else:  # random text that is a valid pipeline is astronomically unlikely
        raise AssertionError(f"random text accepted as a pipeline: {text!r}")


def test_surrogate_escapes_are_joined_or_named(tmp_path: Path) -> None:
    """Found by the fuzz test in CI: JSON/YAML ``"\\ud800\\udc00"`` escapes reach PyYAML as two
    surrogates; the pair must become its character, a lone one a ConfigError naming the key."""
    raw = copy.deepcopy(VALID)
    raw["source"]["path"] = "\U00010000"  # json.dumps writes it as the escaped pair
    f = tmp_path / "pipeline.yaml"
    f.write_text(json.dumps(raw), encoding="utf-8")
    assert "\\ud800\\udc00" in f.read_text()
    assert load_pipeline(f).landing_path.name == "\U00010000"
    f.write_text(json.dumps(raw).replace("\\ud800\\udc00", "\\ud800"), encoding="utf-8")
    try:
        load_pipeline(f)
    except ConfigError as e:
        assert e.key == "source.path" and "surrogate" in str(e), str(e)
        str(e).encode("utf-8", "backslashreplace")
    else:
        raise AssertionError("a lone surrogate escape was accepted")
    raw["source"].pop("path")
    f.write_text(json.dumps(raw).replace('"glob"', '"\\udc00glob"'), encoding="utf-8")
    try:
        load_pipeline(f)
    except ConfigError as e:
        assert "source.\\udc00glob" in e.key, e.key
    else:
        raise AssertionError("a key with a lone surrogate escape was accepted")


def test_substituted_scd_and_fraction_are_read_as_numbers(tmp_path: Path, monkeypatch: Any) -> None:
    """``${VAR}`` expands to text: ``scd`` (CDC and dimension kinds) and
    ``quarantine.max_fraction`` take it as the number it spells, and still name a bad value."""
    monkeypatch.setenv("SCD", "2")
    monkeypatch.setenv("FRAC", "0.25")
    (tmp_path / "landing").mkdir()
    body = ("pipeline: subst\nsource: {format: maxwell, path: landing, database: shop}\n"
            "storage: {root: lake}\ntables:\n  orders:\n    keys: [id]\n    scd: ${SCD}\n"
            "quarantine:\n  max_fraction: ${FRAC}\n  max_rows: ${ROWS:-7}\n")
    p = tmp_path / "p.yaml"
    p.write_text(body, encoding="utf-8")
    cfg = load_pipeline(p)
    q = cfg.quarantine_limits
    assert (cfg.tables["orders"].scd, q.max_fraction, q.max_rows) == \
        (2, 0.25, 7)
    for var, value, key in (("SCD", "3", "tables.orders.scd"), ("SCD", "true", "tables.orders.scd"),
                            ("FRAC", "1.5", "quarantine.max_fraction"),
                            ("FRAC", "half", "quarantine.max_fraction")):
        monkeypatch.setenv(var, value)
        try:
            load_pipeline(p)
        except ConfigError as e:
            assert key in str(e) and value in str(e), str(e)
        else:
            raise AssertionError(f"{var}={value} was accepted")
        monkeypatch.setenv("SCD", "2")
        monkeypatch.setenv("FRAC", "0.25")


def test_a_folder_name_delta_rs_would_decode_is_refused(tmp_path: Path) -> None:
    """delta-rs 1.6.6 writes a table under ``a%41b`` and then reads its log from ``aAb`` (File
    not found, every run): refused at load naming the key; a bare ``%`` is fine."""
    (tmp_path / "landing").mkdir()
    for root, bad in (("lake%41x", True), ("lake%2Fx", True), ("lake100%", False), ("50%off", False)):
        raw = {**VALID, "storage": {"root": root}}
        f = tmp_path / "p.yaml"
        f.write_text(json.dumps(raw))
        try:
            load_pipeline(f)
        except ConfigError as e:
            assert bad, (root, str(e))
            assert "storage.checkpoint" in str(e) and root in str(e) and "URL escape" in str(e), str(e)
        else:
            assert not bad, f"storage.root {root!r} was accepted"
    raw = {**VALID, "tables": {"orders": {"keys": ["id"], "path": "t%C3%A9/orders"}}}
    f.write_text(json.dumps(raw))
    try:
        load_pipeline(f)
    except ConfigError as e:
        assert "tables.orders.path" in str(e) and "t%C3%A9" in str(e), str(e)
    else:
        raise AssertionError("tables.orders.path with %C3%A9 was accepted")


@pytest.mark.parametrize("root", ["lake[y]", "lake^x", "la|ke", "la\\ke", "lake\tx"])
def test_a_table_path_delta_rs_cannot_use_is_refused(tmp_path: Path, root: str) -> None:
    """Tester: a lake root with '[' made delta-rs panic inside a micro-batch, and the Spark run
    hung for good holding the pipeline lock; '\\' and control characters fail every write.
    Refused at load, naming the first Delta table's key (the checkpoint and run summaries are
    plain files, not refused for this)."""
    (tmp_path / "landing").mkdir()
    f = tmp_path / "p.yaml"
    f.write_text(json.dumps({**VALID, "storage": {"root": root}}))
    with pytest.raises(ConfigError) as e:
        load_pipeline(f)
    assert e.value.key.startswith("tables.") and "delta-rs" in str(e.value), str(e.value)
    assert repr(next(c for c in root if c in "[]^|\\\t")) in str(e.value), str(e.value)


@pytest.mark.parametrize("landing", ["land[1]", "land{a,b}", "land*", "land?"])
def test_a_landing_folder_spark_would_read_as_a_glob_is_refused(tmp_path: Path, landing: str) -> None:
    """Tester: ``source.path`` of a folder named ``land[1]`` read nothing (or the folder
    ``land1``), exit 0: Spark's file source takes the path as a glob pattern."""
    (tmp_path / landing).mkdir()
    f = tmp_path / "p.yaml"
    f.write_text(json.dumps({**VALID, "source": {**VALID["source"], "path": landing}}))
    with pytest.raises(ConfigError) as e:
        load_pipeline(f)
    assert e.value.key == "source.path" and "glob pattern" in str(e.value), str(e.value)


def test_a_session_time_zone_other_than_utc_is_refused(tmp_path: Path) -> None:
    """Tester: ``spark.conf: {spark.sql.session.timeZone: Australia/Lord_Howe}`` was replaced by
    UTC without a word; now exit 2 naming the key. UTC itself is fine."""
    (tmp_path / "landing").mkdir()
    f = tmp_path / "p.yaml"
    for tz, bad in (("Australia/Lord_Howe", True), ("UTC", False), ("Etc/UTC", False)):
        f.write_text(json.dumps({**VALID, "spark": {"conf": {"spark.sql.session.timeZone": tz}}}))
        try:
            load_pipeline(f)
        except ConfigError as e:
            assert bad and e.key == "spark.conf.spark.sql.session.timeZone" and tz in str(e), str(e)
        else:
            assert not bad, f"{tz} was accepted"


def test_a_duplicate_name_is_named(tmp_path: Path) -> None:
    """Tester: a duplicate in ``ignore_tables`` printed the whole list as "has duplicates"."""
    (tmp_path / "landing").mkdir()
    f = tmp_path / "p.yaml"
    f.write_text(json.dumps({**VALID, "ignore_tables": ["shop.a", "shop.b", "shop.a"]}))
    try:
        load_pipeline(f)
    except ConfigError as e:
        assert "ignore_tables" in str(e) and "lists 'shop.a' more than once" in str(e), str(e)
    else:
        raise AssertionError("a duplicate in ignore_tables was accepted")
