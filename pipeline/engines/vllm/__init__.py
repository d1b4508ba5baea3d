"""vLLM as mxperf's sampler: a live engine in its own process (see docs/engines.md). Never imports vllm here."""
