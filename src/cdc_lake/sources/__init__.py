"""Streaming sources over Delta tables.

``cdc_lake.sources.change_feed.read_change_feed`` reads a Delta table's change data feed as a
streaming DataFrame (deltalake leg: a PySpark Python Data Source; delta-spark leg: Delta's own
``readChangeFeed``). See ``docs/change-feed.md``.
"""
