"""Row and DDL events as Maxwell JSON lines (``docs/formats.md``, Maxwell), split into the
head (``{"database":..,"table":..,"type":..``) and tail (the rest, after ``ts``/``xid``,
which ``TxnBuffer.render`` fills in at the transaction's end).

    lines = MaxwellLines(SourceSchema(query))
    for undo, head, tail in lines.rows(event, "update", pos): ...
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from cdc_lake.capture import charsets
from cdc_lake.capture.binlog_stream import full_bitmap
from cdc_lake.capture.ddl import classify_ddl
from cdc_lake.capture.maxwell_json import binary_now_text, converter, enc, json_str, special_converter
from cdc_lake.capture.refusals import partial_row_image, type_changed_since
from cdc_lake.capture.source_schema import SourceSchema, is_current
from cdc_lake.capture.state import BinlogPos, CaptureBadValue, CaptureConfigError

Converters = list[tuple[str, Callable[[Any], Any]]]
Changed = list[tuple[str, str]]  # (column, how its type changed since the binlog was written)


class MaxwellLines:
    """Renders one table's row events with converters cached per table map."""

    def __init__(self, schema: SourceSchema) -> None:
        self.schema = schema  # today's keys, engines, types (cached; cleared by DDL)
        self._conv_cache: dict[int, tuple[Any, Converters, Changed]] = {}

    def _converters(self, event: Any) -> tuple[Converters, Changed]:
        tm = event.table_map[event.table_id]
        hit = self._conv_cache.get(event.table_id)
        if hit is not None and hit[0] is tm:
            return hit[1], hit[2]
        bad = charsets.unsupported_text_columns(event.columns)
        if bad:
            raise CaptureConfigError(
                f"{event.schema}.{event.table}: column(s) "
                + ", ".join(f"{c!r} (CHARACTER SET {cs})" for c, cs in bad)
                + " use a character set the capture cannot decode (its values would land as "
                "bytes, not text). Convert them (ALTER TABLE ... CONVERT TO CHARACTER SET "
                "utf8mb4) or leave the table out (--tables / --databases); nothing of this "
                "transaction was landed")
        today = self.schema.column_types(event.schema, event.table)
        convs = [(c.name, special_converter(c, today.get(c.name)) or converter(c))
                 for c in event.columns]
        changed = [(c.name, why) for c in event.columns
                   if (why := binary_now_text(c, today.get(c.name))) is not None]
        self._conv_cache[event.table_id] = (tm, convs, changed)
        return convs, changed

    def rows(self, event: Any, kind: str, pos: BinlogPos) -> Iterator[tuple[str, str, str]]:
        """``(undo, head, tail)`` per row; ``undo`` is ``r`` for a transactional table's row (a
        ROLLBACK TO drops it), ``n`` otherwise."""
        ncols = int(getattr(event, "number_of_columns", 0) or 0)
        images = [("", getattr(event, "columns_present_bitmap", None))]
        if kind == "update":
            images = [("before ", images[0][1]),
                      ("after ", getattr(event, "columns_present_bitmap2", None))]
        for label, bitmap in images:
            if not full_bitmap(bitmap, ncols):
                missing = [c.name for i, c in enumerate(event.columns)
                           if bitmap is not None and i < ncols and not bitmap[i // 8] & (1 << (i % 8))]
                raise partial_row_image(event.schema, event.table, kind, label, missing, pos)
        convs, changed = self._converters(event)
        if changed:
            raise type_changed_since(event.schema, event.table, changed, pos)
        if any(name is None or str(name).startswith("UNKNOWN_COL") for name, _ in convs):
            raise CaptureConfigError(f"{event.schema}.{event.table}: the binlog has no column names "
                                     "(binlog_row_metadata was not FULL when it was written)")
        pk_cols = self.schema.primary_key_columns(event.schema, event.table, event.primary_key)
        versioned = self.schema.versioned(event.schema, event.table, pk_cols)
        if versioned is not None:
            pk_cols = pk_cols[:-1]  # MariaDB appends the row-end column to every unique key
        prefix = f'{{"database":{json_str(event.schema)},"table":{json_str(event.table)},"type":'
        pk_cols_json = "[" + ",".join(json_str(c) for c in pk_cols) + "]"

        def conv(values: dict[str, Any], nones: dict[str, Any]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name, fn in convs:
                v = values.get(name)
                if v is None:
                    out[name] = "" if nones.get(name) == "empty set" else None
                else:
                    out[name] = fn(v)
            return out

        try:
            rows = event.rows  # decoded on first access
        except UnicodeDecodeError as e:
            raise CaptureBadValue(
                f"{event.schema}.{event.table}: a value at binlog position {pos} is not valid "
                f"{e.encoding} ({e.reason} at byte {e.start}: {e.object[e.start:e.start + 8]!r}), "
                "the character set its column declares; nothing of this transaction was "
                "landed. Fix or delete the row, or leave the table out (--tables / "
                "--databases) and capture from after it (--start FILE:POS with a new state "
                "file)") from None
        undoable = self.schema.transactional(event.schema, event.table)
        for row in rows:
            rkind = kind
            if kind == "update":
                before = conv(row["before_values"], row["before_none_sources"])
                data = conv(row["after_values"], row["after_none_sources"])
            else:
                before = None
                data = conv(row["values"], row["none_sources"])
            if versioned is not None:
                end, hidden = versioned
                if not is_current(data.get(end)):
                    # a history row: written by an UPDATE (insert) or a DELETE (the current
                    # row's update to a past row end), removed by DELETE HISTORY (delete)
                    if before is None or not is_current(before.get(end)):
                        continue
                    rkind, data, before = "delete", before, None
                for c in hidden:
                    data.pop(c, None)
                    if before is not None:
                        before.pop(c, None)
            old = None if before is None else {
                k: v for k, v in before.items() if data.get(k) != v or type(data.get(k)) is not type(v)}
            head = f'{prefix}"{rkind}"'
            tail = (f',"position":"{pos}","primary_key":{enc([data.get(c) for c in pk_cols])}'
                    f',"primary_key_columns":{pk_cols_json},"data":{enc(data)}')
            if old:
                tail += f',"old":{enc(old)}'
            yield ("r" if undoable else "n"), head, tail + "}"

    def ddl(self, event: Any, pos: BinlogPos, sql: str, schema: str,
            wanted: Callable[[Any, Any], bool]) -> Iterator[tuple[str, str]]:
        """``(head, tail)`` per captured table a DDL statement changes (``schema``: the
        statement's default database)."""
        for rec in classify_ddl(sql, schema):
            if not wanted(rec["database"], rec["table"]):
                continue
            self.schema.clear()
            head = (f'{{"database":{enc(rec["database"])},"table":{enc(rec["table"])},'
                    f'"type":"{rec["type"]}","ts":{int(event.timestamp)}')
            extra = "".join(f',"{k}":{enc(rec[k])}' for k in ("new_database", "new_table")
                            if k in rec)
            tail = f',"position":"{pos}","sql":{json_str(sql)}{extra}}}'
            yield head, tail
