"""Format parsers: raw landing lines -> normalized change events (see :mod:`cdc_lake.cdc.events`).

Each parser is pure Spark SQL (no Python UDFs): it takes a DataFrame with ``_file`` and
``_line`` and returns the columns of :data:`cdc_lake.cdc.events.COLUMNS`.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame

from cdc_lake.cdc.formats import canal, debezium, maxwell

PARSERS: dict[str, Callable[[DataFrame], DataFrame]] = {
    "debezium": debezium.parse,
    "maxwell": maxwell.parse,
    "canal": canal.parse,
}


def parser_for(fmt: str) -> Callable[[DataFrame], DataFrame]:
    try:
        return PARSERS[fmt]
    except KeyError:
        raise ValueError(f"unknown source format {fmt!r}; expected one of {sorted(PARSERS)}") from None
