"""Capture a MariaDB/MySQL row binlog into Maxwell-format JSON lines files.

A small, single-process stand-in for Maxwell's Daemon: it reads the binlog with
``mysql-replication`` (``pymysqlreplication``) and lands one JSON document per row change::

    {"database":"shop","table":"orders","type":"update","ts":1795263365,"xid":16,"xoffset":0,
     "position":"mariadb-bin.000001:2005","primary_key":[3],"primary_key_columns":["id"],
     "data":{"id":3,"status":"paid","amount":19.90},"old":{"status":"new"}}

and one per DDL statement (``table-create``, ``table-alter``, ``table-drop``, ``table-truncate``,
``database-create``/``-alter``/``-drop``) with the statement in ``sql``.

Guarantees (see ``docs/capture.md``):

* Resume position is saved only at transaction ends (Xid, ``COMMIT`` query, standalone DDL) and
  only *after* the landing file holding everything up to it was renamed into place; resuming
  uses ``resume_stream=True`` with ``is_mariadb=False`` (field notes). A crash can therefore
  re-land a transaction (identical lines, same ``position``/``xoffset``) but never loses one.
* Files are written as hidden ``.*.tmp`` files and renamed when complete; a file always ends at
  a transaction boundary; names sort lexically in capture order:
  ``<prefix>-<start binlog index>-<start pos>-<end binlog index>-<end pos>.json``.

CLI::

    python -m cdc_lake.capture.mariadb_maxwell --host 127.0.0.1 --port 3306 --user cdc \\
        --password-env CDC_CAPTURE_PASSWORD --out data/landing/shop [--state FILE] [--until-now]

Exit codes: 0 success, 2 bad arguments or unsuitable server settings, 3 an operator has to act
(a binlog event that cannot be landed correctly, a purged/reset binlog, a saved position that is
not an event; the message names file:position and the recovery), 75 another capture holds the
state lock, 1 anything else (transient: retried). On success one ``CAPTURE_SUMMARY {json}`` line goes to stdout.
"""

import argparse
import json
import logging
import os
import re
import signal
import sys
from pathlib import Path

from cdc_lake.capture.ddl import classify_ddl
from cdc_lake.capture.reader import CaptureResult, MaxwellCapture, capture
from cdc_lake.capture.state import (EXIT_CONFIG, EXIT_FAIL, EXIT_LOCKED, EXIT_OK, BinlogPos,
                                    CaptureConfigError, CaptureError, CaptureLocked,
                                    CaptureSettings, StateStore)

__all__ = ["BinlogPos", "CaptureConfigError", "CaptureError", "CaptureLocked", "CaptureResult",
           "CaptureSettings", "EXIT_CONFIG", "EXIT_FAIL", "EXIT_LOCKED", "EXIT_OK",
           "MaxwellCapture", "StateStore", "build_parser", "capture", "classify_ddl", "main"]

log = logging.getLogger("cdc_lake.capture")

# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def _names(text: str | None) -> tuple[str, ...]:
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cdc_lake.capture.mariadb_maxwell",
        description="Land a MariaDB/MySQL row binlog as Maxwell JSON lines files.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=3306)
    p.add_argument("--user", required=True)
    p.add_argument("--password", default=None,
                   help="prefer --password-env; default: $CDC_CAPTURE_PASSWORD, then $MYSQL_PWD")
    p.add_argument("--password-env", default=None, metavar="VAR",
                   help="read the password from this environment variable")
    p.add_argument("--out", required=True, type=Path, help="landing folder")
    p.add_argument("--state", type=Path, default=None,
                   help="resume state file (default: <out>/.<prefix>-capture-state.json)")
    p.add_argument("--until-now", action="store_true",
                   help="stop when caught up with the binlog (default: follow until SIGTERM)")
    p.add_argument("--server-id", type=int, default=None,
                   help="replica server id to announce (default: derived from --out)")
    p.add_argument("--databases", default=None, help="comma-separated schemas to capture")
    p.add_argument("--tables", default=None, help="comma-separated tables ('t' or 'db.t')")
    p.add_argument("--start", default="earliest",
                   help="where to begin when there is no state: earliest, current or FILE:POS")
    p.add_argument("--max-file-rows", type=int, default=100_000)
    p.add_argument("--max-file-bytes", type=int, default=64 * 1024 * 1024)
    p.add_argument("--flush-interval", type=float, default=5.0,
                   help="follow mode: land an open file after this many seconds")
    p.add_argument("--prefix", default="maxwell", help="landing file name prefix")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.password_env:
        if args.password_env not in os.environ:
            print(f"error: --password-env: environment variable {args.password_env} is not set",
                  file=sys.stderr)
            return EXIT_CONFIG
        password = os.environ[args.password_env]
    elif args.password is not None:
        password = args.password
    else:
        password = os.environ.get("CDC_CAPTURE_PASSWORD", os.environ.get("MYSQL_PWD", ""))
    if not re.match(r"^[A-Za-z0-9_.-]+$", args.prefix):
        print(f"error: --prefix {args.prefix!r}: use letters, digits, '_', '.', '-'",
              file=sys.stderr)
        return EXIT_CONFIG
    if args.max_file_rows < 1 or args.max_file_bytes < 1 or args.flush_interval <= 0:
        print("error: --max-file-rows, --max-file-bytes and --flush-interval must be positive",
              file=sys.stderr)
        return EXIT_CONFIG
    settings = CaptureSettings(
        host=args.host, port=args.port, user=args.user, password=password,
        out_dir=args.out.expanduser().resolve(),
        state_path=args.state.expanduser().resolve() if args.state else None,
        until_now=args.until_now, server_id=args.server_id,
        databases=_names(args.databases), tables=_names(args.tables), start=args.start,
        max_file_rows=args.max_file_rows, max_file_bytes=args.max_file_bytes,
        flush_interval_s=args.flush_interval, prefix=args.prefix)
    cap = MaxwellCapture(settings)
    signal.signal(signal.SIGTERM, cap.request_stop)
    signal.signal(signal.SIGINT, cap.request_stop)
    try:
        result = cap.run()
    except CaptureError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - CLI boundary
        import pymysql

        if isinstance(e, pymysql.err.MySQLError):
            print(f"error: {settings.host}:{settings.port}: {e}", file=sys.stderr)
        else:
            log.exception("capture failed")
        return EXIT_FAIL
    print("CAPTURE_SUMMARY " + json.dumps(result.to_json(), sort_keys=True), flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
