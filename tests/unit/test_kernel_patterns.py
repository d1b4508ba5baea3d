"""The kernel-name pattern table (tracing/analysis/kernel_patterns.toml): one test per row (its real example
names -> class, and precision for GEMM rows), the false positives real traces showed, the AMD GEMM names,
and the precision read from whole real traces."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tracing.analysis import kernel_classes, metrics
from tracing.analysis.kernel_classes import PATTERNS, load_patterns, match_row
from tracing.analysis.precision import PrecisionEvidence, detect_precision, gemm_precision, reconcile
from tracing.ingest.detect import load_trace
from tracing.outputs import schema

REAL = Path(__file__).resolve().parents[1] / "data" / "real"


@pytest.mark.parametrize("row", PATTERNS, ids=[r.id for r in PATTERNS])
def test_pattern_row_classes_its_real_names(row):
    assert row.project and row.file, "every row says where its names were read"
    assert row.examples
    for ex in row.examples:
        assert kernel_classes.DEFAULT.classify(ex.name) == row.kernel_class, ex.name
        assert match_row(ex.name) is row, ex.name  # this row, not an earlier one
        if row.kernel_class == "gemm":
            assert gemm_precision(ex.name) == (ex.precision or "unknown"), ex.name
        else:
            assert ex.precision is None and gemm_precision(ex.name) == "unknown"


# Real names from the nsys-ai BF16 H100 capture and HTA's traces that the old substring rules called
# quantize ("cast" in nocast / LoadWithCast, "scale" in scalePackedTensor): 19 % of that job's kernel time.
NOT_QUANTIZE = [
    (
        "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::native::"
        "BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>>(at::TensorIteratorBase &, "
        "const T1 &)::[lambda(int) (instance 1)]>(int, T3)",
        "elementwise",
    ),
    (
        "void at::native::elementwise_kernel<(int)128, (int)4, void at::native::gpu_kernel_impl_nocast<at::native::"
        "direct_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 3)]::operator ()() const::[lambda() "
        "(instance 12)]::operator ()() const::[lambda(c10::BFloat16) (instance 1)]>(at::TensorIteratorBase &, const "
        "T1 &)::[lambda(int) (instance 1)]>(int, T3)",
        "elementwise",
    ),
    (
        "void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, std::array<char *, "
        "(unsigned long)3>, (int)4, TrivialOffsetCalculator<(int)2, unsigned int>, TrivialOffsetCalculator<(int)1, "
        "unsigned int>, at::native::memory::LoadWithCast<(int)2>, at::native::memory::StoreWithCast<(int)1>>(int, T1, "
        "T2, T4, T5, T6, T7)",
        "elementwise",
    ),
    (
        "void at::native::unrolled_elementwise_kernel<at::native::FillFunctor<float>, at::detail::Array<char*, 1>, "
        "TrivialOffsetCalculator<0, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::"
        "LoadWithoutCast, at::native::memory::StoreWithoutCast>(int, at::native::FillFunctor<float>, at::detail::"
        "Array<char*, 1>, TrivialOffsetCalculator<0, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
        "at::native::memory::LoadWithoutCast, at::native::memory::StoreWithoutCast)",
        "elementwise",
    ),
    ("void cudnn::ops::scalePackedTensor_kernel<float, float>(long, float*, float)", "elementwise"),
    (
        "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(cudnn::ops::"
        "nchw2nhwc_params_t<float>, float const*, float*)",
        "other",
    ),
]


@pytest.mark.parametrize(("name", "cls"), NOT_QUANTIZE)
def test_casting_loops_and_cudnn_scale_are_not_quantize(name, cls):
    assert kernel_classes.DEFAULT.classify(name) == cls


@pytest.mark.parametrize(
    "name",
    [
        "void transformer_engine::cast_transpose_kernel<8, 4, float, __nv_bfloat16, unsigned char>",
        "void transformer_engine::detail::(anonymous namespace)::cast_transpose_optimized_kernel<...>",
        "void transformer_engine::dispatch::mxfp8::quantize_kernel::quantize_mxfp8_kernel<...>",
        "void transformer_engine::dispatch::fp8::quantize_1D_kernel::cast_fp8_1D_kernel<...>",
        "void mxfp8_quantize_kernel<__nv_bfloat16>",
        "to_mxfp8_dim1_kernel",
        "void vllm::scaled_fp8_quant_kernel<c10::BFloat16>(c10::Float8_e4m3fn*, c10::BFloat16 const*, float const*, long)",
        "void vllm::dynamic_per_token_scaled_fp8_quant_kernel<c10::BFloat16>(c10::Float8_e4m3fn*, float*, "
        "c10::BFloat16 const*, float const*, int)",
        "void fbgemm_gpu::(anonymous namespace)::_compute_FP8_quantize_cuda_kernel<float>(float const*, float const*, "
        "int, int, unsigned char*, bool)",
    ],
)
def test_real_fp8_and_mx_quantize_kernels_stay_quantize(name):
    assert kernel_classes.DEFAULT.classify(name) == "quantize"


@pytest.mark.parametrize(
    ("name", "family"),
    [
        # the AMD names (hipBLASLt 'Bias_HA_S_SAV_UserArgs' kernels, rocprof's .kd suffix)
        (
            "Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x224x64_MI16x16x1_SN_LDSB1_GSU0_WG32_8_1",
            "bf16",
        ),
        ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT32x16x128_MI16x16x1_SN.kd", "bf16"),
        ("Cijk_Ailk_Bjlk_HHS_BH_Bias_HA_S_SAV_UserArgs_MT128x128x64_MI16x16x1_SN", "fp16"),
        ("Cijk_Alik_Bljk_S_B_Bias_HA_S_SAV_UserArgs_MT208x256x32", "fp32"),  # newest grammar: S, then flags B
        ("Cijk_Ailk_Bljk_SB_MT128x64x8_SE_AMAS3_GRVW4_VW4", "fp32"),  # Tensile: S + beta
        ("Cijk_Ailk_Bljk_HB_MT016x016x16_PGR1_PLR1_TT02_02", "fp16"),  # H + beta, not bf16
        ("Cijk_Alik_Bljk_F8F8S_BH_BiasSH_AmaxD_HAS_SAB_SCD_SAV_UserArgs_MT16x16x32_MI16x16x1", "fp8"),
        ("Cijk_Ailk_Bljk_F8H_HHS_BH_MT16x16x128_MI16x16x1_SN_LDSB0", "unknown"),  # fp8 x fp16 storage: mixed
        # MX block scales: the MXA<scale>B<block> / MXB... tokens of rocm-libraries' Problem.py grammar
        ("Cijk_Ailk_Bljk_F8F8S_MXAE8B32_MXBE8B32_BH", "mxfp8"),
        ("Cijk_Ailk_Bljk_S_MXAE8B32_MXBE8B32_B_Bias", "unknown"),  # MX scales on fp32 data: no MX format
    ],
)
def test_amd_tensile_names_are_gemms_with_their_type_letters(name, family):
    assert kernel_classes.DEFAULT.classify(name) == "gemm"
    assert gemm_precision(name) == family


def test_mangled_bf16_is_bf16_not_fp16():
    """Flux on ROCm: the Itanium code DF16b (std::bfloat16_t) contains 'f16' but is bf16."""
    name = "_ZN2ck27kernel_gemm_xdl_cshuffle_v3INS_28GridwiseGemm_xdl_cshuffle_v3IDF16bDF16bfDF16bEEEEvNT_8ArgumentE"
    assert kernel_classes.DEFAULT.classify(name) == "gemm"
    assert gemm_precision(name) == "bf16"
    assert gemm_precision(name.replace("DF16b", "DF16_")) == "fp16"
    assert gemm_precision(name.replace("DF16bDF16bf", "DF16bDF16_f")) == "unknown"  # mixed: not guessed


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)", "other"),
        ("dequantize_per_channel_kernel", "quantize"),  # 'dequantize' is its own token
        # a 'flash' token, but a KV-cache write, not attention
        ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>", "elementwise"),
        ("triton_tem_fused_mm_0", "gemm"),
        ("triton_poi_fused_add_cos_sin_0", "elementwise"),
        ("broadcast_kernel", "other"),  # no 'cast' token
        ("mycastkernel", "other"),
    ],
)
def test_matching_is_by_token(name, cls):
    assert kernel_classes.DEFAULT.classify(name) == cls


def test_the_combined_class_rules_agree_with_the_rows_one_by_one():
    names = [ex.name for row in PATTERNS for ex in row.examples] + [n for n, _ in NOT_QUANTIZE]
    for path in (REAL / "hta_a100_ddp_rank0_hostbound.json.gz", REAL / "nsysai_h100x2_mfu_before.sqlite"):
        names += [str(n) for n in metrics.gpu_ops(load_trace(path).events)["name"].dropna().unique()]
    fresh = kernel_classes.KernelClassifier(kernel_classes.DEFAULT.rules)  # no memo
    for n in names:
        row = match_row(n)
        assert fresh.classify(n) == (row.kernel_class if row else "other"), n


def test_user_rules_still_come_first():
    c = kernel_classes.with_rules([("attention", r"my_custom_attn"), ("quantize", r"LoadWithCast")])
    assert c.classify("my_custom_attn_v2") == "attention"
    assert c.classify("at::native::memory::LoadWithCast<1>") == "quantize"
    assert c.classify("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN") == "gemm"


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        ("Cast", "lower case"),
        ("(?:a|b)x", "start with a letter"),
        ("a|b", "top level"),
        ("a*b", "first character"),
        ("a(b", "compile"),
    ],
)
def test_table_rejects_tokens_that_would_not_be_token_aware(tmp_path, token, problem):
    p = tmp_path / "t.toml"
    p.write_text(
        "[[row]]\nid = 'x'\nclass = 'quantize'\n"
        f"tokens = ['{token}']\nproject = 'p'\nfile = 'f'\n[[row.example]]\nname = 'n'\n"
    )
    with pytest.raises(ValueError, match=problem):
        load_patterns(p)


def test_table_rejects_rows_without_provenance_or_with_precision_off_gemm(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text(
        "[[row]]\nid = 'x'\nclass = 'quantize'\ntokens = ['quantize']\nfile = 'f'\n[[row.example]]\nname = 'n'\n"
    )
    with pytest.raises(ValueError, match="project"):
        load_patterns(p)
    p.write_text(
        "[[row]]\nid = 'x'\nclass = 'quantize'\ntokens = ['quantize']\nprecision = 'fp8'\nproject = 'p'\n"
        "file = 'f'\n[[row.example]]\nname = 'n'\n"
    )
    with pytest.raises(ValueError, match="gemm rows only"):
        load_patterns(p)


def _kernels(rows: list[tuple[str, int]]) -> pd.DataFrame:
    names = [n for n, _ in rows]
    return pd.DataFrame(
        {
            "device": 0,
            "kind": schema.KERNEL,
            "name": names,
            "kernel_class": [kernel_classes.DEFAULT.classify(n) for n in names],
            "total_ns": [t for _, t in rows],
        }
    )


def test_amd_trace_gemms_are_found_and_named():
    """HTA's MI250 trace (tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz, an fp32 model):
    its GEMMs are hipBLASLt Cijk_*_SB_* kernels, which the old rules did not see ("no GEMM kernels")."""
    ev = detect_precision(
        _kernels(
            [
                ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1", 700),
                ("Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1_SN_LDSB0_AFC1", 300),
                ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 50),
            ]
        )
    )
    assert ev.family == "fp32" and ev.gemm_ns == 1000 and ev.precision is None
    assert "no GEMM kernels" not in ev.reason


def test_amd_bf16_and_fp8_gemms_decide_the_precision():
    bf16 = detect_precision(
        _kernels(
            [
                ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_CMS_SN.kd", 900),
                ("Cijk_Alik_Bljk_HHS_BBiasH_HAH_SAV_MT32x64x32_MI16x16x16x1_SN", 100),
            ]
        )
    )
    assert (bf16.precision, bf16.family, bf16.share) == ("bf16", "bf16", 0.9)
    fp8 = detect_precision(
        _kernels(
            [
                ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64", 900),
                ("Cijk_Alik_Bljk_F8F8S_BH_BiasSH_AmaxD_HAS_SAB_SCD_SAV_UserArgs_MT16x16x32", 100),
            ]
        )
    )
    assert fp8.family == "fp8" and fp8.precision is None  # any FP8 GEMM decides; recipe not in the name
    assert reconcile("bf16", fp8)[1]  # a bf16 label the kernels contradict is warned about


def test_unknown_names_are_not_guessed():
    ev = detect_precision(_kernels([("triton_tem_fused_mm_0", 10), ("matmul_kernel", 5)]))
    assert ev.family == "unknown" and ev.precision is None
    assert reconcile("bf16", ev) == ("bf16", "")
    assert isinstance(ev, PrecisionEvidence)


def test_bf16_h100_capture_has_no_quantize_time_and_reads_bf16():
    """The nsys-ai 2x H100 BF16 job: 19 % of its kernel time was classed quantize by substring 'cast'."""
    ops = metrics.gpu_ops(load_trace(REAL / "nsysai_h100x2_mfu_before.sqlite").events)
    table = kernel_classes.kernel_table(ops)
    totals = kernel_classes.class_totals(table)
    assert "quantize" not in set(totals["kernel_class"].astype(str))
    ev = detect_precision(table)
    assert (ev.precision, ev.family) == ("bf16", "bf16") and ev.example.startswith("nvjet_tst_")
