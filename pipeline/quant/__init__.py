"""Low-precision numerics: TE-exact MXFP8, FP8 grids, emulated quantized linears and the precision policy.

Modules: ``e4m3`` (element/scale bits), ``mxfp8`` (1x32 E8M0 blocks, TE rules), ``fp8`` (fp32-scaled grids),
``precisions`` (precision ids -> quantizers), ``swizzle`` (GEMM scale layout), ``linear`` / ``experts`` (emulated
quantized GEMMs with TE's rowwise/columnwise usage), ``policy`` (which modules stay BF16).
"""

from pipeline.quant.experts import QuantExperts, is_fused_experts
from pipeline.quant.fp8 import (
    FP8Tensor,
    dequantize_fp8,
    quantize_fp8_block128,
    quantize_fp8_rowwise,
    quantize_fp8_tensor,
)
from pipeline.quant.linear import MXFP8Linear, MXFP8LinearFunction, QuantLinear
from pipeline.quant.mxfp8 import (
    RULES,
    MXFP8Tensor,
    dequantize_mxfp8,
    quantize_mxfp8,
    quantize_mxfp8_along,
)
from pipeline.quant.policy import PrecisionPolicy, convert_linears
from pipeline.quant.precisions import (
    MXFP8_RULE,
    PRECISIONS,
    check_precision,
    dequantize,
    fake_quantize,
    quantize_weight,
)
from pipeline.quant.swizzle import swizzle_mxfp8_scales, unswizzle_mxfp8_scales

__all__ = [
    "MXFP8_RULE",
    "PRECISIONS",
    "RULES",
    "FP8Tensor",
    "MXFP8Linear",
    "MXFP8LinearFunction",
    "MXFP8Tensor",
    "PrecisionPolicy",
    "QuantExperts",
    "QuantLinear",
    "check_precision",
    "convert_linears",
    "dequantize",
    "dequantize_fp8",
    "dequantize_mxfp8",
    "fake_quantize",
    "is_fused_experts",
    "quantize_fp8_block128",
    "quantize_fp8_rowwise",
    "quantize_fp8_tensor",
    "quantize_mxfp8",
    "quantize_mxfp8_along",
    "quantize_weight",
    "swizzle_mxfp8_scales",
    "unswizzle_mxfp8_scales",
]
