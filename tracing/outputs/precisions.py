"""Precision ids: the one list every part of mxperf uses (CLI values, table values, fits.json keys, labels).

| id             | meaning                                                                              |
|----------------|--------------------------------------------------------------------------------------|
| ``bf16``         | BF16 weights and activations (the baseline)                                          |
| ``mxfp8``        | MXFP8: 1x32 blocks, E8M0 scale by the Transformer Engine >= 2.13 rule, E4M3 elements |
| ``mxfp8-te212``  | the same, TE <= 2.12 behaviour for all-zero blocks                                   |
| ``mxfp8-floor``  | MXFP8 with the OCP reference FLOOR scale rule (another grid)                         |
| ``fp8-tensor``   | FP8 E4M3, one fp32 scale per tensor (current scaling)                                |
| ``fp8-block128`` | FP8 E4M3, 128x128 weight blocks, 1x128 activation blocks, fp32 scales                |
| ``fp8-rowwise``  | FP8 E4M3, one fp32 scale per row                                                     |
| ``fp8-delayed``  | FP8 E4M3 per tensor with delayed scaling (amax history; TE/Megatron ``delayed``)     |

A measurement is never labelled with an id whose numerics it did not use (an H200 run is never ``mxfp8``).
"""

from __future__ import annotations

BASELINE = "bf16"
PRECISION_IDS: tuple[str, ...] = (
    "bf16",
    "mxfp8",
    "mxfp8-te212",
    "mxfp8-floor",
    "fp8-tensor",
    "fp8-block128",
    "fp8-rowwise",
    "fp8-delayed",
)
# What mxperf's own pipeline can compute (delayed scaling is read from others' traces, not emulated here).
PIPELINE_PRECISIONS: tuple[str, ...] = tuple(p for p in PRECISION_IDS if p != "fp8-delayed")
