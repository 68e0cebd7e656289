"""Reports broken cdc-lake pipeline YAML as this file's Airflow DAG import error; defines no DAGs.

Airflow marks every DAG of a file that has an import error as broken, so the healthy pipeline
DAGs live in cdc_pipelines.py and the errors here: each line names the YAML file, the dotted key
and what to change. See cdc_lake.airflow.dag_factory and docs/airflow.md.
"""

import sys
from pathlib import Path

try:
    import cdc_lake  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cdc_lake.airflow.dag_factory import check_pipeline_configs  # noqa: E402

check_pipeline_configs()
