"""Low-precision numerics: TE-exact MXFP8, FP8 grids, emulated quantized linears and the precision policy.

Modules: ``e4m3`` (element/scale bits), ``mxfp8`` (1x32 E8M0 blocks, TE rules), ``fp8`` (fp32-scaled grids),
``precisions`` (precision ids -> quantizers), ``swizzle`` (GEMM scale layout), ``operands`` (GEMM operands, one
fusable quantizer per grid), ``gemm`` (``torch._scaled_mm`` where the hardware has it, emulation elsewhere),
``linear`` / ``experts`` (quantized fprop, dgrad and wgrad), ``policy`` (which modules stay BF16).
"""

from pipeline.quant.experts import QuantExperts, is_fused_experts
from pipeline.quant.fp8 import (
    FP8Tensor,
    dequantize_fp8,
    quantize_fp8_block128,
    quantize_fp8_rowwise,
    quantize_fp8_tensor,
)
from pipeline.quant.linear import CastSchedule, MXFP8Linear, QuantLinear, QuantLinearFunction
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
    "CastSchedule",
    "FP8Tensor",
    "MXFP8Linear",
    "MXFP8Tensor",
    "PrecisionPolicy",
    "QuantExperts",
    "QuantLinear",
    "QuantLinearFunction",
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
