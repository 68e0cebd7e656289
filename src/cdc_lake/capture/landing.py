"""Landing files (hidden while written, renamed when complete) and the open transaction's rows."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from cdc_lake.capture.state import BinlogPos, default_file_mode, fsync_dir, remove_files


class LandingWriter:
    """One open landing file at a time: hidden tmp name while written, renamed when complete."""

    def __init__(self, out_dir: Path, prefix: str) -> None:
        self.out_dir = out_dir
        self.prefix = prefix
        self._f: Any = None
        self._tmp: Path | None = None
        self.start: BinlogPos | None = None
        self.lines = 0
        self.bytes = 0
        self.opened_at = 0.0

    @property
    def is_open(self) -> bool:
        return self._f is not None

    def open(self, start: BinlogPos) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.prefix}-inflight-", suffix=".json.tmp",
                                   dir=self.out_dir)
        os.fchmod(fd, default_file_mode())  # mkstemp makes 0600: readers of the lake need read
        self._f = os.fdopen(fd, "w", encoding="utf-8", newline="\n", buffering=1 << 20)
        self._tmp = Path(tmp)
        self.start = start
        self.lines = self.bytes = 0
        self.opened_at = time.monotonic()

    def remove_leftovers(self) -> list[Path]:
        """Remove the in-flight files of a capture that was killed (SIGKILL, power loss) before
        it could clean up; called under the state lock (one capture per landing folder and
        prefix). Their transactions were never recorded, so the run re-reads them."""
        return remove_files(self.out_dir.glob(f".{self.prefix}-inflight-*.json.tmp"))

    def write(self, lines: Iterable[str]) -> None:
        for line in lines:
            self._f.write(line)
            self._f.write("\n")
            self.lines += 1
            self.bytes += len(line) + 1

    def final_name(self, end: BinlogPos) -> str:
        assert self.start is not None
        return (f"{self.prefix}-{self.start.index:010d}-{self.start.pos:012d}"
                f"-{end.index:010d}-{end.pos:012d}.json")

    def commit(self, end: BinlogPos) -> Path:
        assert self._f is not None and self._tmp is not None
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        final = self.out_dir / self.final_name(end)
        os.replace(self._tmp, final)  # same content if a crash made us re-capture this range
        fsync_dir(self.out_dir)
        self._f = self._tmp = None
        return final

    def abort(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            finally:
                if self._tmp is not None:
                    try:
                        self._tmp.unlink()
                    except OSError:
                        pass
                self._f = self._tmp = None


class TxnBuffer:
    """Rows of the open transaction; ``xid`` and ``commit`` are only known at its end.

    Kinds: ``r`` a row of a transactional table, ``n`` a row of a non-transactional one (MyISAM,
    Aria: a ROLLBACK does not undo it), ``d`` a DDL record. ``savepoint(name)`` /
    ``rollback_to(name)`` follow ``SAVEPOINT`` and ``ROLLBACK TO`` in the binlog: the ``r`` rows
    after the savepoint are dropped, ``n`` rows stay (as in the database)."""

    def __init__(self, spill_dir: Path, spill_rows: int) -> None:
        self.spill_dir = spill_dir
        self.spill_rows = spill_rows
        self.items: list[tuple[str, str, str]] = []
        self.count = 0
        self.rows = 0
        self._spill: Any = None
        self._savepoints: dict[str, int] = {}

    def add(self, kind: str, head: str, tail: str) -> None:
        self.items.append((kind, head, tail))
        self.count += 1
        if kind in ("r", "n"):
            self.rows += 1
        if len(self.items) >= self.spill_rows:
            if self._spill is None:
                self._spill = tempfile.TemporaryFile("w+", encoding="utf-8", dir=self.spill_dir,
                                                     prefix=".capture-spill-")
            for k, h, t in self.items:  # JSON text never holds a raw tab or newline
                self._spill.write(f"{k}\t{h}\t{t}\n")
            self.items.clear()

    def _iter(self) -> Iterator[tuple[str, str, str]]:
        if self._spill is not None:
            self._spill.seek(0)
            for line in self._spill:
                k, h, t = line.rstrip("\n").split("\t")
                yield k, h, t
        yield from self.items

    def savepoint(self, name: str) -> None:
        self._savepoints[name] = self.count

    def rollback_to(self, name: str) -> None:
        """Drop the transactional rows added since ``savepoint(name)``; later savepoints end.
        An unknown name (its SAVEPOINT came before the capture's start) changes nothing."""
        mark = self._savepoints.get(name)
        if mark is not None:
            self._drop_transactional_after(mark)

    def rollback(self) -> None:
        """A logged ROLLBACK (the transaction changed a non-transactional table): only the
        ``n`` rows and DDL records stay."""
        self._drop_transactional_after(0)

    def _drop_transactional_after(self, mark: int) -> None:
        kept = [it for i, it in enumerate(self._iter()) if i < mark or it[0] != "r"]
        marks = {n: m for n, m in self._savepoints.items() if m <= mark}  # rows before stay put
        self.clear()
        for it in kept:
            self.add(*it)
        self._savepoints = marks

    def render(self, ts: int, xid: int | None) -> Iterator[str]:
        last_row = self.rows
        n_row = 0
        for i, (kind, head, tail) in enumerate(self._iter()):
            if kind in ("r", "n"):
                n_row += 1
                x = f',"xid":{xid}' if xid is not None else ""
                c = ',"commit":true' if n_row == last_row else ""
                yield f'{head},"ts":{ts}{x},"xoffset":{i}{c}{tail}'
            else:
                yield f'{head},"xoffset":{i}{tail}'

    def clear(self) -> None:
        self.items.clear()
        self.count = self.rows = 0
        self._savepoints = {}
        if self._spill is not None:
            self._spill.close()
            self._spill = None

