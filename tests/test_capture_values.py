"""Capture of values and transactions a tester's database had, against a real MariaDB.

The oracle is the database itself: what ``SELECT`` shows after the workload (``CAST(... AS
CHAR)`` for TIME, ``HEX`` for bytes, Python's decoding of what the client gets for text) and
which rows exist. Each case was wrong before (tester, 2026-11-27):

* negative TIME with a fraction landed with the fraction's complement (-12:30:00.250 as .750);
* a zero TIMESTAMP landed as 1970-01-01 00:00:00 and YEAR 0000 as 1900; BINARY(4) of zero
  bytes as no bytes;
* text in latin1 with byte 0x81 stopped every later capture run (UnicodeDecodeError, exit 1);
  utf16/utf32 were garbled, ucs2/utf16le/macce landed as base64;
* MariaDB's UUID / INET6 / INET4 landed as base64 of their bytes;
* a charset without a decoder landed base64 text silently (now: exit 2 naming the column); a
  value its decoder refuses stops with exit 3 naming table and position;
* rows undone by ROLLBACK TO SAVEPOINT in a transaction that also changed a MyISAM table
  landed;
* ``--start current`` with nothing new saved no position, so the next run started at "now"
  again and skipped what was written in between; a SIGKILLed capture's in-flight file stayed.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from mariadb_server import MariaDBServer, mariadb_server  # noqa: F401  (fixture)

from cdc_lake.capture import mariadb_maxwell as mm
from cdc_lake.capture.state import CaptureBadValue, CaptureConfigError, CaptureNeedsOperator

pytestmark = [pytest.mark.mariadb,
              pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning")]


def _capture(srv: MariaDBServer, db: str, out: Path, **kw: Any) -> Any:
    user, pw = srv.create_capture_user((db,))
    return mm.capture(mm.CaptureSettings(host=srv.host, port=srv.port, user=user, password=pw,
                                         out_dir=out, until_now=True, databases=(db,), **kw))


def _replay(out: Path) -> dict[str, dict[tuple, dict[str, Any]]]:
    """Final rows per table from the landed Maxwell lines, in file and line order."""
    tables: dict[str, dict[tuple, dict[str, Any]]] = {}
    for f in sorted(out.glob("maxwell-*.json")):
        for line in f.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            if r["type"] not in ("insert", "update", "delete"):
                continue
            rows = tables.setdefault(r["table"], {})
            if r["type"] == "update":
                before = {**r["data"], **r.get("old", {})}
                rows.pop(tuple(before[c] for c in r["primary_key_columns"]), None)
            key = tuple(r["primary_key"])
            if r["type"] == "delete":
                rows.pop(key, None)
            else:
                rows[key] = r["data"]
    return tables


def test_values_land_as_select_shows_them(mariadb_server: MariaDBServer, tmp_path: Path) -> None:  # noqa: F811
    srv = mariadb_server
    srv.execute("CREATE DATABASE vals CHARACTER SET utf8mb4")
    times = ["-12:30:00.250", "-00:00:00.001", "-00:00:00.1", "-01:02:03.4", "-838:59:59.5",
             "-00:00:01.999999", "00:00:00.000001", "12:30:00.250", "-00:00:00.000001"]
    srv.execute(
        "CREATE TABLE v (id INT PRIMARY KEY, t1 TIME(1), t2 TIME(2), t3 TIME(3), t4 TIME(4), "
        "t5 TIME(5), t6 TIME(6), ts TIMESTAMP(3) NULL, y YEAR, b BINARY(4), "
        "l1 VARCHAR(20) CHARACTER SET latin1, u16 VARCHAR(20) CHARACTER SET utf16, "
        "u16le VARCHAR(20) CHARACTER SET utf16le, u32 VARCHAR(20) CHARACTER SET utf32, "
        "ucs VARCHAR(20) CHARACTER SET ucs2, mce VARCHAR(20) CHARACTER SET macce) ENGINE=InnoDB",
        database="vals")
    with srv.connect("vals") as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = '', time_zone = '+00:00'")  # zero dates allowed
        for i, t in enumerate(times):
            text = ["x😀y", "plain ascii", "Ünïcödé €", "ő ű", ""][i % 5]
            cur.execute(
                "INSERT INTO v VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "%s, %s)", (i, *[t] * 6, 0 if i % 2 else "2026-11-27 10:00:00.5",
                            0 if i % 3 == 0 else 1901 + i, b"\x00" * 4 if i % 2 else b"A\x00\x00",
                            None, text, text, text, text.replace("😀", "*"), "ő ű"))
        cur.execute("UPDATE v SET l1 = UNHEX('81E980') WHERE id = 1")  # bytes MariaDB's latin1 has
        cur.execute("SELECT id, CAST(t1 AS CHAR), CAST(t2 AS CHAR), CAST(t3 AS CHAR), "
                    "CAST(t4 AS CHAR), CAST(t5 AS CHAR), CAST(t6 AS CHAR), "
                    "CAST(ts AS CHAR), y + 0, HEX(b), l1, u16, u16le, u32, ucs, mce FROM v")
        names = ["id", "t1", "t2", "t3", "t4", "t5", "t6", "ts", "y", "b", "l1", "u16", "u16le",
                 "u32", "ucs", "mce"]
        truth = {r[0]: dict(zip(names, r)) for r in cur.fetchall()}
        cur.execute("CREATE TABLE n (id INT PRIMARY KEY, u UUID, i6 INET6, i4 INET4)")
        for i, (u, i6, i4) in enumerate([
                ("123e4567-e89b-12d3-a456-426614174000", "::1", "1.2.3.4"),
                ("00000000-0000-0000-0000-000000000000", "::", "0.0.0.0"),
                ("f81d4fae-7dec-41d0-a765-00a0c91e6b00", "::ffff:10.0.0.1", "255.0.0.0"),
                (None, "::1.2.3.4", None), ("12345678-1234-1234-1234-123456789abc",
                                            "2001:db8::ff00:42:8300", "10.0.0.0")]):
            cur.execute("INSERT INTO n VALUES (%s, %s, %s, %s)", (i, u, i6, i4))
        cur.execute("INSERT INTO n SELECT 9, UUID(), NULL, NULL")  # a time-based (v1) id
        cur.execute("SELECT id, CAST(u AS CHAR), CAST(i6 AS CHAR), CAST(i4 AS CHAR) FROM n")
        own = {(r[0],): dict(zip(["id", "u", "i6", "i4"], r)) for r in cur.fetchall()}
    out = tmp_path / "landing"
    _capture(srv, "vals", out)
    assert _replay(out)["n"] == own  # MariaDB's UUID / INET6 / INET4 as the text SELECT shows
    landed = _replay(out)["v"]
    assert set(landed) == {(i,) for i in truth}
    for i, want in truth.items():
        got = landed[(i,)]
        for c in names[1:]:
            w = want[c]
            if c == "ts":  # the zero TIMESTAMP is null (docs/capture.md); others UTC text
                w = None if w == "0000-00-00 00:00:00.000" else w
            if c == "b":
                w = base64.b64encode(bytes.fromhex(w)).decode()
            assert got[c] == w, f"row {i} column {c}: landed {got[c]!r}, SELECT {w!r}"


def test_a_charset_without_decoder_stops_naming_the_column(mariadb_server: MariaDBServer,  # noqa: F811
                                                           tmp_path: Path) -> None:
    srv = mariadb_server
    srv.execute("CREATE DATABASE cs CHARACTER SET utf8mb4")
    srv.execute("CREATE TABLE s (id INT PRIMARY KEY, name VARCHAR(10) CHARACTER SET swe7)",
                "INSERT INTO s VALUES (1, 'plain')", database="cs")
    with pytest.raises(CaptureConfigError) as e:
        _capture(srv, "cs", tmp_path / "landing")
    msg = str(e.value)
    assert "cs.s" in msg and "'name' (CHARACTER SET swe7)" in msg and "--tables" in msg, msg
    assert not list((tmp_path / "landing").glob("maxwell-*.json")), "nothing landed"

    # a value its decoder refuses (eucjpms's NEC extension, decoded as euc_jp): exit 3 naming
    # the table and position, not a bare UnicodeDecodeError (exit 1, retried for nothing)
    srv.execute("CREATE DATABASE cs2 CHARACTER SET utf8mb4")
    srv.execute("CREATE TABLE j (id INT PRIMARY KEY, name VARCHAR(10) CHARACTER SET eucjpms)",
                "INSERT INTO j VALUES (1, '①')", database="cs2")
    with pytest.raises(CaptureBadValue) as bad:
        _capture(srv, "cs2", tmp_path / "landing2")
    assert bad.value.exit_code == 3 and "cs2.j" in str(bad.value), bad.value
    assert "binlog position mariadb-bin." in str(bad.value), bad.value


def test_a_column_whose_type_changed_before_the_capture_read_its_rows(
        mariadb_server: MariaDBServer, tmp_path: Path) -> None:  # noqa: F811
    """The binlog holds a row as the column was when it was written; today's schema may differ.
    Text written before ``ALTER ... MODIFY u UUID`` lands as that text (the UUID converter
    crashed on it: exit 1, retried forever); bytes written before ``MODIFY u CHAR(36)`` stop the
    capture with exit 3 naming the columns (they landed as base64, exit 0)."""
    srv = mariadb_server
    srv.execute("CREATE DATABASE to_uuid CHARACTER SET utf8mb4")
    srv.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, u CHAR(36), ip VARCHAR(40), b BINARY(16))",
        "INSERT INTO t VALUES (1, '123e4567-e89b-12d3-a456-426614174000', '::1', "
        "x'323e4567e89b12d3a456426614174000')",
        "ALTER TABLE t MODIFY u UUID, MODIFY ip INET6, MODIFY b UUID",
        "INSERT INTO t VALUES (2, '223e4567-e89b-12d3-a456-426614174000', '2001:db8::2', "
        "'423e4567-e89b-12d3-a456-426614174000')", database="to_uuid")
    _capture(srv, "to_uuid", tmp_path / "landing")
    with srv.connect("to_uuid") as conn, conn.cursor() as cur:
        cur.execute("SELECT id, CAST(u AS CHAR), CAST(ip AS CHAR), CAST(b AS CHAR) FROM t")
        now = {(r[0],): dict(zip(["id", "u", "ip", "b"], r)) for r in cur.fetchall()}
    # row 1 as it was written (the ALTER logged no row): the same text SELECT shows; BINARY(16)
    # bytes are a UUID's bytes, shown as the UUID today; row 2 as SELECT shows it
    assert _replay(tmp_path / "landing")["t"] == now

    srv.execute("CREATE DATABASE to_text CHARACTER SET utf8mb4")
    srv.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, u UUID, i4 INET4, n VARCHAR(5))",
        "INSERT INTO t VALUES (1, '123e4567-e89b-12d3-a456-426614174000', '10.0.0.1', 'a')",
        "ALTER TABLE t MODIFY u CHAR(36), MODIFY i4 VARCHAR(15)",
        "INSERT INTO t VALUES (2, 'plain text', '1.1.1.1', 'b')", database="to_text")
    with pytest.raises(CaptureNeedsOperator) as e:
        _capture(srv, "to_text", tmp_path / "landing2")
    msg = str(e.value)
    assert e.value.exit_code == 3 and "to_text.t" in msg and "binlog position mariadb-bin." in msg, msg
    assert "'u' (now CHAR (CHARACTER SET utf8mb4), written as bytes)" in msg, msg
    assert "'i4' (now VARCHAR" in msg and "'n'" not in msg and "snapshot" in msg, msg
    assert "to_text" not in _replay(tmp_path / "landing2"), "nothing of the table landed"


def test_rollback_to_savepoint_and_rollback_with_a_myisam_table(mariadb_server: MariaDBServer,  # noqa: F811
                                                                tmp_path: Path) -> None:
    srv = mariadb_server
    srv.execute("CREATE DATABASE sp CHARACTER SET utf8mb4")
    srv.execute("CREATE TABLE inno (id INT PRIMARY KEY, v VARCHAR(10)) ENGINE=InnoDB",
                "CREATE TABLE mya (id INT PRIMARY KEY, v VARCHAR(10)) ENGINE=MyISAM",
                "INSERT INTO inno VALUES (1, 'kept')", database="sp")
    with srv.connect("sp", autocommit=False) as conn, conn.cursor() as cur:
        for sql in ["BEGIN", "INSERT INTO inno VALUES (4, 'a')", "INSERT INTO mya VALUES (2, 'a')",
                    "SAVEPOINT sp1", "UPDATE inno SET v = 'undone' WHERE id = 1",
                    "INSERT INTO inno VALUES (5, 'undone')", "INSERT INTO mya VALUES (3, 'stays')",
                    "SAVEPOINT `sp 2`", "DELETE FROM inno WHERE id = 4",
                    "ROLLBACK TO SAVEPOINT `sp 2`", "ROLLBACK TO sp1",
                    "INSERT INTO inno VALUES (6, 'b')", "COMMIT",
                    "BEGIN", "INSERT INTO inno VALUES (7, 'undone')",
                    "INSERT INTO mya VALUES (8, 'stays')", "ROLLBACK"]:
            cur.execute(sql)
        conn.commit()
    truth = {}
    with srv.connect("sp") as conn, conn.cursor() as cur:
        for t in ("inno", "mya"):
            cur.execute(f"SELECT id, v FROM {t}")
            truth[t] = {(r[0],): r[1] for r in cur.fetchall()}
    assert truth["inno"] == {(1,): "kept", (4,): "a", (6,): "b"}, truth  # the database's rules
    out = tmp_path / "landing"
    _capture(srv, "sp", out)
    landed = _replay(out)
    assert {t: {k: r["v"] for k, r in rows.items()} for t, rows in landed.items()} == truth


def test_start_current_with_nothing_new_records_where_it_stood(mariadb_server: MariaDBServer,  # noqa: F811
                                                               tmp_path: Path) -> None:
    srv = mariadb_server
    srv.execute("CREATE DATABASE cur CHARACTER SET utf8mb4")
    srv.execute("CREATE TABLE c (id INT PRIMARY KEY)", database="cur")
    out = tmp_path / "landing"
    first = _capture(srv, "cur", out, start="current")
    assert first.files == [] and (out / ".maxwell-capture-state.json").is_file()
    srv.execute("INSERT INTO c VALUES (6000)", database="cur")
    (out / ".maxwell-inflight-k1ll3d.json.tmp").write_text("")  # left by a SIGKILLed capture
    _capture(srv, "cur", out, start="current")  # the Airflow task passes --start every run
    assert _replay(out).get("c") == {(6000,): {"id": 6000}}
    assert not list(out.glob(".*.tmp")), "the next run removes a killed capture's in-flight file"


def test_system_versioned_tables_land_their_current_rows(mariadb_server: MariaDBServer,  # noqa: F811
                                                         tmp_path: Path) -> None:
    """Tester: the key was ``[id, row_end]``, so history rows landed, a deleted row stayed and
    the invisible ``row_start``/``row_end`` columns were in the lake. MariaDB logs an UPDATE as
    an update of the current row plus an insert of a history row, a DELETE as an update of the
    row end."""
    srv = mariadb_server
    srv.execute("CREATE DATABASE ver CHARACTER SET utf8mb4")
    srv.execute(
        "CREATE TABLE sv (id INT PRIMARY KEY, v VARCHAR(10)) WITH SYSTEM VERSIONING",
        "CREATE TABLE se (id INT PRIMARY KEY, v VARCHAR(10), s TIMESTAMP(6) GENERATED ALWAYS AS "
        "ROW START, e TIMESTAMP(6) GENERATED ALWAYS AS ROW END, PERIOD FOR SYSTEM_TIME(s, e)) "
        "WITH SYSTEM VERSIONING",
        *[sql for t in ("sv", "se") for sql in (
            f"INSERT INTO {t} (id, v) VALUES (1, 'a'), (2, 'b'), (3, 'c')",
            f"UPDATE {t} SET v = 'a2' WHERE id = 1", f"UPDATE {t} SET v = 'a3' WHERE id = 1",
            f"DELETE FROM {t} WHERE id = 2", f"INSERT INTO {t} (id, v) VALUES (2, 'b again')",
            f"UPDATE {t} SET id = 4 WHERE id = 3", f"DELETE HISTORY FROM {t}")],
        database="ver")
    truth = {}
    with srv.connect("ver") as conn, conn.cursor() as cur:
        for t in ("sv", "se"):
            cur.execute(f"SELECT id, v FROM {t}")
            truth[t] = {(r[0],): r[1] for r in cur.fetchall()}
    assert truth["sv"] == {(1,): "a3", (2,): "b again", (4,): "c"}, truth
    out = tmp_path / "landing"
    _capture(srv, "ver", out)
    landed = _replay(out)
    assert {t: {k: r["v"] for k, r in rows.items()} for t, rows in landed.items()} == truth
    assert {c for r in landed["sv"].values() for c in r} == {"id", "v"}  # SELECT * shows these
    assert {c for r in landed["se"].values() for c in r} == {"id", "v", "s", "e"}
    keys = {json.loads(line)["table"]: json.loads(line)["primary_key_columns"]
            for f in out.glob("maxwell-*.json") for line in f.read_text().splitlines()
            if '"primary_key_columns"' in line}
    assert keys == {"sv": ["id"], "se": ["id"]}, keys
