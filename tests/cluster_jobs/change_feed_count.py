"""spark-submit job for tests/test_spark_cluster.py: read a Delta table's change feed with the
deltalake leg of ``read_change_feed`` (a Python Data Source: its ``read()`` runs in executor
Python workers), availableNow, and write what each micro-batch saw to a JSON file.

    spark-submit [--py-files cdc_lake.zip] change_feed_count.py TABLE CHECKPOINT OUT.json
"""

import json
import sys

from pyspark.sql import SparkSession

table, checkpoint, out = sys.argv[1:4]
spark = SparkSession.builder.appName("cdc-change-feed-on-cluster").getOrCreate()
from cdc_lake.sources.change_feed import read_change_feed  # noqa: E402  (driver: from --py-files or installed)

rows: list = []


def collect(batch, batch_id):  # type: ignore[no-untyped-def]
    for r in batch.collect():  # the partitions were read by executors
        d = r.asDict()
        rows.append({"batch": batch_id, "id": d["id"], "v": d["v"], "change": d["_change_type"],
                     "version": d["_commit_version"]})


q = (read_change_feed(spark, table, engine="deltalake", max_versions_per_trigger=1)
     .writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
     .trigger(availableNow=True).start())
q.awaitTermination()
with open(out, "w") as f:
    json.dump(rows, f)
spark.stop()
