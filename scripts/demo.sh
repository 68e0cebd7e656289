#!/usr/bin/env bash
# The demo: generate a shop database's Maxwell binlog, run the pipeline with spark-submit,
# land one more day, run again (only the new files are processed), print both summaries;
# then (maxwell; skip with NO_ENRICH=1) refresh a category dimension from daily CSV exports and
# run the enrichment pipeline twice: one fact parked then released, a dimension change picked up;
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

# The driver JVM options the operator would pass for a small run (C1-only JIT, the JVM class
# archive make setup built: cdc_lake.launch.launch_conf, cdc_lake.jvm_archive).
JVM_OPTS=$($PY -c 'from cdc_lake.launch import launch_conf, DRIVER_JAVA_OPTIONS as K; from cdc_lake.jvm_archive import option; print(launch_conf(None, archive=option())[K])')

# spark-submit a job: job_submit <run id> <output prefix to show> <script> <args...>
job_submit() {
  local run=$1 prefix=$2 script=$3; shift 3
  .venv/bin/spark-submit --master "local[2]" --conf "spark.driver.defaultJavaOptions=$JVM_OPTS" \
    --conf spark.pyspark.python="$PWD/$PY" --conf spark.pyspark.driver.python="$PWD/$PY" \
    --conf spark.sql.session.timeZone=UTC --conf spark.ui.enabled=false \
    --driver-java-options "-Dlog4j.rootLogger=WARN" \
    "$script" "$@" --run-id "$run" 2> "$CDC_DATA_DIR/demo-$run.log" | tee "$CDC_DATA_DIR/demo-$run.out" \
    | grep "^\[$prefix\]" || { echo "[demo] run $run failed; see $CDC_DATA_DIR/demo-$run.log" >&2; tail -30 "$CDC_DATA_DIR/demo-$run.log" >&2; exit 1; }
}
submit() { job_submit "$1" cdc spark_jobs/cdc_ingest.py --pipeline "$PIPELINE"; }

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
    # single-threaded scan: deltalake's threaded to_pyarrow_table can abort the process at exit
    rows = dt.to_pyarrow_dataset().to_table(use_threads=False).num_rows
    print(f"[demo]   {t.name:<14} version {dt.version():>3}  rows {rows:>6}")
PYEOF

if [ "$FORMAT" = maxwell ] && [ "${NO_ENRICH:-0}" != 1 ]; then
  # Enrichment: order lines ⨝ orders ⨝ products ⨝ categories ⨝ customers (as of the order time)
  # + revenue per category per day. Categories come from a daily CSV export (dimension refresh).
  DIM=pipelines/product_categories.yaml ENRICH=pipelines/shop_order_lines.yaml
  SNAPS=$CDC_DATA_DIR/snapshots/product_categories LAKE=$CDC_DATA_DIR/lake/shop_maxwell
  rm -rf "$SNAPS" "$CDC_DATA_DIR/lake/dims" "$CDC_DATA_DIR/lake/gold"; mkdir -p "$SNAPS"
  echo "[demo] 5/8 category export of 2026-01-01 (one product held back: its order lines must wait) + dimension refresh"
  $PY -m cdc_lake.demo.categories --products "$LAKE/products" --order-items "$LAKE/order_items" \
    --out "$SNAPS" --start 2026-01-01 --days 1 --day-index 0 > "$SNAPS.plan.json"
  job_submit demo_dim_1 dimension spark_jobs/dimension_refresh.py --pipeline "$DIM" --date 2026-01-01
  echo "[demo] 6/8 enrichment run 1 (spark-submit, availableNow, change feed of order_items)"
  job_submit demo_enrich_1 enrich spark_jobs/enrich.py --pipeline "$ENRICH"
  $PY -m cdc_lake.demo.enrich_report --pipeline "$ENRICH" --plan "$SNAPS.plan.json" --step 1
  echo "[demo] 7/8 category export of 2026-01-02 (held-back product arrives, one category changes) + refresh; one more shop day"
  $PY -m cdc_lake.demo.categories --products "$LAKE/products" --order-items "$LAKE/order_items" \
    --out "$SNAPS" --start 2026-01-02 --days 1 --day-index 1 > /dev/null
  job_submit demo_dim_2 dimension spark_jobs/dimension_refresh.py --pipeline "$DIM" --date 2026-01-02
  NEXT=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['next_day'])" "$LANDING/.cdc-demo-state.json")
  $PY -m cdc_lake.demo --format "$FORMAT" --out "$LANDING" --days 1 --start-day "$NEXT" > /dev/null
  submit demo_run_3
  echo "[demo] 8/8 enrichment run 2: the held-back product's parked lines are released, the new category version is joined (no restart, no cache)"
  job_submit demo_enrich_2 enrich spark_jobs/enrich.py --pipeline "$ENRICH"
  $PY -m cdc_lake.demo.enrich_report --pipeline "$ENRICH" --plan "$SNAPS.plan.json" --step 2
elif [ "$FORMAT" != maxwell ]; then
  echo "[demo] (the enrichment part of the demo runs with DEMO_FORMAT=maxwell, the default)"
fi

if [ "${NO_AIRFLOW:-0}" != 1 ]; then
  echo "[demo] starting a local Airflow with the pipeline DAGs (stop it: scripts/airflow_local.sh stop)"
  scripts/airflow_local.sh start
fi
