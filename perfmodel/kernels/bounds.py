"""Physical floors of a micro-batch (GEMMs at peak FLOP/s, MXFP8 casts at HBM bandwidth) for a model's shapes
on a device of ``devices.toml``, set next to the cost model's fitted fixed and per-token terms.

Model: a dense decoder (Llama / Qwen style: q, k, v, o projections, a SwiGLU MLP of gate, up and down, an
untied output layer). Per layer the linears are (in -> out features)

    q: h -> Hq*d   k, v: h -> Hkv*d   o: Hq*d -> h   gate, up: h -> f   down: f -> h      (lm_head: h -> V)

with h = hidden size, f = ffn (intermediate) size, d = head dim, Hq / Hkv = query / key-value heads, V = vocab.

Assumptions (every result carries them in ``assumptions``):

- GEMM FLOPs per token are 2 x the linear weights per pass; a phase runs 1 pass (logprob, generate: forward)
  or 3 (update: forward, data gradient, weight gradient: three GEMMs of equal FLOPs). Attention's own
  products (QK^T, PV) and the output layer stay BF16 in the MXFP8 recipe and are left out of the saving;
  the output layer's time is counted in both precisions' floors.
- The per-token floor of a precision is FLOPs / its peak (large micro-batches: compute-bound). A micro-batch
  of n tokens has the floor sum over GEMMs of max(FLOPs / peak, bytes / bandwidth) (``perfmodel.kernels.roofline``).
- MXFP8 cast traffic (the least a quantize kernel can move): each quantized linear's input is read once in
  BF16 (2 bytes per element) and written in MXFP8 (1 byte + 1/32 of a scale byte) -- the inputs of q/k/v
  and of gate/up are one tensor each; weights likewise once per micro-batch (``fixed``). The update phase
  needs a second, column-wise MX copy of inputs and weights (MX blocks run along the reduction dimension,
  which differs between the forward and the weight-gradient GEMM) and casts the output gradients of every
  linear (two copies). One GPU holds the whole model (data parallel; with FSDP each GPU casts the gathered
  weights); weights read from BF16 (an FP32 master doubles that read: ``weight_read_bytes``).
- Host time, communication and non-GEMM kernels (attention, norms, elementwise) are outside these floors.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from perfmodel.kernels.devices import Device
from perfmodel.kernels.roofline import OPERAND_BYTES, Gemm
from tracing.outputs.errors import InputError

MX8 = OPERAND_BYTES["mxfp8"]  # 1 + 1/32 bytes per element written by an MXFP8 cast
BF16 = 2.0
# GEMM passes per phase: forward only, or forward + data gradient + weight gradient
PASSES = {"logprob": 1, "generate": 1, "forward": 1, "update": 3, "train": 3}


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    ffn: int
    vocab: int
    q_heads: int
    kv_heads: int
    head_dim: int
    name: str = ""
    source: str = ""

    @property
    def q_dim(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linears(self) -> list[tuple[str, int, int]]:
        """(name, in features K, out features N) of one layer's quantized linears."""
        h, f = self.hidden, self.ffn
        return [
            ("q", h, self.q_dim),
            ("k", h, self.kv_dim),
            ("v", h, self.kv_dim),
            ("o", self.q_dim, h),
            ("gate", h, f),
            ("up", h, f),
            ("down", f, h),
        ]

    @property
    def linear_weights(self) -> int:
        """Weights of the quantized linears, all layers (the non-embedding parameters less norms)."""
        return self.layers * sum(k * n for _, k, n in self.linears())

    @property
    def norm_weights(self) -> int:
        # two RMSNorms per layer, q/k norms (Qwen3: per head dim) and the final norm
        return self.layers * (2 * self.hidden + 2 * self.head_dim) + self.hidden

    @property
    def embedding_weights(self) -> int:
        return self.vocab * self.hidden

    def params(self, *, tied: bool = False) -> int:
        return self.linear_weights + self.norm_weights + self.embedding_weights * (1 if tied else 2)

    def cast_inputs_per_token(self) -> int:
        """Elements of the distinct inputs of one layer's quantized linears, per token (q/k/v share one, gate/up
        share one)."""
        return self.hidden + self.q_dim + self.hidden + self.ffn

    def grad_outputs_per_token(self) -> int:
        """Elements of the output gradients of one layer's quantized linears, per token."""
        return sum(n for _, _, n in self.linears())


# Shapes of public models. Qwen3-8B: its model card ('Number of Layers: 36', 'Number of Attention Heads
# (GQA): 32 for Q and 8 for KV', 'Number of Parameters: 8.2B', '(Non-Embedding): 6.95B', as quoted on the page
# below) and apxml.com/models/qwen3-8b ('Hidden Dimension Size 4,096', 'FFN Intermediate Size 12,288',
# 'Vocabulary Size 151,936', 'Attention Head Dimension 128'; its layer and head counts, 40 and 64, contradict
# the model card and are not used). tests/unit/test_bounds.py checks that these shapes give the card's 8.2B
# and 6.95B parameters.
KNOWN: dict[str, ModelShape] = {
    "qwen3-8b": ModelShape(
        hidden=4096,
        layers=36,
        ffn=12288,
        vocab=151936,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        name="Qwen3-8B",
        source="model card (https://rdit.amanbhandal.com/r/LocalLLaMA/comments/1k9qxbl/qwen3_published_30_seconds_ago"
        "_model_weights/mplq7r5/?context=3) and https://apxml.com/models/qwen3-8b",
    ),
}

SHAPE_KEYS = {
    "hidden": "hidden",
    "hidden_size": "hidden",
    "layers": "layers",
    "num_hidden_layers": "layers",
    "ffn": "ffn",
    "intermediate_size": "ffn",
    "vocab": "vocab",
    "vocab_size": "vocab",
    "heads": "q_heads",
    "q_heads": "q_heads",
    "num_attention_heads": "q_heads",
    "kv_heads": "kv_heads",
    "num_key_value_heads": "kv_heads",
    "head_dim": "head_dim",
}


def _from_fields(fields: dict[str, int], name: str, source: str) -> ModelShape:
    if "head_dim" not in fields and "hidden" in fields and fields.get("q_heads"):
        fields["head_dim"] = fields["hidden"] // fields["q_heads"]
    if "kv_heads" not in fields and "q_heads" in fields:
        fields["kv_heads"] = fields["q_heads"]
    missing = [
        k for k in ("hidden", "layers", "ffn", "vocab", "q_heads", "kv_heads", "head_dim") if k not in fields
    ]
    if missing:
        raise InputError(f"model shape {name or source}: missing {', '.join(missing)}")
    bad = [k for k, v in fields.items() if v <= 0]
    if bad:
        raise InputError(f"model shape {name or source}: {', '.join(bad)} must be positive")
    return ModelShape(**fields, name=name, source=source)


def model_shape(spec: str) -> ModelShape:
    """A model's shapes from a known name (``qwen3-8b``), a Hugging Face ``config.json`` path, or
    ``hidden=4096,layers=36,ffn=12288,vocab=151936,heads=32,kv_heads=8[,head_dim=128]``."""
    key = spec.strip()
    if key.lower() in KNOWN:
        return KNOWN[key.lower()]
    path = Path(key)
    if path.suffix == ".json" or path.is_file():
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"--model-shape {spec}: cannot read a JSON config ({exc})") from None
        raw = raw.get("text_config", raw) if isinstance(raw, dict) else raw
        if not isinstance(raw, dict):
            raise InputError(f"--model-shape {spec}: not a model config object")
        fields = {SHAPE_KEYS[k]: int(v) for k, v in raw.items() if k in SHAPE_KEYS and isinstance(v, int)}
        return _from_fields(fields, str(raw.get("_name_or_path", path.stem)), str(path))
    fields = {}
    for item in key.split(","):
        k, sep, v = item.partition("=")
        if not sep or k.strip() not in SHAPE_KEYS:
            known = ", ".join(sorted(KNOWN))
            raise InputError(
                f"--model-shape {spec!r}: expected a known model ({known}), a config.json, or "
                "hidden=H,layers=L,ffn=F,vocab=V,heads=Q,kv_heads=KV[,head_dim=D]"
            )
        try:
            fields[SHAPE_KEYS[k.strip()]] = int(v)
        except ValueError:
            raise InputError(f"--model-shape {spec!r}: {k}={v} is not an integer") from None
    return _from_fields(fields, "", "flags")


ASSUMPTIONS = (
    "GEMM FLOPs = 2 x linear weights per token per pass (update: 3 passes); attention products and the "
    "output layer stay BF16",
    "GEMMs at the device's peak dense FLOP/s (per-token: compute-bound); casts at full HBM bandwidth",
    "cast traffic: each quantized input read once in BF16 and written once per MX copy (update: row- and "
    "column-wise, and the output gradients); weights cast once per micro-batch from BF16",
    "one GPU holds and casts the whole model; host, communication and non-GEMM kernels are outside the floors",
)


def _peak(dev: Device, family: str) -> float:
    peak, note = dev.peak_flops(family)
    if not peak:
        raise InputError(f"{dev.id}: no {family} peak ({note})")
    return peak


def floors(
    dev: Device,
    shape: ModelShape,
    phase: str,
    *,
    low: str = "mxfp8",
    base: str = "bf16",
    weight_read_bytes: float = BF16,
) -> dict[str, Any]:
    """The floors of ``phase`` for ``shape`` on ``dev`` (seconds): per token, each precision's GEMM floor, the
    saving peak allows (gross, and net of the per-token casts) and the cast floor; per micro-batch, the weight
    cast floor (fixed). An :class:`InputError` when the device lacks a peak or the phase is unknown."""
    passes = PASSES.get(phase)
    if passes is None:
        raise InputError(f"phase {phase!r}: GEMM passes unknown (known: {', '.join(sorted(PASSES))})")
    bw = dev.hbm_bytes_per_s
    if not bw:
        raise InputError(f"{dev.id}: no HBM bandwidth in devices.toml")
    p_base, p_low = _peak(dev, base), _peak(dev, low)
    q_flops = passes * 2.0 * shape.linear_weights  # per token
    head_flops = passes * 2.0 * shape.embedding_weights
    gemm_tok = {base: q_flops / p_base + head_flops / p_base, low: q_flops / p_low + head_flops / p_base}
    copies = 2 if passes == 3 else 1
    act = shape.layers * shape.cast_inputs_per_token() * (BF16 + copies * MX8)
    grads = shape.layers * shape.grad_outputs_per_token() * (BF16 + 2 * MX8) if passes == 3 else 0.0
    wbytes = shape.linear_weights * (weight_read_bytes + copies * MX8)
    gross = gemm_tok[base] - gemm_tok[low]
    cast_tok = (act + grads) / bw
    return {
        "device": dev.id,
        "model": shape.name or "shapes from flags",
        "phase": phase,
        "baseline": base,
        "precision": low,
        "passes": passes,
        "gemm_per_token_s": gemm_tok,
        "saving_per_token_s": gross,
        "cast_per_token_s": cast_tok,
        "net_saving_per_token_s": gross - cast_tok,
        "cast_fixed_s": wbytes / bw,
        "cast_bytes_per_token": act + grads,
        "cast_bytes_fixed": wbytes,
        "peaks": {base: p_base, low: p_low, "hbm_bytes_per_s": bw},
        "assumptions": list(ASSUMPTIONS),
    }


def gemm_floor_microbatch_s(dev: Device, shape: ModelShape, phase: str, family: str, n: int) -> float:
    """Roofline floor (seconds) of one micro-batch's GEMMs of n tokens in ``family`` (the output layer in BF16):
    each GEMM max(FLOPs / peak, bytes / bandwidth); the three update GEMMs of a linear move the same elements."""
    passes = PASSES[phase]
    bw = dev.hbm_bytes_per_s or 0.0
    total = 0.0
    for fam, gemms in (
        (family, [Gemm(1, n, nn, k) for _, k, nn in shape.linears()] * shape.layers),
        ("bf16", [Gemm(1, n, shape.vocab, shape.hidden)]),
    ):
        peak = _peak(dev, fam)
        for g in gemms:
            nbytes = g.bytes(fam) or 0.0
            total += passes * max(g.flops / peak, nbytes / bw if bw else 0.0)
    return total


def explain(fl: dict[str, Any], terms: dict[str, Any]) -> dict[str, Any]:
    """The fitted terms (``d_tok_s``: baseline - low per token; ``d_fixed_s``: low - baseline per micro-batch;
    optional ``per_token_s`` {precision: s}, ``host_stall_share``) next to the floors ``fl``: fractions and
    one sentence each."""
    out: dict[str, Any] = {"floors": fl, "terms": terms, "lines": []}
    lines: list[str] = out["lines"]
    base, low = fl["baseline"], fl["precision"]
    d_tok, d_fixed = terms.get("d_tok_s"), terms.get("d_fixed_s")
    net, gross = fl["net_saving_per_token_s"], fl["saving_per_token_s"]
    head = f"{fl['phase']} on {fl['device']} ({fl['model']}):"
    if d_tok is not None:
        out["saving_fraction_of_peak"] = d_tok / net if net > 0 else None
        frac = (
            "-" if out["saving_fraction_of_peak"] is None else f"{100 * out['saving_fraction_of_peak']:.0f} %"
        )
        lines.append(
            f"{head} per-token saving {d_tok * 1e6:.3f} us = {frac} of what peak {low.upper()} allows "
            f"({net * 1e6:.3f} us: GEMMs {gross * 1e6:.3f} us faster at peak, casts {fl['cast_per_token_s'] * 1e6:.3f}"
            " us at full bandwidth)"
            + (
                ": more than the floors' difference, as when both precisions' GEMMs run below peak"
                if out["saving_fraction_of_peak"] and out["saving_fraction_of_peak"] > 1
                else ""
            )
        )
    if d_fixed is not None:
        cast = fl["cast_fixed_s"]
        out["fixed_not_cast_s"] = d_fixed - cast
        line = (
            f"{head} fixed {d_fixed * 1e3:+.3f} ms vs {cast * 1e3:.3f} ms of weight-cast traffic: "
            f"{(d_fixed - cast) * 1e3:.3f} ms not explained by the GPU's cast traffic"
        )
        if d_fixed > cast:
            line += " -> host (launches, stalls) or casts below bandwidth"
        share = terms.get("host_stall_share")
        if share is not None:
            line += f"; the trace's host-stall share of it: {100 * share:.0f} %"
        lines.append(line)
    per_tok = terms.get("per_token_s") or {}
    for p in (base, low):
        if per_tok.get(p) and fl["gemm_per_token_s"].get(p):
            r = per_tok[p] / fl["gemm_per_token_s"][p]
            out.setdefault("per_token_over_floor", {})[p] = r
            lines.append(
                f"{head} {p} per-token {per_tok[p] * 1e6:.3f} us = {r:.1f} x its GEMM floor "
                f"({fl['gemm_per_token_s'][p] * 1e6:.3f} us)"
            )
    return out


def fit_terms(entry: dict[str, Any]) -> dict[str, Any]:
    """The terms :func:`explain` reads from one ``fits.json`` model entry."""
    be = entry.get("breakeven") or {}
    fits = entry.get("fits") or {}
    hs = entry.get("host_stall_share_of_added_fixed")
    if isinstance(hs, dict):
        hs = hs.get("share", hs.get("value"))
    return {
        "d_tok_s": be.get("d_tok_s"),
        "d_fixed_s": be.get("d_fixed_s"),
        "per_token_s": {p: (fits.get(p) or {}).get("per_token_s") for p in fits},
        "host_stall_share": hs if isinstance(hs, (int, float)) else None,
    }


def explain_fits(doc: dict[str, Any], dev: Device, shape: ModelShape) -> list[dict[str, Any]]:
    """:func:`explain` for every model entry of a fits.json document whose phase has known passes."""
    out = []
    for e in doc.get("models") or []:
        if e.get("phase") not in PASSES:
            continue
        try:
            fl = floors(dev, shape, e["phase"], low=e["precision"], base=e["baseline"])
        except InputError as exc:
            out.append({"phase": e.get("phase"), "precision": e.get("precision"), "lines": [f"note: {exc}"]})
            continue
        ex = explain(fl, fit_terms(e))
        refused = [p for p, f in (e.get("fits") or {}).items() if isinstance(f, dict) and f.get("model_note")]
        if refused:
            ex["lines"].append(
                f"note: {e['phase']}: the fit chose no model for {', '.join(refused)} (model_note in fits.json): "
                "these are the straight lines' terms, not a fitted cost model"
            )
        out.append(ex)
    return out


def paper_check(
    dev: Device,
    shape: ModelShape,
    *,
    breakeven_tokens: float = 4500,
    phases: tuple[str, ...] = ("update", "logprob"),
    efficiencies: tuple[float, ...] = (1.0, 0.7, 0.5),
) -> list[dict[str, Any]]:
    """For a breakeven of ``breakeven_tokens``: per phase and GEMM efficiency e (both precisions at e x peak,
    casts at full bandwidth), the per-token saving ``d_tok = gross / e - casts``, the fixed cost that breakeven
    needs ``d_fixed = n* x d_tok``, the weight-cast floor, and the share of ``d_fixed`` the GPU's cast traffic
    cannot explain (the host's share, unless casts run below bandwidth)."""
    rows = []
    for phase in phases:
        fl = floors(dev, shape, phase)
        for e in efficiencies:
            d_tok = fl["saving_per_token_s"] / e - fl["cast_per_token_s"]
            d_fixed = breakeven_tokens * d_tok
            rows.append(
                {
                    "phase": phase,
                    "gemm_efficiency": e,
                    "d_tok_s": d_tok,
                    "d_fixed_s": d_fixed,
                    "cast_fixed_s": fl["cast_fixed_s"],
                    "host_share": 1 - fl["cast_fixed_s"] / d_fixed if d_fixed > 0 else None,
                    "breakeven_at_cast_floor": fl["cast_fixed_s"] / d_tok if d_tok > 0 else None,
                    "floors": fl,
                }
            )
    return rows


def paper_check_markdown(dev: Device, shape: ModelShape, breakeven_tokens: float = 4500) -> str:
    """The table docs/cost-model.md shows (tests/unit/test_bounds.py regenerates it)."""
    rows = paper_check(dev, shape, breakeven_tokens=breakeven_tokens)
    fl = {r["phase"]: r["floors"] for r in rows}
    lines = [
        f"{shape.name} on {dev.name}: {shape.linear_weights / 1e9:.3f} G quantized weights, "
        f"{shape.params() / 1e9:.2f} G parameters; breakeven {breakeven_tokens:,.0f} tokens",
        "",
        "| phase | GEMM per token BF16 / MXFP8 at peak (us) | cast per token (us) | weight-cast floor (ms) |",
        "|---|---|---|---|",
    ]
    for phase, f in fl.items():
        g = f["gemm_per_token_s"]
        lines.append(
            f"| {phase} | {g['bf16'] * 1e6:.3f} / {g['mxfp8'] * 1e6:.3f} | {f['cast_per_token_s'] * 1e6:.3f} | "
            f"{f['cast_fixed_s'] * 1e3:.3f} |"
        )
    lines += [
        "",
        "| phase | GEMMs at x peak | saving per token (us) | fixed cost for the breakeven (ms) | "
        "not cast traffic: host share needed | n* if the fixed cost were the casts alone |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['phase']} | {r['gemm_efficiency']:.2f} | {r['d_tok_s'] * 1e6:.3f} | {r['d_fixed_s'] * 1e3:.2f} | "
            f"{100 * r['host_share']:.0f} % | {r['breakeven_at_cast_floor']:,.0f} |"
        )
    return "\n".join(lines)


def as_dict(shape: ModelShape) -> dict[str, Any]:
    return asdict(shape)


def cast_floor(setup: tuple[Any, Any] | None, phase: str, base: str, low: str) -> tuple[float | None, str]:
    """The weight-cast floor (seconds per micro-batch) of ``phase`` on the device for the model shape, or
    None and why."""
    if setup is None:
        return None, "device or model unknown (mxperf fit --device D --model-shape S gives the cast floor)"
    dev, shape = setup
    try:
        fl = floors(dev, shape, phase, low=low, base=base)
    except InputError as exc:
        return None, str(exc)
    return float(fl["cast_fixed_s"]), (
        f"weight-cast floor of {shape.name or 'the model'} on {dev.id}: {fl['cast_bytes_fixed'] / 1e9:.3g} GB "
        f"at {fl['peaks']['hbm_bytes_per_s'] / 1e12:.3g} TB/s (a floor: a slower cast moves more)"
    )


if __name__ == "__main__":  # python -m perfmodel.kernels.bounds: the table of docs/cost-model.md
    from perfmodel.kernels.devices import device

    print(paper_check_markdown(device("b200"), KNOWN["qwen3-8b"]))


def microbatch_floors(
    parts: list[dict[str, Any]], dev: Device, shape: ModelShape, precision: str, *, base: str = "bf16"
) -> list[dict[str, Any]]:
    """Per (phase, tokens) of an ingest's micro-batches (``perfmodel.kernels.diff.microbatch_parts``): the mean
    measured GEMM and quantize time next to the GEMM floor of ``precision`` at that size and, for a low
    precision, the cast floor (weights + n x per token)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in parts:
        if r.get("tokens") and r.get("phase") in PASSES:
            groups.setdefault((str(r["phase"]), int(r["tokens"])), []).append(r)
    out = []
    for (phase, n), rows in sorted(groups.items()):
        k = len(rows)
        row: dict[str, Any] = {
            "phase": phase,
            "tokens": n,
            "microbatches": k,
            "gemm_ns": sum(r["gemm_ns"] for r in rows) / k,
            "quantize_ns": sum(r["quantize_ns"] for r in rows) / k,
            "wall_ns": sum(r["wall_ns"] for r in rows) / k,
        }
        try:
            row["gemm_floor_ns"] = gemm_floor_microbatch_s(dev, shape, phase, precision, n) * 1e9
        except InputError as exc:
            row["gemm_floor_ns"], row["note"] = None, str(exc)
        if precision != base and row.get("gemm_floor_ns") is not None:
            fl = floors(dev, shape, phase, low=precision, base=base)
            row["cast_floor_ns"] = (fl["cast_fixed_s"] + n * fl["cast_per_token_s"]) * 1e9
        out.append(row)
    return out
