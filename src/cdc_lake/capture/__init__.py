"""Binlog capture tools that land change files for the CDC jobs.

:mod:`cdc_lake.capture.mariadb_maxwell` reads a MariaDB/MySQL row binlog with
``mysql-replication`` and lands Maxwell-format JSON lines files (see ``docs/capture.md``).
"""

from __future__ import annotations

__all__ = ["mariadb_maxwell"]
