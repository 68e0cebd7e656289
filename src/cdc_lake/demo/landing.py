"""Landing files: JSON lines, named so lexical order is capture order, written atomically.

A file is first written as ``.<name>.tmp`` (hidden, so Spark's file source never lists it) and
then renamed into place, so a reader sees either no file or the whole file.

Example::

    landing = LandingWriter(Path("data/landing/shop_canal"), "canal")
    landing.write(lines, lines_per_file=500)   # [.../canal-000001.json, .../canal-000002.json]
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def file_name(prefix: str, seq: int) -> str:
    """``<prefix>-000042.json``: zero-padded so lexical order equals numeric order."""
    return f"{prefix}-{seq:06d}.json"


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` via a hidden temp file and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


class LandingWriter:
    """Writes numbered JSON-lines files into one landing folder.

    Args:
        out_dir: the landing folder.
        prefix: file name prefix (the format name).
        next_seq: number of the next file (continues across runs).
    """

    def __init__(self, out_dir: Path, prefix: str, *, next_seq: int = 1) -> None:
        self.out_dir = out_dir
        self.prefix = prefix
        self.next_seq = next_seq

    def write_file(self, lines: Sequence[str]) -> Path:
        """One file holding ``lines`` (each gets a trailing newline)."""
        path = self.out_dir / file_name(self.prefix, self.next_seq)
        if path.exists():
            raise FileExistsError(f"{path} already exists; refusing to overwrite landed data")
        write_atomic(path, "".join(f"{line}\n" for line in lines))
        self.next_seq += 1
        return path

    def write(self, lines: Sequence[str], *, lines_per_file: int) -> list[Path]:
        """Split ``lines`` into files of at most ``lines_per_file`` lines (none if empty)."""
        if lines_per_file < 1:
            raise ValueError(f"lines_per_file must be >= 1, got {lines_per_file!r}")
        return [self.write_file(lines[i:i + lines_per_file])
                for i in range(0, len(lines), lines_per_file)]
