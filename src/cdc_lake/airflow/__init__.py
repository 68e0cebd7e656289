"""Airflow side of cdc-lake: one DAG per pipeline YAML, each submitting ``spark_jobs/cdc_ingest.py``.

Modules, one concept each:

* :mod:`~cdc_lake.airflow.dag_factory` – pipeline YAML -> DAG (schedule, Assets, doc_md, params);
  also turns broken YAML into a DAG import error of its own.
* :mod:`~cdc_lake.airflow.params` – the run parameters: JSON-schema ``Param`` s for the trigger
  form and the second, Python-level validation that builds the job's CLI arguments.
* :mod:`~cdc_lake.airflow.operator` – ``CdcSparkSubmitOperator``: spark-submit, exit codes, run
  summary -> XCom (:mod:`~cdc_lake.airflow.enrich_operator`: the enrichment and dimension kinds).
* :mod:`~cdc_lake.airflow.submit` – a pipeline's spark-submit ``--conf``/jars and what the job's
  output says (lock holder, errors), for every kind's operator.
* :mod:`~cdc_lake.airflow.assets` – the Assets a run announces (one per table, events through the
  pipeline's alias with the run's metrics) and the run summary block for the task log.
* :mod:`~cdc_lake.airflow.hook` – ``CdcSparkSubmitHook``: the provider's hook, defaulting the master
  to ``local[*]`` when the Spark connection is not defined.

Nothing in this package imports pyspark: DAG parsing must stay fast and never start a JVM.
This ``__init__`` imports nothing from Airflow either, so light readers (the plugin view) can use
:func:`pipelines_dir` without paying for it.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
PIPELINES_DIR_ENV = "CDC_PIPELINES_DIR"


def pipelines_dir() -> Path:
    """Folder of pipeline YAML files: ``$CDC_PIPELINES_DIR``, else ``<repo>/pipelines``."""
    env = os.environ.get(PIPELINES_DIR_ENV, "").strip()
    return Path(env).expanduser() if env else REPO_ROOT / "pipelines"
