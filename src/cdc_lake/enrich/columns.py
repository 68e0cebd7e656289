"""The column names an enrichment job adds to its outputs or uses while it works on a batch.

A fact or dimension output column may not use them (compared case-insensitively, as Spark
resolves names); the config loader and the preflight refuse them with the name they collide
with::

    from cdc_lake.enrich.columns import reserved, reserved_fact_column
    reserved("_Fact_Version")          # '_fact_version'
    reserved_fact_column("count")      # None: only the aggregates have a `count` column
    reserved("__d0_hit")               # '__d0_hit' (a join helper of enrich.joins)
"""

from __future__ import annotations

import re

# Columns the job adds to its outputs: no fact or dimension output column may use these names.
# Compared case-insensitively (:func:`reserved`): Spark resolves column names so, and a dimension
# output `_Fact_Version` failed the batch with AMBIGUOUS_REFERENCE.
RESERVED = ("_unknown_members", "_fact_version", "_enriched_batch", "_dim_versions", "_missing",
            "_parked_at", "count", "_group_key",
            # working columns of a batch (normalize, joins, pending, writer): a fact column of
            # one of these names failed the batch (AMBIGUOUS_REFERENCE, a UNION mismatch) or was
            # silently left out of the enriched table (`_reason`)
            "_is_delete", "_fate", "_bad", "_tie", "_reason", "_prev_missing", "_origin",
            "_stored_version", "_rn", "__n", "__versions", "__sum", "__corrupt_line",
            "__event_time_kept", "__no_id", "__source_file")
# Events: the file a line came from (Spark's ``_metadata.file_path``), for the quarantine.
SOURCE_FILE = "__source_file"
# Events: the text of a line that is not JSON or holds a value not of its schema type (Spark's
# corrupt-record column), carried to the quarantine.
CORRUPT = "__corrupt_line"
# Output columns only (the aggregates' count / group key): a fact column may be named so.
_AGGREGATE_ONLY = ("count", "_group_key")
_JOIN_HELPER = re.compile(r"^__d\d+_(k_\d+|hit|vf|vt)$")  # enrich.joins, per dimension


def reserved(name: str) -> str | None:
    """The job column ``name`` is (any case), or None."""
    low = name.lower()
    if _JOIN_HELPER.match(low):
        return low
    return next((r for r in RESERVED if r == low), None)


def reserved_fact_column(name: str) -> str | None:
    """The job column a fact column ``name`` would collide with (any case), or None (the
    aggregates' ``count`` / ``_group_key`` are no fact-side columns)."""
    r = reserved(name)
    return None if r in _AGGREGATE_ONLY else r


def reserved_message(name: str) -> str:
    r = reserved(name)
    return (f"{name!r} is reserved for the job's own columns"
            + (f" ({r!r}: column names are case-insensitive, as Spark resolves them)"
               if r != name else "") + f"; reserved: {', '.join(RESERVED)}")
