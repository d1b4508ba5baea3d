"""Readers: a raw trace (Kineto JSON, nsys SQLite, mxperf range log) -> one event table (``tracing.outputs.schema``)."""
