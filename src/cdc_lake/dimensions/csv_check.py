"""A CSV snapshot checked as a file before Spark reads it: UTF-8, RFC 4180, one field count,
one record separator.

Spark's CSV reader (multiLine, FAILFAST) accepts things a full snapshot must not be: a quote
left open runs to the end of the file as one value, and every key after it is deleted by the
refresh with exit 0; bytes that are not UTF-8 are stored as U+FFFD; a file whose records end
with CRLF and LF by turns keeps a ``\\r`` in the last column (or merges two records), since the
reader takes one separator for the file (testers). Python's ``csv`` module in strict mode reads
the file once by RFC 4180 (a doubled quote is one quote, a line break inside a quoted value is
part of it) and every problem becomes :class:`SnapshotInvalid` (exit 3) naming the file, the
line and the fix; nothing is written.

Example::

    check_csv_file(Path("snapshots/2026-01-02.csv"), delimiter=",")   # raises SnapshotInvalid
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from pathlib import Path

from cdc_lake.dimensions.diff import SnapshotInvalid

_CHUNK = 1 << 22
_FIX = "fix the export and re-run this date; nothing was written"


def check_csv_file(f: Path, *, delimiter: str) -> None:
    """Raise :class:`SnapshotInvalid` unless ``f`` (``.gz`` too) is UTF-8 CSV by RFC 4180 with
    the same number of fields in every record and one kind of record end (CRLF or LF)."""
    try:
        crlf, lf, size = _line_ends(f)
    except (EOFError, OSError, zlib.error):
        return  # not readable as such (a damaged .gz): Spark's read reports it
    if size == 0:
        raise SnapshotInvalid(f"{f}: the file is empty (0 bytes; not even a header): a full "
                              f"snapshot has at least its header line; {_FIX}")
    fields, crlf_in, lf_in, line = None, 0, 0, 0
    opener = gzip.open if f.name.endswith(".gz") else open
    with opener(f, "rb") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="strict", newline="")
        reader = csv.reader(text, delimiter=delimiter, quotechar='"', doublequote=True, strict=True)
        try:
            for row in reader:
                line = reader.line_num  # the record read ends on this line
                if not row:
                    continue  # a blank line: Spark skips it too
                if fields is None:
                    fields, first = len(row), reader.line_num
                elif len(row) != fields:
                    raise SnapshotInvalid(
                        f"{f}: the record ending on line {line} has {len(row)} field(s), the first "
                        f"one (line {first}) {fields}: a delimiter too many or too few, or a "
                        f"value with a {delimiter!r} that is not quoted; {_FIX}")
                for v in row:
                    if "\n" in v or "\r" in v:
                        n = v.count("\r\n")
                        crlf_in, lf_in = crlf_in + n, lf_in + v.count("\n") - n
        except csv.Error as e:
            where = f"the record starting on line {line + 1}" + (
                f" (read up to line {reader.line_num})" if reader.line_num > line + 1 else "")
            raise SnapshotInvalid(
                f"{f}: not valid CSV in {where}: {e} (a quote left open runs to the end of the "
                "file, or a quote inside a quoted value that is not doubled); Spark would read "
                f"it differently (an open quote: every record after it as one value); {_FIX}") from None
        except UnicodeDecodeError as e:
            at, text_line = _first_bad_utf8(f)
            raise SnapshotInvalid(
                f"{f}: not UTF-8 text: line {at[0]}, byte {at[1]} of the file ({text_line!r}: "
                f"{e.reason}); Spark would store such bytes as U+FFFD, losing them. Export the file "
                f"as UTF-8 (e.g. iconv -f latin1 -t utf-8); {_FIX}") from None
    ends_crlf, ends_lf = crlf - crlf_in, lf - lf_in
    if ends_crlf > 0 and ends_lf > 0:
        raise SnapshotInvalid(
            f"{f}: records end with CRLF ({ends_crlf}) and with LF ({ends_lf}) by turns; Spark "
            "reads a file with one record separator (the first line's), so the others would keep "
            f"a carriage return in their last value or run into the next record; {_FIX}")


def _first_bad_utf8(f: Path) -> tuple[tuple[int, int], bytes]:
    """``((line, byte offset), that line's first bytes)`` of the first line that is not UTF-8
    (the decoder reads ahead of the csv reader, so its position is not the line's)."""
    opener = gzip.open if f.name.endswith(".gz") else open
    offset = 0
    with opener(f, "rb") as fh:
        for n, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return (n, offset + e.start), raw[:80]
            offset += len(raw)
    return (0, 0), b""


def _line_ends(f: Path) -> tuple[int, int, int]:
    """``(CRLF count, bare LF count, size)`` of the file's bytes (decompressed)."""
    opener = gzip.open if f.name.endswith(".gz") else open
    crlf = lf = size = 0
    prev_cr = False
    with opener(f, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            size += len(chunk)
            pairs = chunk.count(b"\r\n") + (1 if prev_cr and chunk[:1] == b"\n" else 0)
            crlf, lf = crlf + pairs, lf + chunk.count(b"\n") - pairs
            prev_cr = chunk[-1:] == b"\r"
    return crlf, lf, size
