"""Stage 3: a low precision against the baseline -- breakeven micro-batch size with Fieller or knee-curve
intervals, the model-free crossing, paired sizes, host-stall share, other devices, next measurements."""
