"""Chaos harness: random CDC workloads, the real job SIGKILLed at random moments, exact checks.

Each *workload* (:mod:`tests.chaos.workload`) is a random binlog history over two small tables
(``kv`` keyed by ``k``, ``pair`` keyed by ``(a, b)``) in one of the three formats (Debezium with
and without the schema wrapper, Maxwell, Canal), with inserts, updates, primary-key changes,
deletes, re-inserts, an ``ALTER TABLE`` (DDL), bad lines (malformed JSON, missing key, a value
that does not cast), files that land late and files re-delivered under another name.

The driver (:mod:`tests.chaos.driver`) runs the real job, ``python spark_jobs/cdc_ingest.py``,
as a subprocess in its own process group and SIGKILLs the whole group (Python driver + JVM):

* at a named point inside ``foreachBatch`` (``CDC_CRASH_AT``: ``batch_start``,
  ``after_side_tables``, ``after_table:<t>`` between table writes, ``before_commit`` between
  the offset log and the commit log);
* *during a Delta commit*: as soon as a new data file appears in a table folder (written,
  not yet committed), or right after a new ``_delta_log`` commit file appears;
* after a random delay from process start (anywhere: JVM start, planning, writing, committing).

After the kills of one landing step a normal run must exit 0, and then every table (SCD1 and
SCD2), the quarantine (exact multiset of (file, line)) and the DDL log (exact multiset of
(file, statement)) must equal the independent reference model (``tests/reference_model.py``).

Run::

    .venv/bin/python -m tests.chaos --kills 50 --seed 7          # prints figures + JSON line
    CDC_SLOW=1 .venv/bin/python -m pytest tests/test_chaos.py -q  # the slow-tier variant
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
for p in (str(TESTS), str(REPO / "src")):
    if p not in sys.path:
        sys.path.insert(0, p)
