"""Binlog capture tools that land change files for the CDC jobs.

``python -m cdc_lake.capture.mariadb_maxwell`` (the CLI) reads a MariaDB/MySQL row binlog with
``mysql-replication`` and lands Maxwell-format JSON lines files (see ``docs/capture.md``):

* :mod:`.reader` -- ``MaxwellCapture``: the binlog event loop, transaction ends, resume;
  :mod:`.events` -- event kinds, GTID flags and transaction markers it tells apart;
* :mod:`.server` -- the server's settings, binary logs and the start position;
* :mod:`.row_lines` -- row and DDL events as Maxwell lines; :mod:`.refusals` -- events the
  capture refuses to land (exit 3) and what the operator does then;
* :mod:`.state` -- settings, binlog positions, the resume state file and its lock, errors;
* :mod:`.landing` -- landing files (hidden while written) and the open transaction's buffer;
* :mod:`.maxwell_json` -- MySQL values as Maxwell JSON; :mod:`.ddl` -- DDL classification.
"""

from __future__ import annotations

__all__ = ["mariadb_maxwell"]
