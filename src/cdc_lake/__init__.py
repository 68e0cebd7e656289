"""cdc-lake: binlog-style change files -> Delta tables, incrementally and exactly once."""

__version__ = "0.1.0"
