"""Stage 1 of the cost model: everything ``mxperf fit`` reads (sweeps, ingests, run folders, metric logs, tables),
turned into one micro-batch table plus the per-step phase sources."""
