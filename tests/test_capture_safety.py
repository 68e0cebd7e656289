"""Binlog events the capture must refuse (exit 3) instead of landing wrong rows, against a real
private MariaDB (tester, adversarial review of the capture). Truth is the database (``SELECT``)
and the landed lines, never the capture's own code:

* rows logged with ``binlog_row_image`` MINIMAL / NOBLOB (session overrides) landed NULL for the
  columns the image leaves out; DML logged as a statement (``binlog_format`` STATEMENT) was
  dropped; both with exit 0;
* a binlog file written with ``binlog_checksum=NONE`` read while the server uses CRC32 (and
  back) was misparsed: truncated rotate names (``mariadb-bin.00``) saved in the state file;
* ``RESET MASTER`` was not noticed: the saved position was a boundary in the new binlog, so
  changes were skipped;
* XA, a purged position and a position that is not an event boundary exited 1 (retried
  forever); a SIGKILLed state save left its tmp file; landing files were mode 0600.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from mariadb_server import MariaDBServer, mariadb_server, start_server  # noqa: F401  (fixture)

from cdc_lake.capture import mariadb_maxwell as mm
from cdc_lake.capture.state import CaptureNeedsOperator, EXIT_NEEDS_OPERATOR

pytestmark = [pytest.mark.mariadb,
              pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning")]


def _settings(srv: MariaDBServer, db: str, out: Path, **kw: Any) -> Any:
    user, pw = srv.create_capture_user((db,))
    return mm.CaptureSettings(host=srv.host, port=srv.port, user=user, password=pw, out_dir=out,
                              until_now=True, databases=(db,), **kw)


def _capture(srv: MariaDBServer, db: str, out: Path, **kw: Any) -> Any:
    return mm.capture(_settings(srv, db, out, **kw))


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(out.glob("maxwell-*.json"))
            for line in f.read_text(encoding="utf-8").splitlines()]


def _replay(out: Path) -> dict[str, dict[tuple, dict[str, Any]]]:
    tables: dict[str, dict[tuple, dict[str, Any]]] = {}
    for r in _lines(out):
        if r["type"] not in ("insert", "update", "delete"):
            continue
        rows = tables.setdefault(r["table"], {})
        if r["type"] == "update":
            before = {**r["data"], **r.get("old", {})}
            rows.pop(tuple(before[c] for c in r["primary_key_columns"]), None)
        if r["type"] == "delete":
            rows.pop(tuple(r["primary_key"]), None)
        else:
            rows[tuple(r["primary_key"])] = r["data"]
    return tables


def _pos_key(p: str) -> tuple[int, int]:
    f, n = p.rsplit(":", 1)
    return int(f.rsplit(".", 1)[1]), int(n)


def _state(out: Path) -> dict[str, Any]:
    return json.loads((out / ".maxwell-capture-state.json").read_text())


def _refused(settings: Any) -> str:
    with pytest.raises(CaptureNeedsOperator) as e:
        mm.capture(settings)
    assert e.value.exit_code == EXIT_NEEDS_OPERATOR == 3
    return str(e.value)


@pytest.mark.parametrize("setting, words", [
    ("binlog_row_image=MINIMAL", ["binlog_row_image", "not FULL"]),
    ("binlog_row_image=NOBLOB", ["binlog_row_image", "not FULL"]),
    ("binlog_format=STATEMENT", ["logged as a statement", "binlog_format"]),
    ("binlog_format=MIXED", ["logged as a statement", "binlog_format"]),
])
def test_rows_not_logged_as_full_row_images_are_refused(mariadb_server: MariaDBServer,  # noqa: F811
                                                         tmp_path: Path, setting: str,
                                                         words: list[str]) -> None:
    srv = mariadb_server
    db = "img_" + setting.split("=")[1].lower()
    srv.execute(f"CREATE DATABASE {db} CHARACTER SET utf8mb4")
    srv.execute("CREATE TABLE t (id INT PRIMARY KEY, a INT, b BLOB, c VARCHAR(10))",
                "INSERT INTO t VALUES (1, 1, 'blob one', 'c1'), (2, 2, 'blob two', 'c2')",
                database=db)
    with srv.connect(db) as conn, conn.cursor() as cur:
        cur.execute(f"SET SESSION {setting}")
        cur.execute("UPDATE t SET a = 10 WHERE id = 1")
        cur.execute("INSERT INTO t (id, a) VALUES (3, 3)")
        cur.execute("SET SESSION binlog_format=ROW, binlog_row_image=FULL")
        cur.execute("INSERT INTO t VALUES (4, 4, 'later', 'c4')")
        cur.execute("SELECT id, a, b, c FROM t")
        truth = {(r[0],): r for r in cur.fetchall()}
    assert truth[(1,)][1] == 10 and truth[(1,)][2] == b"blob one"  # the database's own rows
    out = tmp_path / "landing"
    msg = _refused(_settings(srv, db, out))
    assert f"{db}.t" in msg and "binlog position mariadb-bin." in msg, msg
    assert all(w in msg for w in words) and "snapshot" in msg, msg
    # what was landed before the refused event stays; nothing of it or after it landed
    landed = _replay(out).get("t", {})
    assert landed == {(1,): {"id": 1, "a": 1, "b": "YmxvYiBvbmU=", "c": "c1"},
                      (2,): {"id": 2, "a": 2, "b": "YmxvYiB0d28=", "c": "c2"}}, landed
    assert landed[(1,)]["a"] != truth[(1,)][1]  # the lake is behind, never wrong
    saved = _state(out)
    refused_at = msg.split("binlog position ")[1].split(" ")[0]
    assert _pos_key(f"{saved['log_file']}:{saved['log_pos']}") < _pos_key(refused_at)
    n = len(_lines(out))
    assert _refused(_settings(srv, db, out)) == msg  # every run stops at the same event
    assert len(_lines(out)) == n


def test_xa_purged_and_bad_positions_exit_3(mariadb_server: MariaDBServer,  # noqa: F811
                                            tmp_path: Path) -> None:
    srv = mariadb_server
    srv.execute("CREATE DATABASE xa CHARACTER SET utf8mb4")
    srv.execute("CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE other (id INT PRIMARY KEY)",
                "INSERT INTO t VALUES (1)", database="xa")
    srv.execute("XA START 'x1'", "INSERT INTO xa.t VALUES (2)", "XA END 'x1'",
                "XA PREPARE 'x1'", "XA COMMIT 'x1'")
    out = tmp_path / "xa"
    msg = _refused(_settings(srv, "xa", out))
    assert "XA transaction" in msg and "xa.t" in msg and "mariadb-bin." in msg, msg
    assert _replay(out)["t"] == {(1,): {"id": 1}}  # landed before the XA transaction
    # an XA transaction of a table not captured changes nothing for this capture
    out2 = tmp_path / "xa_other"
    _capture(srv, "xa", out2, tables=("other",))
    assert _replay(out2) == {}

    # a saved position inside an event / beyond the file's end: exit 3 naming it
    srv.execute("CREATE DATABASE pos CHARACTER SET utf8mb4")
    srv.execute("CREATE TABLE p (id INT PRIMARY KEY)", "INSERT INTO p VALUES (1)", database="pos")
    out3 = tmp_path / "pos"
    _capture(srv, "pos", out3)
    st = _state(out3)
    for bad in (st["log_pos"] + 7, st["log_pos"] + 10_000_000):
        (out3 / ".maxwell-capture-state.json").write_text(json.dumps({**st, "log_pos": bad}))
        msg = _refused(_settings(srv, "pos", out3))
        assert f"{st['log_file']}:{bad}" in msg and "not the start of an event" in msg, msg

    # a purged saved position: exit 3 (was 1, retried forever)
    with srv.connect() as conn, conn.cursor() as cur:
        for _ in range(50):  # the binlog checkpoint must move on before a file can go
            cur.execute("FLUSH BINARY LOGS")
            cur.execute("SHOW MASTER STATUS")
            cur.execute(f"PURGE BINARY LOGS TO '{cur.fetchone()[0]}'")
            cur.execute("SHOW BINARY LOGS")
            if st["log_file"] not in {r[0] for r in cur.fetchall()}:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"could not purge {st['log_file']}")
    (out3 / ".maxwell-capture-state.json").write_text(json.dumps(st))
    msg = _refused(_settings(srv, "pos", out3))
    assert f"{st['log_file']}:{st['log_pos']}" in msg and "purged" in msg, msg
    # the CLI exits 3 (Airflow does not retry)
    user, pw = srv.create_capture_user(("pos",))
    os.environ["CDC_TEST_CAPTURE_PW"] = pw
    rc = mm.main(["--host", srv.host, "--port", str(srv.port), "--user", user,
                  "--password-env", "CDC_TEST_CAPTURE_PW", "--out", str(out3), "--databases",
                  "pos", "--until-now"])
    assert rc == 3


def test_killed_state_saves_are_cleaned_and_files_are_readable(mariadb_server: MariaDBServer,  # noqa: F811
                                                               tmp_path: Path) -> None:
    srv = mariadb_server
    srv.execute("CREATE DATABASE km CHARACTER SET utf8mb4")
    srv.execute("CREATE TABLE k (id INT PRIMARY KEY)", "INSERT INTO k VALUES (1)", database="km")
    out = tmp_path / "landing"
    out.mkdir()
    stale = out / "..maxwell-capture-state.json.ab12_xyz.tmp"  # a SIGKILLed save's tmp file
    stale.write_text("{")
    other = out / ".someone-else.json.ab12_xyz.tmp"  # not ours: stays
    other.write_text("")
    _capture(srv, "km", out)
    assert not stale.exists() and other.exists()
    mask = os.umask(0o022)
    os.umask(mask)
    files = list(out.glob("maxwell-*.json"))
    assert files and all((f.stat().st_mode & 0o777) == (0o644 & ~mask) for f in files)


def test_checksum_changes_and_reset_master(tmp_path: Path) -> None:
    """A server started with binlog_checksum=NONE, switched to CRC32 and back: every file is read
    as written (the replay equals SELECT, every position names a real binlog file). Then RESET
    MASTER: the next run refuses (exit 3) instead of skipping changes."""
    if mm.__name__ and not __import__("mariadb_server").find_binaries():
        pytest.skip("MariaDB server binaries are not installed")
    srv = start_server(("--binlog-checksum=NONE",))
    try:
        srv.execute("CREATE DATABASE ck CHARACTER SET utf8mb4")
        srv.execute("CREATE TABLE c (id INT PRIMARY KEY, v VARCHAR(40))", database="ck")
        n = 0
        for setting in ("NONE", "CRC32", "NONE", "CRC32"):
            srv.execute(f"SET GLOBAL binlog_checksum={setting}")
            for _ in range(3):
                n += 1
                srv.execute(f"INSERT INTO c VALUES ({n}, 'written with {setting}')",
                            f"UPDATE c SET v = CONCAT(v, '!') WHERE id = {n}", database="ck")
        with srv.connect("ck") as conn, conn.cursor() as cur:
            cur.execute("SELECT id, v FROM c")
            truth = {(r[0],): {"id": r[0], "v": r[1]} for r in cur.fetchall()}
            cur.execute("SHOW BINARY LOGS")
            logs = {r[0] for r in cur.fetchall()}
        out = tmp_path / "landing"
        _capture(srv, "ck", out)
        assert _replay(out)["c"] == truth
        assert {r["position"].rsplit(":", 1)[0] for r in _lines(out)} <= logs
        assert _state(out)["log_file"] in logs and _state(out)["binlog_identity"]
        # the server switches back while the capture is down: still read as written
        srv.execute("SET GLOBAL binlog_checksum=NONE", "INSERT INTO c VALUES (100, 'x')",
                    database="ck")
        _capture(srv, "ck", out)
        assert _replay(out)["c"][(100,)] == {"id": 100, "v": "x"}

        # RESET MASTER (same file names, new files): refused, the lake would ignore the changes
        saved = _state(out)
        time.sleep(1.1)  # the identity is the file's creation second
        srv.execute("RESET MASTER")
        for i in range(200, 240):
            srv.execute(f"INSERT INTO c VALUES ({i}, 'after reset')", database="ck")
        msg = _refused(_settings(srv, "ck", out))
        assert "reset" in msg and "--full-refresh" in msg and "NEW landing folder" in msg, msg
        assert _state(out)["log_pos"] == saved["log_pos"]
        assert not any(r.get("data", {}).get("v") == "after reset" for r in _lines(out))
        # the same file name again after a reset, the saved position a valid event boundary in
        # the new file (same statements, same sizes): only the file's identity tells
        out_r = tmp_path / "same_name"
        srv.execute("RESET MASTER", "INSERT INTO c VALUES (300, 'one')", database="ck")
        _capture(srv, "ck", out_r)
        before = _state(out_r)
        assert before["log_file"] == "mariadb-bin.000001"
        time.sleep(1.1)
        srv.execute("DELETE FROM c WHERE id = 300", "RESET MASTER",
                    "INSERT INTO c VALUES (300, 'one')", "INSERT INTO c VALUES (301, 'new')",
                    database="ck")
        msg = _refused(_settings(srv, "ck", out_r))
        assert "mariadb-bin.000001" in msg and "reset" in msg and "--full-refresh" in msg, msg
        assert _state(out_r) == before and not any(
            r.get("data", {}).get("id") == 301 for r in _lines(out_r))
        # a state file of an earlier version (no identity) still works and records it
        old = {k: v for k, v in saved.items() if k != "binlog_identity"}
        out2 = tmp_path / "old_state"
        out2.mkdir()
        (out2 / ".maxwell-capture-state.json").write_text(json.dumps(
            {**old, "log_file": "mariadb-bin.000001", "log_pos": 4}))
        _capture(srv, "ck", out2)
        assert _state(out2).get("binlog_identity")
    finally:
        srv.stop()


def test_load_data_logged_as_a_statement_is_refused(mariadb_server: MariaDBServer,  # noqa: F811
                                                    tmp_path: Path) -> None:
    """LOAD DATA under binlog_format STATEMENT is an Execute_load_query event, not rows: refused
    naming the table (it crashed with AttributeError before: that event has no schema field)."""
    srv = mariadb_server
    db = "load_stmt"
    srv.execute(f"CREATE DATABASE {db} CHARACTER SET utf8mb4")
    srv.execute("CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(10))",
                "INSERT INTO t VALUES (1, 'one')", database=db)
    data = tmp_path / "rows.tsv"
    data.write_text("2\ttwo\n3\tthree\n")
    data.chmod(0o644)
    tmp_path.chmod(0o755)
    with srv.connect(db) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION binlog_format=STATEMENT")
        cur.execute(f"LOAD DATA INFILE '{data}' INTO TABLE t")
        cur.execute("SELECT COUNT(*) FROM t")
        assert cur.fetchone()[0] == 3  # the database has the loaded rows
    out = tmp_path / "landing"
    msg = _refused(_settings(srv, db, out))
    assert f"{db}.t" in msg and "logged as a statement" in msg and "LOAD DATA" in msg, msg
    assert _replay(out).get("t", {}) == {(1,): {"id": 1, "a": "one"}}
