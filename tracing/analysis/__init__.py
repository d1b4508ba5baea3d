"""Events -> tables: device busy / idle / host stall, range attribution, kernels, phases, steps, micro-batches."""
