"""Readers: a raw trace (Kineto JSON, nsys SQLite, mxperf range log) -> one event table (``tracing.outputs.schema``)."""

# files above this size on disk are read in bounded memory (``tracing.streamed``) unless told otherwise: ~64 MB
# gzipped is ~0.5 GB of JSON, ~1 GB of in-memory tables. Here, not in a reader, so that ``mxperf ingest`` can decide
# before anything heavy (numpy, pandas) is imported.
STREAM_ABOVE_BYTES = 64 << 20
