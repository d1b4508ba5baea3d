"""The learner: GRPO maths, rollouts -> tensors, and mxperf's own HF-transformers learner engine."""
