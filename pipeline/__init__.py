"""The RL pipeline that mxperf profiles: MXFP8 numerics, learner, sampler, weight sync, invariants."""
