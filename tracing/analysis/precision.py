"""Which precision did a trace's GEMMs run in? Read from the GEMM kernel names, with the evidence kept.

Each GEMM kernel's operand precision comes from the row of ``kernel_patterns.toml`` that classed it
(``kernel_classes.match_row``): a fixed family, or a decoder below that reads the library's own type
fields, each written from that library's naming code (cited in the table)::

    nvjet_sm100_qqtst_..._Avec32UE8M0_Bvec32UE8M0_TNT     cuBLAS (nvjet)  MXFP8 (UE8M0 scale per 32)
    cutlass3x_sm100_bstensorop_gemm_ue8m0xe4m3_...        CUTLASS 3.x     MXFP8 (block-scaled)
    sm90_xmma_gemm_e4m3f32_e4m3f32_f32_tn_n_...           cuBLAS (xmma)   FP8 E4M3, recipe not named
    nvjet_sm90_tst_...  sm90_xmma_gemm_bf16bf16_...       cuBLAS          BF16
    Cijk_Ailk_Bljk_BBS_BH_...  Cijk_..._HHS_BH_...        hipBLASLt       BF16 / FP16 (in, out, compute)
    Cijk_Alik_Bljk_SB_...  Cijk_..._F8F8S_BH_...          Tensile         FP32 (S + beta) / FP8
    _ZN2ck27kernel_gemm_xdl_cshuffle_v3...DF16b...        CK, mangled     BF16 (DF16b = __bf16, not f16)

A name whose fields do not say its operand types, or say two different ones (hipBLASLt ``F8H_HHS``:
A stored fp8, B fp16, multiplied in fp16), is ``unknown``: nothing is guessed.

Rules (share = this family's GEMM time / all GEMM time): any MX block-scaled GEMM -> ``mxfp8`` (MXFP8 runs
keep some GEMMs, e.g. the LM head, in BF16); else any FP8 GEMM -> FP8 with an unknown scaling recipe, which
no precision id names alone (the caller asks for ``--label precision=``); else the family with the most
GEMM time: ``bf16`` only when the names say BF16; FP16, FP32 / TF32, FP64, INT8, FP4 and names that say
nothing are reported and not mapped. No GEMM kernels (a CPU trace): nothing detected.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tracing.analysis.kernel_classes import PRECISION_FAMILIES, kernel_table, match_row
from tracing.outputs import schema

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

UNKNOWN = "unknown"


def _one(families: list[str]) -> str:
    """The family all operands share, else unknown (mixed operand types are not one precision)."""
    kinds = set(families)
    return kinds.pop() if len(kinds) == 1 and UNKNOWN not in kinds else UNKNOWN


# --- Tensile / hipBLASLt (ROCm/Tensile Tensile/SolutionStructs.py ProblemType.__str__, Tensile/DataType.py,
# Tensile/Common.py HPATypes; ROCm/hipBLASLt tensilelite/...; ROCm/rocm-libraries projects/hipblaslt/...) ---

_TENSILE_TYPE: dict[str, str] = {
    "S": "fp32",
    "X": "fp32",  # xfloat32
    "D": "fp64",
    "H": "fp16",
    "B": "bf16",
    "I8": "int8",
    "4xi8": "int8",
    **dict.fromkeys(("F8", "B8", "F8B8", "B8F8", "F8N", "B8N", "F8B8N", "B8F8N"), "fp8"),
    "F4": "fp4",
    **dict.fromkeys(("C", "Z", "I", "I64", "F6", "B6"), UNKNOWN),  # complex, int32 / int64 operands, fp6
}
_TENSILE_CHARS = tuple(sorted(_TENSILE_TYPE, key=len, reverse=True))
# (A/B type, D type, compute type) spelled as a triple: Tensile Common.py HPATypes @ a164ed70 and
# hipBLASLt tensilelite/Tensile/Common.py HPATypes @ 7d9fb683.
_HPA_TYPES = frozenset(
    [
        ("H", "S", "S"), ("H", "H", "S"), ("B", "B", "S"), ("B", "S", "S"), ("B", "H", "S"),
        ("I8", "I", "I"), ("4xi8", "I", "I"), ("I8", "I", "S"), ("I8", "I8", "S"), ("I8", "H", "S"),
        ("I8", "B", "S"), ("F8", "S", "S"), ("B8", "S", "S"), ("F8B8", "S", "S"), ("B8F8", "S", "S"),
        ("F8", "H", "S"), ("B8", "H", "S"), ("F8B8", "H", "S"), ("B8F8", "H", "S"), ("H", "F8", "S"),
        ("F8", "B", "S"), ("F8B8", "B", "S"), ("F8", "F8", "S"), ("B8", "B8", "S"), ("F8B8", "B8", "S"),
        ("B8F8", "B8", "S"), ("F8", "B8", "S"), ("B8", "F8", "S"), ("F8B8", "F8", "S"), ("B8F8", "F8", "S"),
    ]
)  # fmt: skip
_TENSILE_FLAGS = re.compile(r"(?:Bias|B|H|Ic|I|RZ|R)*")  # UseBeta, HPA, initial strides, Fp16AltImpl
_CIJK = re.compile(r"(?<![A-Za-z0-9])(?:Custom_)?Cijk_A[A-Za-z]+_B[A-Za-z]+_([A-Za-z0-9_]*)")


@functools.lru_cache(maxsize=4096)
def _tensile_splits(token: str) -> tuple[tuple[str, ...], ...]:
    """Every way to read ``token`` as a run of Tensile type letters."""
    if not token:
        return ((),)
    out = []
    for c in _TENSILE_CHARS:
        if token.startswith(c):
            out += [(c, *rest) for rest in _tensile_splits(token[len(c) :])]
    return tuple(out)


def _tensile_mac(token: str) -> list[str] | None:
    """Operand types of an HPA type token: <T><D><C> (BBS) or, mixed A/B, <Ta><Tb><D><C>."""
    for parts in _tensile_splits(token):
        if len(parts) == 3 and parts in _HPA_TYPES:
            return [parts[0]]
        if len(parts) == 4 and ((parts[0], *parts[2:]) in _HPA_TYPES or (parts[1], *parts[2:]) in _HPA_TYPES):
            return [parts[0], parts[1]]
    return None


def _tensile(name: str) -> str:
    m = _CIJK.search(name)
    if m is None:
        return UNKNOWN
    tokens = m.group(1).split("_")
    t0, t1 = tokens[0], tokens[1] if len(tokens) > 1 else ""
    storage: list[str] = []
    ops = _tensile_mac(t0)
    if ops is None:
        pairs = [p for p in _tensile_splits(t0) if len(p) == 2]
        then = _tensile_mac(t1) or ([t1] if t1 in _TENSILE_TYPE else None)
        if pairs and then:  # hipBLASLt: <A storage><B storage>_<MAC type...>_
            storage, ops = list(pairs[0]), then
        else:  # <type><flags>: SB, HB, BBH, HBH, DB, I8BH, SBBias
            ops = next(
                ([c] for c in _TENSILE_CHARS if t0.startswith(c) and _TENSILE_FLAGS.fullmatch(t0[len(c) :])),
                None,
            )
    if ops is None:
        return UNKNOWN
    family = _one([_TENSILE_TYPE[c] for c in storage + ops])
    if any(t.startswith(("MXA", "MXB")) for t in tokens):  # MX block scales (hipBLASLt MXBlockA / MXBlockB)
        return {"fp8": "mxfp8", "fp4": "fp4"}.get(family, UNKNOWN)
    return family


# --- cuBLAS nvjet (type letters read from captures, see the row's note) ---

_NVJET = re.compile(r"nvjet_(?:sm\d+_)?([a-z]+)(?:_|$)")
_NVJET_LETTER = {"t": "bf16", "h": "fp16", "s": "fp32", "q": "fp8"}


def _nvjet(name: str) -> str:
    m = _NVJET.search(name)
    if m is None:
        return UNKNOWN
    letters = m.group(1)
    operands = letters[:2] if len(letters) == 5 else letters[:1] if len(letters) == 3 else ""
    family = _one([_NVJET_LETTER.get(c, UNKNOWN) for c in operands]) if operands else UNKNOWN
    tokens = set(re.split(r"[^a-z0-9]+", name.lower()))
    if {"avec16ue4m3", "bvec16ue4m3"} & tokens:  # NVFP4 scales (16 elements, UE4M3)
        return "fp4"
    if {"avec32ue8m0", "bvec32ue8m0"} & tokens:  # MX scales (32 elements, UE8M0)
        return "mxfp8" if family == "fp8" else UNKNOWN
    return family


# --- type words (CUTLASS DataTypeNames, cuBLAS / cuDNN xmma pairs, DeepGEMM) ---

_FAMILY_WORDS = {
    "bf16": ("bf16",),
    "fp16": ("f16", "fp16", "h"),
    "fp32": ("tf32", "f32", "fp32", "s"),
    "fp64": ("f64", "d"),
    "fp8": ("e4m3", "e5m2", "f8", "fp8"),
    "fp4": ("e2m1", "f4", "fp4", "nvfp4"),
    "mxfp8": ("mxfp8",),
    "int8": ("s8", "u8", "int8"),
}
_WORD_FAMILY = {word: family for family, words in _FAMILY_WORDS.items() for word in words}
_XMMA_PAIR = re.compile(r"(?:bf16|tf32|f16|f32|f64|e4m3|e5m2|s8|u8|s32)+")


def _xmma(name: str) -> str:
    tokens = name.lower().split("_")
    for tok in tokens[tokens.index("xmma") + 1 :] if "xmma" in tokens else ():
        if _XMMA_PAIR.fullmatch(tok):
            words = [w for w in re.findall(r"bf16|tf32|f16|f32|f64|e4m3|e5m2|s8|u8|s32", tok) if w != "s32"]
            families = [_WORD_FAMILY[w] for w in words]
            return "fp8" if "fp8" in families else _one(families)
    return UNKNOWN


_CUTLASS_NAME = re.compile(r"(?<![a-z])(cutlass(?:3x)?_[a-z0-9_]+)")
_CUTLASS_SKIP = frozenset(["tensorop", "bstensorop", "sptensorop", "bssptensorop", "simt", "wmma"])
_CUTLASS_CORE = re.compile(r"(gc|gz|[shdicz])(\d*)(?:[a-z0-9]*?)(?:sp)?(gemm|fprop|dgrad|wgrad|deconv)")
_CUTLASS_ACC = {"s": "fp32", "h": "fp16", "d": "fp64"}
_CUTLASS_3X_OPERAND = re.compile(r"(?:(?:\d+x\d+)?(ue8m0|ue4m3|f32)x)?([a-z0-9]+)")
_TILE = re.compile(r"\d+x\d+(?:x\d+)?")


def _cutlass_operand(tok: str) -> str:
    m = _CUTLASS_3X_OPERAND.fullmatch(tok)
    if m is None or m.group(2) not in _WORD_FAMILY:
        return UNKNOWN
    family = _WORD_FAMILY[m.group(2)]
    if m.group(1) == "ue8m0":  # MX: UE8M0 scale per 32 elements
        return {"fp8": "mxfp8", "fp4": "fp4"}.get(family, UNKNOWN)
    return family


def _cutlass(name: str) -> str:
    if name.startswith("_Z"):  # mangled (cuDNN's cutlass_cudnn_train kernels): no procedural name
        return UNKNOWN
    for m in _CUTLASS_NAME.finditer(name.lower()):  # cutlass_cudnn_infer::Kernel<cutlass_tensorop_...>
        family = _cutlass_procedural(m.group(1).split("_"))
        if family is not None:
            return family
    return UNKNOWN


def _cutlass_procedural(tokens: list[str]) -> str | None:
    """The operand family of one CUTLASS procedural name (None: these tokens are not one)."""
    if tokens[0] == "cutlass3x":  # cutlass3x_sm<ar>_<op>_<kind>_<A>_<B>_<acc>_<C>_<D>_...
        rest = [t for t in tokens[2:] if t not in _CUTLASS_SKIP]
        while rest and rest[0] in ("gemm", "spgemm", "grouped", "moe", "planar", "complex", "array"):
            rest = rest[1:]
        return _one([_cutlass_operand(t) for t in rest[:2]]) if len(rest) >= 2 else None
    # 2.x: cutlass[_<arch>]_<op>_[<C>_]<acc><inst><kind>[_<epilogue>][_<A>]_<tile>_...
    for i, tok in enumerate(tokens):
        core = _CUTLASS_CORE.fullmatch(tok)
        if core is None:
            continue
        for after in tokens[i + 1 :]:
            if _TILE.fullmatch(after):
                break
            if after in _WORD_FAMILY and any(ch.isdigit() for ch in after):  # bf16, f16, tf32, e4m3, ...
                return _WORD_FAMILY[after]
        return _CUTLASS_ACC.get(core.group(1), UNKNOWN)
    return None


_ARCHES = frozenset(["maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"])
_BLAS_CORE = re.compile(r"(gc|gz|[shdcz])(\d*)(gemm|cudnn)[a-z]*")
_BLAS_TYPE = {"bf16": "bf16", "fp16": "fp16", "tf32": "fp32", "int8": "int8"}


def _cublas(name: str) -> str:
    """cuBLAS / cuDNN precompiled kernels: <arch>_[<A type>_]<acc><inst>gemm_..., <s|h>cudnn, sgemm_*."""
    tokens = re.split(r"[^a-z0-9]+", name.lower())
    for i, tok in enumerate(tokens):
        if tok in _ARCHES and i + 1 < len(tokens) and tokens[i + 1] in _BLAS_TYPE:
            return _BLAS_TYPE[tokens[i + 1]]
    for i, tok in enumerate(tokens):
        core = _BLAS_CORE.fullmatch(tok)
        if core is not None:
            after = tokens[i + 1] if i + 1 < len(tokens) else ""
            if after in _BLAS_TYPE:
                return _BLAS_TYPE[after]
            return _CUTLASS_ACC.get(core.group(1), UNKNOWN)
    return UNKNOWN


_DEEPGEMM = re.compile(r"sm\d+_([a-z0-9_]*?)_gemm")


def _deepgemm(name: str) -> str:
    m = _DEEPGEMM.search(name.lower())
    if m is None:
        return UNKNOWN
    words = [w for w in m.group(1).split("_") if w in _WORD_FAMILY]
    return _one([_WORD_FAMILY[w] for w in words]) if words else UNKNOWN


# --- operand types in template arguments (composable_kernel: <ALayout, BLayout, CLayout, A, B, ...>) ---

_CXX_TYPE = re.compile(
    r"(?<![A-Za-z0-9_])(__bf16|bhalf_t|bf16_t|__nv_bfloat16|bfloat16_t|BFloat16|_Float16|half_t|__half|fp16_t|Half"
    r"|f8_fnuz_t|f8_ocp_t|f8_t|bf8_fnuz_t|bf8_ocp_t|bf8_t|fp8_t|__nv_fp8_e4m3|__nv_fp8_e5m2|Float8_e4m3fn|Float8_e5m2"
    r"|float|double|int8_t|unsigned short)(?![A-Za-z0-9_])"
)
_CXX_FAMILY = {
    "__bf16": "bf16", "bhalf_t": "bf16", "bf16_t": "bf16", "__nv_bfloat16": "bf16", "bfloat16_t": "bf16",
    "BFloat16": "bf16", "_Float16": "fp16", "half_t": "fp16", "__half": "fp16", "fp16_t": "fp16", "Half": "fp16",
    "float": "fp32", "double": "fp64", "int8_t": "int8",
    "unsigned short": UNKNOWN,  # old CK's bhalf_t typedef, indistinguishable from a real ushort
}  # fmt: skip
_MANGLED_TYPE = re.compile(r"DF16b|DF16_|\d(?:b?f8(?:_fnuz|_ocp)?_t)")


def _operand_types(name: str) -> str:
    if name.startswith("_Z"):  # Itanium mangling: DF16b std::bfloat16_t / __bf16, DF16_ _Float16
        codes = _MANGLED_TYPE.findall(name)
        families = ["bf16" if c == "DF16b" else "fp16" if c == "DF16_" else "fp8" for c in codes]
        return _one(families) if families else UNKNOWN
    found = _CXX_TYPE.findall(name)[:2]
    return _one([_CXX_FAMILY.get(t, "fp8") for t in found]) if len(found) == 2 else UNKNOWN


DECODERS: dict[str, Callable[[str], str]] = {
    "tensile": _tensile,
    "nvjet": _nvjet,
    "xmma": _xmma,
    "cutlass": _cutlass,
    "cublas": _cublas,
    "deepgemm": _deepgemm,
    "operand-types": _operand_types,
}


@functools.lru_cache(maxsize=65536)
def gemm_precision(name: str) -> str:
    """The operand precision family a GEMM kernel's name states (``kernel_patterns.toml``), or
    ``unknown`` when its row or fields do not say it (or the name is no table row's GEMM)."""
    row = match_row(name)
    if row is None or row.kernel_class != "gemm" or row.precision is None:
        return UNKNOWN
    if row.precision in PRECISION_FAMILIES:
        return row.precision
    return DECODERS[row.precision](name)


@dataclass(frozen=True)
class PrecisionEvidence:
    """What the GEMM kernels say: ``precision`` is a precision id, or None when they cannot name one."""

    precision: str | None
    family: str  # mxfp8 | fp8 | fp4 | bf16 | fp16 | fp32 | fp64 | int8 | unknown | none
    gemm_ns: int  # all GEMM kernel time
    share: float  # share of GEMM time in the kernels of ``family``
    example: str  # the longest-running kernel of that family
    reason: str  # one line for people

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def detect_precision(kernels: pd.DataFrame | pa.Table) -> PrecisionEvidence:
    """The precision of the GEMM kernels in a kernel table (``kernel_classes.kernel_table``: name,
    kernel_class, total_ns per kernel name; a frame or an Arrow table), or of raw ``metrics.gpu_ops`` rows."""
    arrow = hasattr(kernels, "column_names")
    if "kernel_class" not in (kernels.column_names if arrow else kernels.columns):
        kernels = kernel_table(kernels)
        arrow = False

    def values(c: str) -> list[Any]:
        return kernels.column(c).to_pylist() if arrow else kernels[c].tolist()

    kind, name, cls, total = (values(c) for c in ("kind", "name", "kernel_class", "total_ns"))
    rows = [i for i, k in enumerate(kind) if str(k) == schema.KERNEL]
    if not rows:
        return PrecisionEvidence(None, "none", 0, 0.0, "", "no GPU kernels in the trace")
    gemm: dict[str, int] = {}  # GEMM time per name, in the table's order (a name on several devices: once)
    for i in rows:
        if str(cls[i]) == "gemm":
            gemm[str(name[i])] = gemm.get(str(name[i]), 0) + int(total[i])
    total_ns = sum(gemm.values())
    if total_ns == 0:
        return PrecisionEvidence(None, "none", 0, 0.0, "", "no GEMM kernels among the GPU kernels")
    fam = {n: gemm_precision(n) for n in gemm}
    time_of: dict[str, int] = {}
    for n, t in gemm.items():
        time_of[fam[n]] = time_of.get(fam[n], 0) + t
    low = [f for f in ("mxfp8", "fp8", "fp4") if f in time_of]  # any low-precision GEMM decides
    family = low[0] if low else max(sorted(time_of), key=time_of.__getitem__)  # ties: the first by name
    example = max((n for n in gemm if fam[n] == family), key=gemm.__getitem__)  # ties: the first met
    share = time_of[family] / total_ns
    pct = f"{100 * share:.0f} % of GEMM time"
    precision, reason = {
        "mxfp8": ("mxfp8", f"MX block-scaled GEMMs ({pct})"),
        "fp8": (None, f"FP8 GEMMs ({pct}); the kernel names do not say the scaling recipe"),
        "fp4": (None, f"FP4 GEMMs ({pct}); no mxperf precision id covers FP4"),
        "bf16": ("bf16", f"BF16 GEMMs ({pct}), none FP8 / MX"),
        "fp16": (None, f"FP16 GEMMs ({pct}); no mxperf precision id covers FP16"),
        "fp32": (None, f"FP32 / TF32 GEMMs ({pct}); no mxperf precision id covers them"),
        "fp64": (None, f"FP64 GEMMs ({pct}); no mxperf precision id covers them"),
        "int8": (None, f"INT8 GEMMs ({pct}); no mxperf precision id covers them"),
        "unknown": (None, f"GEMM kernel names that do not say their operand types ({pct})"),
    }[family]
    return PrecisionEvidence(precision, family, total_ns, share, example, reason)


def reconcile(label: str | None, evidence: PrecisionEvidence) -> tuple[str | None, str]:
    """(precision to use, warning or ""): the label wins; a label the kernels contradict gets a warning
    naming both (``mxfp8*`` labels expect MX kernels, ``fp8-*`` FP8 ones, ``bf16`` BF16 ones)."""
    if label is None:
        return evidence.precision, ""
    if evidence.family in ("none", "unknown"):
        return label, ""
    expected = "mxfp8" if label.startswith("mxfp8") else "fp8" if label.startswith("fp8") else label
    if expected == evidence.family:
        return label, ""
    seen = evidence.precision or evidence.family
    return label, (
        f"label precision={label} but the GEMM kernels look {seen} ({evidence.reason}; e.g. {evidence.example})"
    )
