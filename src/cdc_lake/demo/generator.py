"""Demo data generator: simulated shop days -> landing files of one format, resumable.

:func:`generate` simulates ``days`` days of the shop database (:mod:`~cdc_lake.demo.shop_model`),
serializes them in one format (:mod:`~cdc_lake.demo.writers`) and lands them as numbered JSON
lines files (:mod:`~cdc_lake.demo.landing`). It saves the simulation state in
``<out>/.cdc-demo-state.json`` (hidden, so Spark never reads it); a later call with
``start_day`` equal to the next day continues the same history and writes only new files.
Days are seeded individually, so ``days=3`` once equals ``days=2`` then ``start_day=2, days=1``,
file for file.

:func:`history_lines` is the same in memory, for tests.

Example::

    result = generate(Path("data/landing/shop_maxwell"), "maxwell", days=3, seed=7)
    result.files          # [.../maxwell-000001.json, ...]
    result = generate(Path("data/landing/shop_maxwell"), "maxwell", days=1, seed=7, start_day=3)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from cdc_lake.demo.binlog import BinlogEntry
from cdc_lake.demo.landing import LandingWriter, write_atomic
from cdc_lake.demo.shop_model import ShopSimulation
from cdc_lake.demo.writers import FORMATS, FormatWriter, make_writer

STATE_FILE = ".cdc-demo-state.json"
STATE_VERSION = 1


class GeneratorError(ValueError):
    """Bad arguments, or a landing folder whose saved state does not fit them."""


@dataclass(frozen=True)
class GeneratorOptions:
    """Everything that shapes the generated history besides the number of days.

    Args:
        fmt: ``debezium``, ``maxwell`` or ``canal``.
        seed: RNG seed of the whole history.
        txns_per_day: transactions per simulated day.
        alter_day: day on which ``customers`` gains ``loyalty_tier``.
        lines_per_file: maximum lines per landing file (files never span days).
        debezium_schema: Debezium lines with the ``{"schema", "payload"}`` wrapper.
        debezium_tombstones: a ``null`` line after each Debezium delete.
        maxwell_position: Maxwell lines carry ``position`` (else order is ts, xid, xoffset).
        maxwell_commit_xoffset: the commit row of a transaction carries ``xoffset`` too (real
            Maxwell omits it there).
        max_binlog_size: binlog file size that triggers a rotation.
    """

    fmt: str
    seed: int = 7
    txns_per_day: int = 80
    alter_day: int = 1
    lines_per_file: int = 200
    debezium_schema: bool = True
    debezium_tombstones: bool = True
    maxwell_position: bool = True
    maxwell_commit_xoffset: bool = True
    max_binlog_size: int = 64 * 1024

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise GeneratorError(f"format {self.fmt!r} is unknown; use one of {', '.join(FORMATS)}")
        for name in ("txns_per_day", "lines_per_file", "max_binlog_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise GeneratorError(f"{name} must be an integer >= 1, got {v!r}")

    def writer_options(self) -> dict[str, Any]:
        if self.fmt == "debezium":
            return {"with_schema": self.debezium_schema, "tombstones": self.debezium_tombstones}
        if self.fmt == "maxwell":
            return {"with_position": self.maxwell_position,
                    "commit_xoffset": self.maxwell_commit_xoffset}
        return {}

    def new_simulation(self) -> ShopSimulation:
        return ShopSimulation(self.seed, txns_per_day=self.txns_per_day,
                              alter_day=self.alter_day, max_binlog_size=self.max_binlog_size)


@dataclass(frozen=True)
class GenerateResult:
    """What one :func:`generate` call wrote."""

    files: list[Path]
    first_day: int
    next_day: int
    lines: int
    state_file: Path


def _serialize(writer: FormatWriter, entries: list[BinlogEntry]) -> list[str]:
    return [line for entry in entries for line in writer.lines(entry)]


def history_lines(fmt: str, *, days: int, seed: int = 7, **options: Any
                  ) -> tuple[list[str], ShopSimulation]:
    """All lines of ``days`` simulated days in capture order, and the simulation (whose
    ``rows`` are the true final database state). ``options`` as in :class:`GeneratorOptions`.
    """
    opts = GeneratorOptions(fmt=fmt, seed=seed, **options)
    sim = opts.new_simulation()
    writer = make_writer(fmt, **opts.writer_options())
    lines: list[str] = []
    for _ in range(days):
        lines += _serialize(writer, sim.simulate_day())
    return lines, sim


def load_state(out_dir: Path) -> dict[str, Any] | None:
    """The saved generator state of a landing folder, or None if there is none."""
    path = out_dir / STATE_FILE
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise GeneratorError(f"{path}: unreadable generator state ({e}); delete the folder and "
                             "generate again") from None
    if state.get("version") != STATE_VERSION:
        raise GeneratorError(f"{path}: state version {state.get('version')!r} is not "
                             f"{STATE_VERSION}; delete the folder and generate again")
    return state


def generate(out_dir: Path, fmt: str, *, days: int, seed: int | None = None,
             start_day: int | None = None, **options: Any) -> GenerateResult:
    """Simulate ``days`` more days and land them in ``out_dir``.

    Args:
        out_dir: landing folder (created if missing).
        fmt: ``debezium``, ``maxwell`` or ``canal``.
        days: number of days to simulate (>= 1).
        seed: RNG seed (default 7; when continuing, must match the saved one if given).
        start_day: day to start at. ``None`` or 0 starts a new history in an empty folder; to
            append to an existing folder pass the next day (the one after its last day).
        **options: further :class:`GeneratorOptions` fields; when continuing, any given must
            match the saved ones.

    Returns:
        The files written (only new ones), the days covered and the state file.

    Raises:
        GeneratorError: bad arguments, or ``start_day`` does not continue the saved state.
    """
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise GeneratorError(f"days must be an integer >= 1, got {days!r}")
    out_dir = Path(out_dir)
    state = load_state(out_dir)
    state_path = out_dir / STATE_FILE
    if state is None:
        if start_day not in (None, 0):
            raise GeneratorError(f"{out_dir}: no generator state ({STATE_FILE}) to continue from "
                                 f"at day {start_day}; start with --start-day 0 (or omit it)")
        existing = sorted(out_dir.glob(f"{fmt}-*.json")) if out_dir.exists() else []
        if existing:
            raise GeneratorError(f"{out_dir}: holds {len(existing)} {fmt} files but no "
                                 f"{STATE_FILE}; use an empty folder")
        opts = GeneratorOptions(fmt=fmt, seed=7 if seed is None else seed, **options)
        sim = opts.new_simulation()
        writer = make_writer(fmt, **opts.writer_options())
        next_seq = 1
    else:
        saved = dict(state["options"])
        given = {"fmt": fmt, **({"seed": seed} if seed is not None else {}), **options}
        diff = {k: (saved.get(k), v) for k, v in given.items() if saved.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: saved {a!r}, given {b!r}" for k, (a, b) in diff.items())
            raise GeneratorError(f"{state_path}: options differ from the saved history ({detail});"
                                 " use the saved options or another --out")
        if start_day != state["next_day"]:
            raise GeneratorError(
                f"{out_dir}: already holds days 0..{state['next_day'] - 1} "
                f"(seed {saved['seed']}, {saved['fmt']}); pass --start-day {state['next_day']} "
                "to append the next days, or choose another --out")
        known = {f.name for f in fields(GeneratorOptions)}
        opts = GeneratorOptions(**{k: v for k, v in saved.items() if k in known})
        sim = ShopSimulation.from_state(state["simulation"])
        writer = make_writer(fmt, state=state["writer"], **opts.writer_options())
        next_seq = state["next_file_seq"]

    first_day = sim.day
    landing = LandingWriter(out_dir, fmt, next_seq=next_seq)
    files: list[Path] = []
    n_lines = 0
    for _ in range(days):
        lines = _serialize(writer, sim.simulate_day())
        n_lines += len(lines)
        files += landing.write(lines, lines_per_file=opts.lines_per_file)
        _save_state(state_path, opts, sim, writer, landing.next_seq)  # after every day
    return GenerateResult(files, first_day, sim.day, n_lines, state_path)


def _save_state(path: Path, opts: GeneratorOptions, sim: ShopSimulation, writer: FormatWriter,
                next_seq: int) -> None:
    state = {"version": STATE_VERSION, "options": asdict(opts), "next_day": sim.day,
             "next_file_seq": next_seq, "simulation": sim.to_state(), "writer": writer.state()}
    write_atomic(path, json.dumps(state, ensure_ascii=False, indent=None))
