"""Models and data: Qwen3 presets built locally, the BPE tokenizer, the addition task, the cached warm start."""
