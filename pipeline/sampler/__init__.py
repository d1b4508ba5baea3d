"""mxperf's sampler engine: its own Qwen3 forward, vLLM-like weight layout and grids, KV and prefix caches."""
