#!/usr/bin/env bash
# The demo: generate a shop database's Maxwell binlog, run the pipeline with spark-submit,
# land one more day, run again (only the new files are processed), print both summaries,
# then start a local Airflow with the pipeline DAGs (skip with NO_AIRFLOW=1).
# Data goes to ./data (override with CDC_DATA_DIR). Usage: scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export CDC_DATA_DIR=${CDC_DATA_DIR:-$PWD/data}
FORMAT=${DEMO_FORMAT:-maxwell}
PIPELINE=pipelines/shop_${FORMAT}.yaml
LANDING=$CDC_DATA_DIR/landing/shop_${FORMAT}
PY=.venv/bin/python
# The pip-installed spark-submit finds Spark through the venv's Python.
export PATH="$PWD/.venv/bin:$PATH"
export SPARK_HOME=${SPARK_HOME:-$($PY -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')}

if [ -d "$LANDING" ] && [ "${DEMO_RESET:-1}" = 1 ]; then
  echo "[demo] resetting $CDC_DATA_DIR/{landing,lake}/shop_${FORMAT} from an earlier demo"
  rm -rf "$LANDING" "$CDC_DATA_DIR/lake/shop_${FORMAT}"
fi

submit() {
  .venv/bin/spark-submit --master "local[2]" \
    --conf spark.pyspark.python="$PWD/$PY" --conf spark.pyspark.driver.python="$PWD/$PY" \
    --conf spark.sql.session.timeZone=UTC --conf spark.ui.enabled=false \
    --driver-java-options "-Dlog4j.rootLogger=WARN" \
    spark_jobs/cdc_ingest.py --pipeline "$PIPELINE" --run-id "$1" 2> "$CDC_DATA_DIR/demo-$1.log" \
    | grep '^\[cdc\]' || { echo "[demo] run $1 failed; see $CDC_DATA_DIR/demo-$1.log" >&2; tail -30 "$CDC_DATA_DIR/demo-$1.log" >&2; exit 1; }
}

echo "[demo] 1/4 generating 3 days of the shop database's binlog as $FORMAT files"
$PY -m cdc_lake.demo --format "$FORMAT" --out "$LANDING" --days 3 --seed 7
echo "[demo] 2/4 first run (spark-submit, availableNow): everything is new"
submit demo_run_1
echo "[demo] 3/4 landing one more day"
NEXT=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['next_day'])" "$LANDING/.cdc-demo-state.json")
$PY -m cdc_lake.demo --format "$FORMAT" --out "$LANDING" --days 1 --start-day "$NEXT"
echo "[demo] 4/4 second run: only the new files"
submit demo_run_2
echo "[demo] tables: $CDC_DATA_DIR/lake/shop_${FORMAT}; run summaries: $CDC_DATA_DIR/lake/shop_${FORMAT}/_runs/shop_${FORMAT}/"
$PY - "$CDC_DATA_DIR/lake/shop_${FORMAT}" <<'PYEOF'
import sys
from pathlib import Path
from deltalake import DeltaTable
root = Path(sys.argv[1])
for t in sorted(p for p in root.iterdir() if (p / "_delta_log").is_dir()):
    dt = DeltaTable(str(t))
    print(f"[demo]   {t.name:<14} version {dt.version():>3}  rows {dt.to_pyarrow_table().num_rows:>6}")
PYEOF

if [ "${NO_AIRFLOW:-0}" != 1 ]; then
  echo "[demo] starting a local Airflow with the pipeline DAGs (stop it: scripts/airflow_local.sh stop)"
  scripts/airflow_local.sh start
fi
