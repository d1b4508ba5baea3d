"""Beside the inputs: the ingest's kernel tables read through DuckDB, the device table, roofline floors and the
kernel-level diff of two runs (``mxperf kernels`` / ``mxperf diff``)."""
