"""Cost model: fixed + per-token fits, breakeven with intervals, step-level predictions. Needs no torch."""
