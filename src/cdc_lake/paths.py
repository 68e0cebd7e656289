"""Paths a pipeline writes, and the rule that no two writers share one (any kind).

A table, checkpoint or output folder written by two pipelines, or by one pipeline under two
keys, loses data: both runs MERGE into one table, a side-table append and a table MERGE carry the
same transaction id (the second is skipped as done), ``--reprocess`` / ``--full-refresh`` of one
deletes the other's data. :func:`overlap` is the one rule (compared after resolving symlinks and
``..``); each kind's config applies it to its own paths, :func:`check_shared_paths` across the
pipelines of a folder (``config.load_all``, the DAG import).

:func:`check_path_escapes` refuses a path delta-rs would read from another folder than the one it
writes (a ``%`` followed by two hex digits), or cannot use at all (``[ ] ^ | \\``, control
characters).

Example::

    overlap(Path("/lake/_quarantine"), Path("/lake"))   # 'lies inside'
    errors = check_shared_paths([cfg_a, cfg_b])         # one ConfigError per pipeline involved
    check_path_escapes(cfg)                             # at load; raises ConfigError
"""

from __future__ import annotations

import re
import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cdc_lake.config import ConfigError


def written_paths(cfg: Any) -> list[tuple[str, Path, str | None]]:
    """Everything a pipeline of any kind writes (and may delete: ``--reprocess``,
    ``--full-refresh``), as ``(dotted key, path, log)``; ``log`` names an append-only log table
    that pipelines may share (``quarantine``, ``ddl_log``: rows carry the pipeline), else None."""
    kind = getattr(cfg, "kind", "cdc")
    out: list[tuple[str, Path, str | None]] = [("storage.checkpoint", cfg.checkpoint_path, None)]
    if kind == "enrich":
        o = cfg.outputs
        out += [("outputs.enriched", o.enriched, None), ("outputs.pending", o.pending, None),
                ("outputs.manifest", o.manifest, None), ("outputs.quarantine", o.quarantine, "quarantine")]
        out += [(f"outputs.aggregates.{a.name}.path", a.path, None) for a in o.aggregates]
        events = cfg.fact.events
        if events is not None and events.archive_dir is not None:  # shareable, as source.archive_dir
            out.append(("fact.events.archive_dir", events.archive_dir, "archive"))
    elif kind == "dimension":
        out = [("storage.state", cfg.checkpoint_path, None), ("table", cfg.table, None)]
    else:
        for t in cfg.tables.values():
            out += [(f"tables.{t.name}.path", t.path, None),
                    (f"tables.{t.name} (its tombstone table)", cfg.tombstone_path(t.name), None)]
        out += [("storage.quarantine", cfg.quarantine_path, "quarantine"),
                ("storage.ddl_log", cfg.ddl_log_path, "ddl_log"),
                ("storage.root (full-refresh staging)", cfg.lake_root / "_staging" / cfg.name, None)]
        if getattr(cfg, "archive_path", None) is not None:
            # shareable: Spark files each landing folder's files under their own full path
            out.append(("source.archive_dir", cfg.archive_path, "archive"))
        capture = getattr(cfg, "capture", None)
        if capture is not None:
            out.append(("source.path (written by capture)", cfg.landing_path, None))
            if capture.state_path is not None:
                out.append(("capture.state", capture.state_path, None))
    out.append(("storage.runs", cfg.runs_path / cfg.name, None))
    return out


def overlap(a: Path, b: Path) -> str | None:
    """How two resolved paths overlap: ``'is'``, ``'lies inside'``, ``'contains'``, or None
    (disjoint). Example: ``overlap(Path("/l/t"), Path("/l"))`` -> ``'lies inside'``."""
    if a == b:
        return "is"
    if b in a.parents:
        return "lies inside"
    if a in b.parents:
        return "contains"
    return None


def check_shared_paths(configs: list[Any]) -> list[ConfigError]:
    """Two pipelines must not write one path, nor one inside the other: outputs, checkpoints,
    tables of any kind (compared after resolving symlinks and ``..``). Otherwise both runs merge
    into one table and ``--reprocess``/``--full-refresh`` of one deletes the other's data (seen:
    two enrichment pipelines in one folder with an aggregate of one name shared
    ``<root>/<name>``). Only a shared append-only log (``quarantine`` with ``quarantine``,
    ``ddl_log`` with ``ddl_log``) may be the same path. One :class:`ConfigError` per pipeline
    involved, naming both YAML files, both keys and the paths."""
    claims = [(cfg, [(k, p, Path(p).resolve(), log) for k, p, log in written_paths(cfg)])
              for cfg in configs]
    errors: list[ConfigError] = []
    for i, (a, pa) in enumerate(claims):
        for b, pb in claims[i + 1:]:
            hit = next(((ka, ra, how, kb, rb) for ka, _, ra, la in pa for kb, _, rb, lb in pb
                        if (how := overlap(ra, rb)) is not None
                        and not (how == "is" and la is not None and la == lb)), None)
            if hit is None:
                continue
            ka, ra, how, kb, rb = hit
            back = {"is": "is", "lies inside": "contains", "contains": "lies inside"}[how]
            for (me, key, mine, verb), (other, okey, theirs) in (
                    ((a, ka, ra, how), (b, kb, rb)), ((b, kb, rb, back), (a, ka, ra))):
                errors.append(ConfigError(me.file, key, (
                    f"{mine} {verb} {'the path' if verb == 'is' else theirs} that pipeline "
                    f"{other.name!r} ({other.file}) writes as {okey}: two pipelines must not write "
                    "one table or folder, nor one inside the other (both runs would merge into "
                    "one table, and --reprocess or --full-refresh of one would delete the "
                    f"other's data). Give one of them a path of its own (this file's {key} or "
                    f"{other.file.name}'s {okey}); neither pipeline's DAG is loaded until then")))
    return errors


_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
# Characters delta-rs 1.6.6 refuses in a local table path (checked one by one with
# write_deltalake: [ ] ^ | raise a Rust panic, \\ and control characters a DeltaError).
_URL_REFUSED = frozenset("[]^|\\")
_NOT_DELTA = frozenset({"storage.checkpoint", "storage.state", "storage.runs", "capture.state",
                        "source.path (written by capture)",
                        "source.archive_dir", "fact.events.archive_dir"})  # plain files, no Delta table


def check_path_escapes(cfg: Any) -> None:
    """Raise :class:`ConfigError` when a path the pipeline writes, or a Delta table it reads,
    holds ``%`` followed by two hex digits. delta-rs 1.6.6 (the ``deltalake`` engine) takes such a
    folder name as a URL escape on reads but not on writes: a table written under ``/l/a%41b``
    is then looked for under ``/l/aAb`` ("File not found: .../_delta_log/0...0.json", checked);
    a bare ``%`` (``/l/100%``) works. Checked for every engine: a pipeline's engine can change."""
    paths = [(key, Path(p)) for key, p, _ in written_paths(cfg)]
    sources = getattr(cfg, "change_feed_sources", None)
    paths += [("fact.change_feed", Path(p)) for p in (sources() if callable(sources) else ())]
    paths += [(f"dimensions.{d.name}.table", Path(d.table))
              for d in getattr(cfg, "dimensions", ()) if getattr(d, "table", None) is not None]
    for key, p in paths:
        hit = next((part for part in p.parts if _ESCAPE.search(part)), None)
        if hit is not None:
            raise ConfigError(cfg.file, key, (
                f"{p}: the folder name {hit!r} holds {_ESCAPE.search(hit).group(0)!r}, which "
                "delta-rs reads as a URL escape: a Delta table under it would be written in one "
                "folder and looked for in another. Rename the folder (a '%' not followed by two "
                "hex digits is fine)"))
        bad = sorted({ch for ch in str(p) if ch in _URL_REFUSED or ord(ch) < 32 or ord(ch) == 127})
        if bad and key not in _NOT_DELTA:
            raise ConfigError(cfg.file, key, (
                f"{str(p)!r} holds {', '.join(repr(c) for c in bad)}, which delta-rs 1.6 cannot "
                "put in a table's URL (for [ ] ^ | it panics inside a micro-batch, and the Spark "
                "run hung holding the pipeline lock: tester). Use a path without these "
                "characters"))


_GLOB = re.compile(r"([\\\[\]{}*?])")


def glob_escape(path: str) -> str:
    """``path`` as Spark's file readers take it literally: they expand Hadoop glob patterns
    (``{a,b}``, ``[ab]``, ``*``, ``?``) in every path they are given, so a folder or file named
    ``cats[1]_2026-01-01.csv`` or ``lake {x}`` was read as a pattern: another file, or none
    (tester: a dimension snapshot loaded from a decoy file, exit 0). A backslash escapes.

    Example::

        spark.read.csv(glob_escape("/snapshots/cats[1]_2026-01-01.csv"))
    """
    return _GLOB.sub(r"\\\1", path)


def mv_aside(path: Any, suffix: str = ".damaged") -> str:
    """The shell command that moves ``path`` aside, quoted for paths with spaces, the new name
    stamped with the UTC time the message was written
    (``mv '/lake dir/orders' '/lake dir/orders.damaged-20261127T061500Z'``): a second recovery
    of the same path gets its own name instead of moving the path into the first copy (``mv a
    b`` with ``b`` an existing folder moves ``a`` inside it)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"mv {shlex.quote(str(path))} {shlex.quote(f'{path}{suffix}-{stamp}')}"


def q(path: Any) -> str:
    """``path`` quoted for a shell command the operator pastes."""
    return shlex.quote(str(path))

