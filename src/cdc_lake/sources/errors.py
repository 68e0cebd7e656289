"""The one error a change-feed reader raises when history cannot be read incrementally.

Kept free of Spark imports: it is raised in the Python process that plans the stream and in
Python workers, and recognised again on the driver from the text of a Spark error.

Example::

    try:
        query.awaitTermination()
    except Exception as exc:
        cfu = ChangeFeedUnavailable.find_in(exc)
        if cfu is not None:
            print(cfu); sys.exit(3)
        raise
"""

from __future__ import annotations

import json
import re

DEFAULT_RECOVERY = "spark_jobs/enrich.py --pipeline <pipeline.yaml> --reprocess"
_TAG = "cdc_lake.change_feed_unavailable"
_TAG_RE = re.compile(r"\[" + re.escape(_TAG) + r" (\{.*?\})\]")


class ChangeFeedUnavailable(RuntimeError):
    """Versions ``from_version..to_version`` of ``table`` cannot be read as a change feed.

    Causes: a rewrite without change data (overwrite/replace, e.g. a CDC full refresh), change
    data or log entries removed (VACUUM, log retention), change data feed not enabled, or a
    table re-created / an offset the table never had. The message names the recovery command.
    """

    def __init__(self, table: str, from_version: int | None, to_version: int | None, reason: str,
                 recovery: str = DEFAULT_RECOVERY) -> None:
        self.table = table
        self.from_version = from_version
        self.to_version = to_version
        self.reason = reason
        self.recovery = recovery
        payload = json.dumps({"table": table, "from_version": from_version,
                              "to_version": to_version, "reason": reason,
                              "recovery": recovery}, sort_keys=True)
        super().__init__(
            f"change feed of Delta table {table} is unavailable for versions "
            f"{_fmt(from_version)}..{_fmt(to_version)}: {reason}. It cannot be read "
            f"incrementally across this; recovery: {recovery}"
            + (" (resets the pipeline's checkpoint and outputs and rebuilds from the table's "
               "current snapshot)" if recovery.endswith("--reprocess") else "")
            + f" [{_TAG} {payload}]")

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (ChangeFeedUnavailable,
                (self.table, self.from_version, self.to_version, self.reason, self.recovery))

    @classmethod
    def find_in(cls, error: BaseException | str | None) -> ChangeFeedUnavailable | None:
        """Rebuild the error from an exception chain or text that carries its message, else None.

        Spark re-raises errors of the Python source as ``StreamingQueryException`` text; this
        finds ours in it (also through ``__cause__``/``__context__``).
        """
        seen: set[int] = set()
        while error is not None and id(error) not in seen:
            if isinstance(error, ChangeFeedUnavailable):
                return error
            seen.add(id(error))
            m = _TAG_RE.search(str(error) if not isinstance(error, str) else error)
            if m:
                try:
                    d = json.loads(m.group(1))
                    return cls(d["table"], d["from_version"], d["to_version"], d["reason"],
                               d.get("recovery", DEFAULT_RECOVERY))
                except (ValueError, KeyError):
                    return None
            if isinstance(error, str):
                return None
            error = error.__cause__ or error.__context__
        return None


def _fmt(v: int | None) -> str:
    return "?" if v is None else str(v)
