"""Stage 2: the per-micro-batch cost model (``fixed + per_token * n``, or a knee where the data reject the line),
fitted per (model, phase, precision) with unit bootstrap intervals and lack-of-fit checks."""
