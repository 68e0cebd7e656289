"""The CDC job kind: binlog-style change files (Debezium, Maxwell, Canal) -> one Delta table per
source table, MERGEd exactly once per micro-batch.

Read in pipeline order:

* :mod:`cdc_lake.cdc.config` - the ``kind: cdc`` YAML -> ``PipelineConfig`` (tables, keys, SCD).
* :mod:`cdc_lake.cdc.job` - ``run_pipeline``: lock, readStream(text), foreachBatch, summary.
* :mod:`cdc_lake.cdc.backlog` - what the next run will read, without Spark: the no-op check and
  the backlog size the launcher picks the driver JIT from.
* :mod:`cdc_lake.cdc.formats` - one module per producer format: Spark SQL parse + binlog order.
* :mod:`cdc_lake.cdc.events` - the normalized change-event contract the formats produce.
* :mod:`cdc_lake.cdc.discovery` - a micro-batch's survey: target tables, observed columns, plans.
* :mod:`cdc_lake.cdc.batch_writer` - the batch's writes: quarantine, DDL log, each table, once.
* :mod:`cdc_lake.cdc.changes` / :mod:`cdc_lake.cdc.column_types` - latest-per-key, SCD1/SCD2, types.

Shared with the other job kinds (one level up): ``config``, ``engines``, ``checkpoint``,
``locks``, ``runids``, ``spark_session``.
"""
