"""The seven weight-sync invariants, checked against the LIVE sampler after every sync.

The checker reads the engine back (``engine.read_back()``: bytes, scales, derived copies, BF16 tensors;
``engine.aux_state()``; the store's load record; the rollouts of the step) and compares it with what the
learner's forward uses *now* (``learner.export_weights`` called again: it never trusts the payload that was
sent). Expected sampler tensors are built independently of the engine's loader: the canonical layout
(:func:`pipeline.sampler.weights.sampler_layout`, with the **learner's** precision policy) fuses the learner's
tensors, and the numerics library quantizes them on the sampler's grid when BF16 was the right thing to send.

====  ==========================  =========================================================================
I1    grid identity               each sampler tensor holds exactly the expected encoded rows: for a grid-
                                  matched layer the learner's fprop bytes + E8M0 scales, byte for byte; for
                                  another grid the sampler-grid quantization of the BF16 sent; BF16 bit for
                                  bit. Compared as a multiset of rows, so *where* rows sit is left to I3.
I2    coverage                    every destination row and scale row written exactly once by this load (the
                                  store's write counters), no payload name mapped nowhere, no NaN bytes /
                                  values anywhere (what ``torch.empty`` or a skipped expert leaves behind)
I3    layout and mapping          shapes and dtypes of data, scales (compact [N, K/32]) and derived copies;
                                  every fused piece (q|k|v, gate|up, per expert) is closest to its own source
                                  and within grid error of it (rel. L2 < 0.25; a swap gives ~1.4)
I4    derived-state freshness     each derived scale copy equals derive(current scale), was rebuilt in this
                                  load, and post-load processing ran exactly once
I5    precision-policy agreement  the set of quantized sampler tensors is the learner policy's set on the
                                  sampler's grid layers: embeddings, LM head, norms, router stay BF16
I6    auxiliary state             every version stamp of auxiliary state (prefix-cache entries, KV-cache
                                  scales) equals the engine's weight version
I7    version atomicity           every rollout decoded on one version, the one stamped at dispatch; every
                                  weight row resident carries the committed version; the sync committed
====  ==========================  =========================================================================

Each check returns a :class:`CheckRow` (one row of ``sync_checks.parquet``) with the first failing tensor and
a detail string; ``check_seconds`` is the wall time of that check (the expected tensors are built once per
call and their cost is charged to I1).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from pipeline.sampler.grids import dequantize_derived, derive_scale, quantize_to_grid
from pipeline.sampler.layout import MX_RULES, SamplerLayout, default_is_quantized, sampler_layout
from pipeline.sync.weight_sync import SyncReport, weights_of

INVARIANTS: dict[str, str] = {
    "I1": "grid identity",
    "I2": "coverage",
    "I3": "layout and mapping",
    "I4": "derived-state freshness",
    "I5": "precision-policy agreement",
    "I6": "auxiliary state",
    "I7": "version atomicity",
}
SYNC_CHECK_COLUMNS = (
    "step",
    "invariant",
    "name",
    "passed",
    "first_failing_tensor",
    "detail",
    "check_seconds",
)
MAPPING_REL_TOL = 0.25


@dataclass(frozen=True)
class CheckRow:
    step: int
    invariant: str
    name: str
    passed: bool
    first_failing_tensor: str | None
    detail: str
    check_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Expected:
    """What the sampler must hold: layout (learner policy) and tensors by sampler name."""

    layout: SamplerLayout
    mode: str
    tensors: dict[str, torch.Tensor]  # dest -> uint8 data or BF16; scale_name(dest) -> scale
    sources_bf16: dict[str, torch.Tensor]  # HF name -> BF16 master value (for I3)
    learner_quantized: frozenset[str]  # HF names the learner's fprop quantizes


def learner_policy(learner: Any, exported_all: Mapping[str, torch.Tensor]) -> Callable[[str], bool]:
    """The learner's precision policy, read from what it quantizes (default policy for a BF16 learner)."""
    if getattr(learner, "precision", "bf16") == "bf16":
        return default_is_quantized
    quantized = {n for n, t in exported_all.items() if t.dtype == torch.uint8}
    return quantized.__contains__


def build_expected(learner: Any, store: Any) -> Expected:
    """Expected sampler tensors for the learner's current weights, on the store's mode and grid fraction."""
    exported_all = learner.export_weights(lambda name: True)
    bf16 = learner.export_weights(lambda name: False)
    policy = learner_policy(learner, exported_all)
    layout = sampler_layout(store.config, store.mode, store.grid_fraction, policy)
    same_grid = learner.precision == "mxfp8" and store.mode == "mxfp8"
    out: dict[str, torch.Tensor] = {}
    for d in layout.dests.values():
        pieces = [p for p in layout.pieces if p.dest == d.name]
        bytes_sent = d.quantized and same_grid
        src = exported_all if bytes_sent else bf16
        fused = _fuse(d.shape, pieces, src, torch.uint8 if bytes_sent else torch.bfloat16)
        if bytes_sent:
            out[d.name] = fused
            sc = exported_all[_scale(pieces[0].source)]
            out[d.scale] = _fuse((*d.shape[:-1], sc.shape[-1]), pieces, exported_all, sc.dtype, scales=True)
        elif d.quantized:
            out[d.name], out[d.scale] = quantize_to_grid(fused, store.mode, MX_RULES.get(store.mode))
        else:
            out[d.name] = fused
    learner_q = frozenset(n for n, t in exported_all.items() if t.dtype == torch.uint8)
    return Expected(layout, store.mode, out, bf16, learner_q)


def _scale(name: str) -> str:
    from pipeline.interfaces import scale_name

    return scale_name(name)


def _fuse(
    shape: tuple[int, ...],
    pieces: Sequence[Any],
    src: Mapping[str, torch.Tensor],
    dtype: torch.dtype,
    *,
    scales: bool = False,
) -> torch.Tensor:
    """Assemble a sampler tensor (or its scale, ``scales=True``) from HF tensors by the layout's pieces."""
    out = torch.empty(shape, dtype=dtype)
    for p in pieces:
        t = src[_scale(p.source)] if scales else src[p.source]
        out[p.dst_index()] = t[p.src_index()].to(dtype).reshape(out[p.dst_index()].shape)
    return out


# -- helpers ------------------------------------------------------------------------------------------------
def _row_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor as uint8 rows [R, B] (last dim = one row; 1-D = one row), bit patterns for floats."""
    t = t.detach().contiguous()
    if t.ndim == 1:
        t = t.reshape(1, -1)
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.dtype == torch.uint8 else rows.view(torch.uint8)


def _encoded_rows(data: torch.Tensor, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(rows of data joined with their row-aligned scales, leftover scale grid compared as a whole)."""
    rows = _row_bytes(data)
    if scale is None:
        return rows, None
    if tuple(scale.shape[:-1]) == tuple(data.shape[:-1]):
        return torch.cat([rows, _row_bytes(scale).reshape(rows.shape[0], -1)], dim=1), None
    return rows, scale


def _row_multiset_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    """Rows of ``a`` not matched by a row of ``b`` (as multisets); shapes must agree."""
    if a.shape != b.shape:
        return a.shape[0] or 1
    ua, ca = torch.unique(a, dim=0, return_counts=True)
    ub, cb = torch.unique(b, dim=0, return_counts=True)
    if ua.shape == ub.shape and torch.equal(ua, ub) and torch.equal(ca, cb):
        return 0
    both = torch.cat([ua, ub])
    u, inv = torch.unique(both, dim=0, return_inverse=True)
    count_a = torch.zeros(u.shape[0], dtype=torch.int64).index_add_(0, inv[: ua.shape[0]], ca)
    count_b = torch.zeros(u.shape[0], dtype=torch.int64).index_add_(0, inv[ua.shape[0] :], cb)
    return int((count_a - count_b).clamp(min=0).sum())


def _has_nan(name: str, t: torch.Tensor, is_scale: bool) -> bool:
    if t.dtype == torch.uint8:
        if is_scale:
            return bool((t == 0xFF).any())  # E8M0 NaN
        return bool(((t & 0x7F) == 0x7F).any())  # E4M3 NaN (S.1111.111)
    return bool(torch.isnan(t.float()).any())


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        return bool(torch.equal(torch.nan_to_num(a, nan=-7.0), torch.nan_to_num(b, nan=-7.0)))
    return bool(torch.equal(a, b))


def _row(step: int, inv: str, t0: float, failures: list[tuple[str, str]], ok_detail: str) -> CheckRow:
    passed = not failures
    detail = (
        ok_detail
        if passed
        else f"{len(failures)} failing; " + "; ".join(f"{n}: {m}" for n, m in failures[:3])
    )
    first = None if passed else failures[0][0]
    return CheckRow(step, inv, INVARIANTS[inv], passed, first, detail, time.perf_counter() - t0)


def _is_quant_actual(actual: Mapping[str, torch.Tensor], name: str) -> bool:
    t = actual.get(name)
    return t is not None and t.dtype == torch.uint8


# -- the checks ---------------------------------------------------------------------------------------------
def check_grid_identity(actual: Mapping[str, torch.Tensor], exp: Expected) -> list[tuple[str, str]]:
    """I1: every sampler tensor holds exactly the expected encoded rows (bytes + scales, or BF16 bits)."""
    failures = []
    for d in exp.layout.dests.values():
        if d.name not in actual or _is_quant_actual(actual, d.name) != d.quantized:
            continue  # missing: I2; precision differs: I5
        a_rows, a_grid = _encoded_rows(actual[d.name], actual.get(d.scale) if d.quantized else None)
        e_rows, e_grid = _encoded_rows(exp.tensors[d.name], exp.tensors.get(d.scale) if d.quantized else None)
        bad = _row_multiset_diff(a_rows, e_rows)
        if bad:
            what = "rows of bytes+scales" if d.quantized else "BF16 rows"
            failures.append((d.name, f"{bad} of {e_rows.shape[0]} {what} differ from the learner's encoding"))
        elif e_grid is not None and (a_grid is None or not _same(a_grid, e_grid)):
            failures.append((d.scale, "scale grid differs from the expected quantization"))
    return failures


def check_coverage(actual: Mapping[str, torch.Tensor], record: Any, exp: Expected) -> list[tuple[str, str]]:
    """I2: every destination (and scale) present, written exactly once this load, nothing NaN."""
    failures = []
    if record is not None:
        if record.unmapped:
            failures.append((record.unmapped[0], f"{len(record.unmapped)} payload tensors mapped to nothing"))
        for name, count in record.writes.items():
            bad = int((count != 1).sum())
            if bad:
                zero = int((count == 0).sum())
                failures.append(
                    (name, f"{bad} of {count.numel()} rows written != once ({zero} never written)")
                )
    for d in exp.layout.dests.values():
        for name, is_scale in ((d.name, False), (d.scale, True), (d.derived, True)):
            if name == d.name and name not in actual:
                failures.append((name, "destination missing from the engine"))
            elif name in actual and _has_nan(name, actual[name], is_scale):
                failures.append((name, "holds NaN / uninitialized values"))
    return failures


def _dequant_canonical(mode: str, data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return dequantize_derived(mode, data, derive_scale(mode, scale, tuple(data.shape)), torch.float32)


def _expected_scale_shape(mode: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    _, s = quantize_to_grid(torch.zeros(shape[-2:], dtype=torch.bfloat16), mode)
    return (shape[0], *s.shape) if len(shape) == 3 else tuple(s.shape)


def check_layout(actual: Mapping[str, torch.Tensor], exp: Expected) -> list[tuple[str, str]]:
    """I3: shapes of data / scales / derived copies, and every fused piece closest to its own source."""
    failures = []
    for d in exp.layout.dests.values():
        t = actual.get(d.name)
        if t is None:
            continue
        if tuple(t.shape) != d.shape:
            failures.append((d.name, f"shape {tuple(t.shape)} != expected {d.shape}"))
            continue
        if t.dtype == torch.uint8:
            s, der = actual.get(d.scale), actual.get(d.derived)
            want = _expected_scale_shape(exp.mode, d.shape)
            if s is None or tuple(s.shape) != want:
                failures.append(
                    (d.scale, f"scale layout {None if s is None else tuple(s.shape)} != compact {want}")
                )
                continue
            want_der = tuple(derive_scale(exp.mode, s, d.shape).shape)
            if der is None or tuple(der.shape) != want_der:
                failures.append(
                    (d.derived, f"derived layout {None if der is None else tuple(der.shape)} != {want_der}")
                )
            values = _dequant_canonical(exp.mode, t, s)
        else:
            values = t.float()
        failures += _check_pieces(d.name, values, exp)
    return failures


def _check_pieces(dest: str, values: torch.Tensor, exp: Expected) -> list[tuple[str, str]]:
    pieces = [p for p in exp.layout.pieces if p.dest == dest]
    failures = []
    refs = {p: exp.sources_bf16[p.source][p.src_index()].float() for p in pieces}
    for p in pieces:
        got = values[p.dst_index()]
        if torch.isnan(got).any():
            continue  # unreadable: reported by I2
        errs = {}
        for q, ref in refs.items():
            if ref.shape == got.shape:
                errs[q] = float((got - ref).norm() / ref.norm().clamp(min=1e-30))
        nearest = min(errs, key=errs.__getitem__)
        own = errs[p]
        if nearest != p or own > MAPPING_REL_TOL:
            where = _describe(p)
            failures.append(
                (
                    dest,
                    f"{where} is closest to {_describe(nearest)} (rel err {errs[nearest]:.3g}; own {own:.3g})",
                )
            )
    return failures


def _describe(p: Any) -> str:
    s = p.source
    if p.expert is not None:
        s += f"[expert {p.expert}]"
    if p.src_rows is not None:
        s += f"[rows {p.src_rows[0]}:{p.src_rows[1]}]"
    return s


def check_derived(actual: Mapping[str, torch.Tensor], record: Any, exp: Expected) -> list[tuple[str, str]]:
    """I4: derived copies equal derive(current scale), rebuilt in this load; post-processing ran once."""
    failures = []
    if record is not None and record.post_process_calls != 1:
        failures.append(("<post-load processing>", f"ran {record.post_process_calls} times in this load"))
    for d in exp.layout.dests.values():
        if not _is_quant_actual(actual, d.name) or d.scale not in actual or d.derived not in actual:
            continue
        fresh = derive_scale(exp.mode, actual[d.scale], tuple(actual[d.name].shape))
        if not _same(fresh, actual[d.derived]):
            n = int((fresh != actual[d.derived]).sum()) if fresh.shape == actual[d.derived].shape else -1
            failures.append(
                (d.derived, f"stale: {n} entries differ from the rebuilt copy of the current scale")
            )
        elif record is not None and record.derived_versions.get(d.derived) != record.version:
            failures.append(
                (d.derived, f"rebuilt in v{record.derived_versions.get(d.derived)}, not v{record.version}")
            )
    return failures


def check_policy(actual: Mapping[str, torch.Tensor], exp: Expected) -> list[tuple[str, str]]:
    """I5: the quantized sampler tensors are exactly the learner policy's, on the sampler's grid layers."""
    failures = []
    for d in exp.layout.dests.values():
        if d.name not in actual:
            continue
        q = _is_quant_actual(actual, d.name)
        if q != d.quantized:
            side = (
                "quantized in the sampler, BF16 in the learner policy"
                if q
                else "BF16 in the sampler, expected on grid"
            )
            failures.append((d.name, side))
    for name in sorted(exp.learner_quantized):
        if not default_is_quantized(name) and not name.endswith("_scale"):
            failures.append((name, "the learner quantizes a module that must stay BF16 (notes 2.5)"))
    return failures


def check_aux(aux: Mapping[str, Any], version: int) -> list[tuple[str, str]]:
    """I6: every auxiliary version stamp (prefix cache, KV scales, ...) equals the weight version."""
    failures = []
    for key, value in aux.items():
        if "version" not in key or key == "weight_version":
            continue
        if value is None:
            if key.startswith("kv_scale") and aux.get("kv_cache") == "fp8":
                failures.append((key, "FP8 KV-cache scales never calibrated (fall back to 1.0)"))
            continue
        stamps = list(value) if isinstance(value, Iterable) and not isinstance(value, str) else [value]
        stale = sorted({int(v) for v in stamps if int(v) != version})
        if stale:
            failures.append((key, f"entries from versions {stale[:5]} under weight version {version}"))
    return failures


def check_atomicity(
    rollouts: Sequence[Any], record: Any, engine: Any, report: SyncReport | None
) -> list[tuple[str, str]]:
    """I7: one version per rollout (the dispatch one), resident rows all of the committed version."""
    failures = []
    mixed = [r for r in rollouts if set(r.weight_versions) != {r.dispatch_version}]
    if mixed:
        r = mixed[0]
        failures.append(
            (
                "<rollouts>",
                f"{len(mixed)} of {len(rollouts)} decoded on versions {sorted(r.weight_versions)}, "
                f"dispatched at {r.dispatch_version}",
            )
        )
    version = engine.weight_version
    if report is not None and report.version != version:
        failures.append(("<engine>", f"serves version {version} after a sync to {report.version}"))
    if record is not None:
        if record.poisoned:
            failures.append(("<engine>", "last load failed but the store was not fail-stopped"))
        for name, rows in record.row_versions.items():
            stale = rows != version
            if bool(stale.any()):
                old = sorted(set(rows[stale].tolist()))[:3]
                failures.append(
                    (name, f"{int(stale.sum())} rows from versions {old} resident under v{version}")
                )
    return failures


def check_sync(
    step: int,
    learner: Any,
    engine: Any,
    *,
    rollouts: Sequence[Any] = (),
    report: SyncReport | None = None,
) -> list[CheckRow]:
    """Run I1..I7 against the live engine; one :class:`CheckRow` per invariant."""
    store = weights_of(engine)
    if store is None:
        raise TypeError("check_sync needs an engine with a SamplerWeights store (engine.weights)")
    t0 = time.perf_counter()
    exp = build_expected(learner, store)
    actual = engine.read_back()
    record = store.load_record()
    rows = [
        _row(step, "I1", t0, check_grid_identity(actual, exp), f"{len(exp.layout.dests)} tensors identical")
    ]
    checks: list[tuple[str, Callable[[], list[tuple[str, str]]], str]] = [
        ("I2", lambda: check_coverage(actual, record, exp), "every row written once, no NaN"),
        ("I3", lambda: check_layout(actual, exp), f"{len(exp.layout.pieces)} pieces in place"),
        ("I4", lambda: check_derived(actual, record, exp), "derived copies fresh"),
        ("I5", lambda: check_policy(actual, exp), "same BF16 modules on both sides"),
        (
            "I6",
            lambda: check_aux(engine.aux_state(), engine.weight_version),
            "aux state of the weight version",
        ),
        (
            "I7",
            lambda: check_atomicity(rollouts, record, engine, report),
            f"{len(rollouts)} rollouts single-version",
        ),
    ]
    for inv, fn, ok in checks:
        t = time.perf_counter()
        rows.append(_row(step, inv, t, fn(), ok))
    return rows


def rows_to_frame(rows: Iterable[CheckRow]) -> Any:
    """Rows as a DataFrame with the ``sync_checks.parquet`` columns."""
    import pandas as pd

    df = pd.DataFrame([r.as_dict() for r in rows], columns=list(SYNC_CHECK_COLUMNS))
    return df.astype({"step": "int64", "passed": "bool", "check_seconds": "float64"})
