"""Run parameters of a pipeline DAG, validated twice before anything reaches spark-submit.

1. JSON schema: :func:`build_params` returns Airflow ``Param`` s, so the trigger form renders typed
   fields and the API refuses a bad ``conf`` (HTTP 400) before a run is even created.
2. Python: :func:`validate_run_params` checks the resolved values again inside the task (a run
   can reach the task without the form, and ``conf`` keys the DAG does not declare are not
   schema-checked at all) and is the only way to get the job's CLI arguments.

=========================  ==========================  =====================================
param                      accepted                    job argument
=========================  ==========================  =====================================
``tables``                 list of configured tables   ``--tables a,b`` (empty list: all;
                                                        a subset needs ``full_refresh``)
``max_files_per_trigger``  null or integer 1..100000   ``--max-files-per-trigger N``
``full_refresh``           boolean                     ``--full-refresh`` when true
=========================  ==========================  =====================================

Strict on purpose: ``"10"`` is not an integer, ``"true"`` is not a boolean, a table must be one
the pipeline configures *and* match ``^[A-Za-z_][A-Za-z0-9_]*$``. A table subset is only valid
with ``full_refresh`` (incremental runs share one checkpoint, so they always process every table;
the job refuses a subset otherwise, and this check says so before spark-submit starts).

Example::

    params = build_params(["orders", "customers"])        # -> DAG(params=params)
    run = validate_run_params({"tables": ["orders"], "max_files_per_trigger": 5,
                               "full_refresh": True}, table_names=["orders", "customers"])
    run.to_cli_args()   # ['--tables', 'orders', '--max-files-per-trigger', '5', '--full-refresh']
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowFailException

TABLE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_FILES_PER_TRIGGER_LIMIT = 100_000
PARAM_NAMES = ("tables", "max_files_per_trigger", "full_refresh")


class InvalidRunParam(AirflowFailException):
    """A run parameter is unusable. Fails the task at once: a retry would see the same value."""

    def __init__(self, name: str, value: Any, problem: str) -> None:
        self.name, self.value, self.problem = name, value, problem
        super().__init__(f"Invalid run parameter {name!r}: {value!r} {problem}")


@dataclass(frozen=True)
class RunParams:
    """Validated run parameters; build with :func:`validate_run_params`."""

    tables: tuple[str, ...] = ()
    max_files_per_trigger: int | None = None
    full_refresh: bool = False

    def to_cli_args(self) -> list[str]:
        """Arguments for ``spark_jobs/cdc_ingest.py`` (see docs/contracts.md)."""
        args: list[str] = []
        if self.tables:
            args += ["--tables", ",".join(self.tables)]
        if self.max_files_per_trigger is not None:
            args += ["--max-files-per-trigger", str(self.max_files_per_trigger)]
        if self.full_refresh:
            args.append("--full-refresh")
        return args


def build_params(table_names: Sequence[str]) -> dict[str, Param]:
    """The DAG's ``params``: what the trigger form shows and the API validates.

    Args:
        table_names: the pipeline's configured table names (the only values ``tables`` accepts).
    """
    names = sorted(table_names)
    return {
        "tables": Param(
            [],
            type="array",
            title="Tables",
            description="With full refresh: rebuild only these tables (empty: all tables). "
                        "Incremental runs always process every table.",
            items={"type": "string", "enum": names, "pattern": TABLE_NAME_RE.pattern},
            uniqueItems=True,
            examples=names,  # the trigger form renders `examples` of an array as a multi-select
        ),
        "max_files_per_trigger": Param(
            None,
            type=["null", "integer"],
            title="Max files per micro-batch",
            description="Override source.max_files_per_trigger for this run (empty: config value).",
            minimum=1,
            maximum=MAX_FILES_PER_TRIGGER_LIMIT,
        ),
        "full_refresh": Param(
            False,
            type="boolean",
            title="Full refresh",
            description="Rebuild the selected tables (default all) from every landing file. "
                        "Not in backfills. An enrichment reading a rebuilt table then stops until "
                        "it is run with reprocess.",
        ),
    }


def unknown_conf_message(conf: Mapping[str, Any], allowed: Sequence[str] | set[str], *,
                         dag_id: str | None = None) -> str | None:
    """The error for ``conf`` keys that are not declared params, or None if all are known.

    Example::

        unknown_conf_message({"max_file_per_trigger": 5}, PARAM_NAMES, dag_id="shop")
        # "Unknown run parameter(s) for DAG 'shop': 'max_file_per_trigger'. Valid keys:
        #  full_refresh, max_files_per_trigger, tables"
    """
    unknown = sorted(str(k) for k in conf if k not in allowed)
    if not unknown:
        return None
    where = f" for DAG {dag_id!r}" if dag_id else ""
    valid = (f"Valid keys: {', '.join(sorted(allowed))}" if allowed
             else "This DAG takes no run parameters: trigger it without conf")
    return f"Unknown run parameter(s){where}: {', '.join(repr(k) for k in unknown)}. {valid}"


def run_type_of(dag_run: Any) -> str | None:
    """``"backfill"``, ``"manual"``, ``"scheduled"``, ... of a task context's ``dag_run``."""
    rt = getattr(dag_run, "run_type", None)
    return None if rt is None else str(getattr(rt, "value", rt))


def refuse_in_backfill(name: str, run_type: str | None, what: str) -> None:
    """:class:`InvalidRunParam` when a rebuild parameter comes with a backfill run: each date
    of the backfill would rebuild again (tester, 2026-11-28: every date rebuilt every table and
    made the enrichment stop for a reprocess each time)."""
    if run_type == "backfill":
        raise InvalidRunParam(name, True, f"is refused in a backfill run: every date of the "
                                          f"backfill would {what} again; trigger one manual run "
                                          f"with {name}=true instead")


def validate_run_params(raw: Mapping[str, Any], *, table_names: Sequence[str],
                        conf: Mapping[str, Any] | None = None,
                        run_type: str | None = None) -> RunParams:
    """Check resolved run parameters again, in Python, and return them typed.

    Args:
        raw: ``context["params"]`` (DAG params merged with the run's ``conf``).
        table_names: the pipeline's configured table names.
        conf: the run's own ``conf`` (``context["dag_run"].conf``), checked for unknown keys
            too: with ``[core] dag_run_conf_overrides_params = False`` Airflow does not merge it
            into ``params``, and a typo must never run with the defaults.
        run_type: the run's type (:func:`run_type_of`): ``full_refresh`` is refused in a
            backfill.

    Raises:
        InvalidRunParam: an unknown key, a wrong type, an out-of-range number or a table that is
            not configured; the message names the parameter and shows the value.
    """
    for source in (raw, conf or {}):
        unknown = sorted(str(k) for k in source if k not in PARAM_NAMES)
        if unknown:
            raise InvalidRunParam(unknown[0], source[unknown[0]],
                                  f"is not a run parameter of this DAG; allowed: "
                                  f"{', '.join(PARAM_NAMES)}")
    run = RunParams(
        tables=_validate_tables(raw.get("tables"), table_names),
        max_files_per_trigger=_validate_max_files(raw.get("max_files_per_trigger")),
        full_refresh=_validate_full_refresh(raw.get("full_refresh", False)),
    )
    if run.full_refresh:
        refuse_in_backfill("full_refresh", run_type, "rebuild the tables (and an enrichment "
                                                     "reading them would need a reprocess)")
    if run.tables and not run.full_refresh and set(run.tables) != set(table_names):
        raise InvalidRunParam("tables", list(run.tables),
                              "selects a subset of tables, which only applies with full_refresh=true "
                              "(incremental runs share one checkpoint and always process every table)")
    return run


def _validate_tables(value: Any, table_names: Sequence[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise InvalidRunParam("tables", value, "must be a list of table names, e.g. [\"orders\"]")
    allowed = set(table_names)
    for name in value:
        if not isinstance(name, str) or not TABLE_NAME_RE.fullmatch(name):
            raise InvalidRunParam("tables", name, f"is not a table name (must match {TABLE_NAME_RE.pattern})")
        if name not in allowed:
            raise InvalidRunParam("tables", name, "is not a configured table of this pipeline; "
                                  f"expected one of: {', '.join(sorted(allowed))}")
    if len(set(value)) != len(value):
        raise InvalidRunParam("tables", value, "lists a table twice")
    return tuple(value)


def _validate_max_files(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON Schema's "integer" (the Param's check) accepts 5.0: so do we
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRunParam("max_files_per_trigger", value, "must be an integer (not a string or float)")
    if not 1 <= value <= MAX_FILES_PER_TRIGGER_LIMIT:
        raise InvalidRunParam("max_files_per_trigger", value,
                              f"must be between 1 and {MAX_FILES_PER_TRIGGER_LIMIT}")
    return value


def _validate_full_refresh(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidRunParam("full_refresh", value, "must be true or false (a JSON boolean)")
    return value
