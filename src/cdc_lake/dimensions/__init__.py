"""``kind: dimension``: a Delta dimension table refreshed from daily full snapshot files.

* :mod:`~cdc_lake.dimensions.config` – the pipeline YAML -> :class:`DimensionPipelineConfig`.
* :mod:`~cdc_lake.dimensions.snapshot` – one date's snapshot file read as a DataFrame (CSV
  quoting, checked casts, nanosecond Parquet, column spellings);
  :mod:`~cdc_lake.dimensions.types` – snapshot column types vs. the stored ones.
* :mod:`~cdc_lake.dimensions.diff` – snapshot vs. table: the rows to insert, update, delete/close.
* :mod:`~cdc_lake.dimensions.refresh` – one run for one date: lock, read, diff, one MERGE, summary.

Example::

    from cdc_lake.config import load_pipeline
    from cdc_lake.dimensions.refresh import run_refresh
    summary = run_refresh(load_pipeline("pipelines/product_categories.yaml"), date="2026-01-02")
"""
