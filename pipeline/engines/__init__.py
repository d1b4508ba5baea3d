"""Engines by name (native, vLLM, Megatron-core) behind the interfaces of ``pipeline.interfaces``."""
