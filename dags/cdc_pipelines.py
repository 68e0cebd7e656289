"""Airflow DAGs of cdc-lake: one per pipeline YAML in $CDC_PIPELINES_DIR (default <repo>/pipelines).

Each DAG spark-submits spark_jobs/cdc_ingest.py and updates the Asset (file:///<table path>) of
each Delta table the run changed, through the pipeline's AssetAlias cdc_lake:<pipeline>, so
downstream DAGs can schedule on them. Broken YAML files are reported
by cdc_pipelines_config_check.py as its import error and never hide the healthy pipelines here.
Built by cdc_lake.airflow.dag_factory; see docs/airflow.md.
"""

import sys
from pathlib import Path

try:
    import cdc_lake  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cdc_lake.airflow.dag_factory import build_dags  # noqa: E402

globals().update(build_dags())
