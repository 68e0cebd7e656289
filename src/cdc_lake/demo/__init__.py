"""Demo data: a simulated MySQL shop database landed as Debezium, Maxwell or Canal JSON lines.

Modules, one concept each:

- :mod:`~cdc_lake.demo.schema` — the shop tables (columns, MySQL types, primary keys).
- :mod:`~cdc_lake.demo.binlog` — transactions and DDL placed at binlog coordinates.
- :mod:`~cdc_lake.demo.shop_model` — the seeded day-by-day simulation and true final state;
  :mod:`~cdc_lake.demo.shop_actions` — its business actions and catalog.
- :mod:`~cdc_lake.demo.writers` — per-format serialization of binlog entries.
- :mod:`~cdc_lake.demo.landing` — numbered, atomically written landing files.
- :mod:`~cdc_lake.demo.pipeline_yaml` — a pipeline YAML matching the landing data.
- :mod:`~cdc_lake.demo.generator` — ties them together, resumable via a state file.

Example::

    python -m cdc_lake.demo --format maxwell --out data/landing/shop_maxwell --days 3 --seed 7
    python -m cdc_lake.demo --format maxwell --out data/landing/shop_maxwell --days 1 --start-day 3
"""

from cdc_lake.demo.generator import (
    GenerateResult,
    GeneratorError,
    GeneratorOptions,
    generate,
    history_lines,
)
from cdc_lake.demo.pipeline_yaml import pipeline_config, pipeline_yaml, write_pipeline_yaml
from cdc_lake.demo.shop_model import ShopSimulation

__all__ = [
    "GenerateResult", "GeneratorError", "GeneratorOptions", "ShopSimulation", "generate",
    "history_lines", "pipeline_config", "pipeline_yaml", "write_pipeline_yaml",
]
