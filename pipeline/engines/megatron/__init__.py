"""Megatron-core as mxperf's learner (see docs/engines.md). Importing this package does not import megatron."""
