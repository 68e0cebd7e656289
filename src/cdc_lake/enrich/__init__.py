"""The enrichment job kind (``kind: enrich``): a fact change feed (or JSON events) joined to
dimension tables that change, written to enriched / pending / aggregate / quarantine / manifest
Delta tables exactly once per micro-batch. See docs/enrichment.md.

Modules: :mod:`config` (YAML), :mod:`joins` (SCD1 / SCD2 as-of), :mod:`pending` (late members),
:mod:`aggregate` (signed deltas), :mod:`plan` (replay-stable batch inputs), :mod:`writer`
(foreachBatch) with :mod:`outputs` (each output's MERGE rule, quarantine and manifest rows),
:mod:`columns` (the job's own column names), :mod:`state` (own tables' versions, aggregate definitions, reset safety),
:mod:`job` (:func:`cdc_lake.enrich.job.run_enrich`).
"""
