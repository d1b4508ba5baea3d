"""perfmodel.kernels.bounds: the floors (GEMMs at peak, MXFP8 casts at HBM bandwidth) against hand arithmetic, the
Qwen3-8B shapes against its model card, the fitted terms set next to them, and the CLI that shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxperf.cli import main
from perfmodel.kernels.bounds import (
    KNOWN,
    MX8,
    explain,
    fit_terms,
    floors,
    gemm_floor_microbatch_s,
    model_shape,
)
from perfmodel.kernels.devices import device
from tracing.outputs.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "runs"
QWEN = KNOWN["qwen3-8b"]


def test_qwen3_8b_shapes_give_the_model_cards_parameter_counts() -> None:
    # model card: 8.2B parameters, 6.95B non-embedding (untied embeddings)
    non_embedding = QWEN.linear_weights + QWEN.norm_weights
    assert round(non_embedding / 1e9, 2) == 6.95
    assert round(QWEN.params() / 1e9, 1) == 8.2
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288
    assert QWEN.linear_weights == 36 * per_layer


def test_floors_against_hand_arithmetic() -> None:
    b200 = device("b200")
    w, head = QWEN.linear_weights, 4096 * 151936
    f = floors(b200, QWEN, "update")
    assert f["gemm_per_token_s"]["bf16"] == pytest.approx(3 * 2 * (w + head) / 2250e12)
    assert f["gemm_per_token_s"]["mxfp8"] == pytest.approx(3 * 2 * w / 4500e12 + 3 * 2 * head / 2250e12)
    acts = 36 * (4096 + 4096 + 4096 + 12288)  # inputs of qkv, o, gate/up, down
    grads = 36 * (4096 + 1024 + 1024 + 4096 + 12288 * 2 + 4096)  # outputs of q, k, v, o, gate, up, down
    assert f["cast_per_token_s"] == pytest.approx((acts * (2 + 2 * MX8) + grads * (2 + 2 * MX8)) / 8e12)
    assert f["cast_fixed_s"] == pytest.approx(w * (2 + 2 * MX8) / 8e12)
    lp = floors(b200, QWEN, "logprob")
    assert lp["cast_per_token_s"] == pytest.approx(acts * (2 + MX8) / 8e12)
    assert lp["cast_fixed_s"] == pytest.approx(w * (2 + MX8) / 8e12)
    assert lp["net_saving_per_token_s"] == pytest.approx(
        2 * w / 2250e12 - 2 * w / 4500e12 - lp["cast_per_token_s"]
    )
    # a large micro-batch is compute-bound: its roofline floor is n x the per-token floor
    n = 65536
    assert gemm_floor_microbatch_s(b200, QWEN, "logprob", "mxfp8", n) == pytest.approx(
        n * lp["gemm_per_token_s"]["mxfp8"], rel=1e-3
    )
    # a tiny one is memory-bound: at least the weights' bytes over the bandwidth
    assert gemm_floor_microbatch_s(b200, QWEN, "logprob", "bf16", 1) >= 2 * (w + head) / 8e12


def test_a_device_without_mx_cores_or_an_unknown_phase_is_refused() -> None:
    with pytest.raises(InputError, match="no mxfp8 peak"):
        floors(device("h100"), QWEN, "update")
    with pytest.raises(InputError, match="passes unknown"):
        floors(device("b200"), QWEN, "sync")


def test_explain_sets_the_fitted_terms_next_to_the_floors() -> None:
    f = floors(device("b200"), QWEN, "logprob")
    terms = {"d_tok_s": 0.5 * f["net_saving_per_token_s"], "d_fixed_s": f["cast_fixed_s"] + 3.9e-3}
    terms["per_token_s"] = {"bf16": 2 * f["gemm_per_token_s"]["bf16"], "mxfp8": None}
    e = explain(f, terms)
    assert e["saving_fraction_of_peak"] == pytest.approx(0.5)
    assert e["fixed_not_cast_s"] == pytest.approx(3.9e-3)
    assert e["per_token_over_floor"] == {"bf16": pytest.approx(2.0)}
    text = "\n".join(e["lines"])
    assert "= 50 % of what peak MXFP8 allows" in text
    assert "3.900 ms not explained by the GPU's cast traffic -> host" in text


def test_model_shape_from_a_name_flags_and_a_config(tmp_path: Path) -> None:
    assert model_shape("Qwen3-8B") is QWEN
    s = model_shape("hidden=1024,layers=4,ffn=4096,vocab=32000,heads=16")
    assert (s.kv_heads, s.head_dim) == (16, 64)
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "hidden_size": 4096,
                "num_hidden_layers": 36,
                "intermediate_size": 12288,
                "vocab_size": 151936,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
            }
        )
    )
    c = model_shape(str(cfg))
    assert c.linear_weights == QWEN.linear_weights and c.params() == QWEN.params()
    for bad in ("hidden=1024", "width=3", "hidden=x", str(tmp_path / "missing.json")):
        with pytest.raises(InputError):
            model_shape(bad)


def test_fit_terms_reads_a_fits_json_entry() -> None:
    doc = json.loads((EXAMPLES / "fit-verl-sim" / "fits.json").read_text())
    e = doc["models"][0]
    t = fit_terms(e)
    assert t["d_tok_s"] == e["breakeven"]["d_tok_s"] and t["d_fixed_s"] == e["breakeven"]["d_fixed_s"]
    assert t["per_token_s"]["bf16"] == e["fits"]["bf16"]["per_token_s"]


SIM_SHAPE = "hidden=1024,layers=16,ffn=4096,vocab=32000,heads=16,kv_heads=8"


def test_kernels_shows_the_floors_per_micro_batch_and_the_fit(capsys) -> None:
    ing = EXAMPLES / "ingest-verl-sim-mxfp8"
    args = ["kernels", str(ing), "--device", "b200", "--model-shape", SIM_SHAPE, "--top", "2"]
    assert main([*args, "--fit", str(EXAMPLES / "fit-verl-sim"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    b = doc["bounds"]
    assert b["precision"] == "mxfp8" and b["model_shape"]["hidden"] == 1024
    sizes = {(r["phase"], r["tokens"]) for r in b["microbatches"]}
    assert ("update", 4096) in sizes and ("logprob", 256) in sizes
    shape = model_shape(SIM_SHAPE)
    for r in b["microbatches"]:
        assert r["gemm_floor_ns"] == pytest.approx(
            gemm_floor_microbatch_s(device("b200"), shape, r["phase"], "mxfp8", r["tokens"]) * 1e9
        )
        assert r["gemm_ns"] > r["gemm_floor_ns"] and r["cast_floor_ns"] > 0
    assert [e["floors"]["phase"] for e in b["fit"]] == ["logprob", "update"]
    assert main([*args, "--fit", str(EXAMPLES / "fit-verl-sim" / "fits.json")]) == 0
    text = capsys.readouterr().out
    assert "of what peak MXFP8 allows" in text and "x floor" in text and "assumption:" in text
    assert main(["kernels", str(ing), "--model-shape", SIM_SHAPE]) == 2
    assert "--model-shape needs --device" in capsys.readouterr().err
    assert main(["kernels", str(ing), "--device", "b200", "--fit", str(EXAMPLES / "fit-verl-sim")]) == 2


def test_fit_prints_the_terms_next_to_the_floors(tmp_path: Path, capsys) -> None:
    pair = [str(EXAMPLES / "ingest-verl-sim-bf16"), str(EXAMPLES / "ingest-verl-sim-mxfp8")]
    out = tmp_path / "fit"
    flags = ["--bootstrap", "20", "--device", "b200", "--model-shape", SIM_SHAPE]
    assert main(["fit", *pair, "-o", str(out), *flags]) == 0
    text = capsys.readouterr().out
    assert "update on b200 (shapes from flags): per-token saving" in text
    assert "not explained by the GPU's cast traffic" in text
    assert "the fit chose no model for" in text  # logprob's windows overlap: no cost model, said so
    assert main(["fit", *pair, "-o", str(tmp_path / "f2"), "--model-shape", SIM_SHAPE]) == 2
    assert "--model-shape needs --device" in capsys.readouterr().err


def test_the_paper_scale_check_in_the_docs_is_computed() -> None:
    """docs/cost-model.md's Qwen3-8B / B200 table is python -m perfmodel.kernels.bounds' output, and the ranges its
    text draws from it are the table's."""
    from perfmodel.kernels.bounds import paper_check, paper_check_markdown

    doc = (ROOT / "docs" / "cost-model.md").read_text()
    b200 = device("b200")
    table = paper_check_markdown(b200, QWEN)
    start = doc.index("<!-- bounds:qwen3-8b-b200")
    inner = doc[doc.index("\n", start) + 1 : doc.index("<!-- /bounds -->")]
    assert inner.strip() == table.strip()
    rows = paper_check(b200, QWEN)
    upd = [r for r in rows if r["phase"] == "update"]
    lp = [r for r in rows if r["phase"] == "logprob"]
    shares = [100 * r["host_share"] for r in rows]
    words = [
        f"per-token saving at {upd[0]['d_tok_s'] * 1e6:.1f} us (update; {lp[0]['d_tok_s'] * 1e6:.1f} us logprob)",
        f"cast floor at {upd[0]['cast_fixed_s'] * 1e3:.1f} ms (update; {lp[0]['cast_fixed_s'] * 1e3:.1f} ms",
        f"{min(r['d_fixed_s'] for r in upd) * 1e3:.0f}-{max(r['d_fixed_s'] for r in upd) * 1e3:.0f} ms per update",
        f"({min(r['d_fixed_s'] for r in lp) * 1e3:.0f}-{max(r['d_fixed_s'] for r in lp) * 1e3:.0f} ms\nlogprob)",
        f"**{min(shares):.0f}-{max(shares):.0f} % of the added fixed cost is not cast traffic**",
        f"at {100 - max(shares):.0f}-{100 - min(shares):.0f} % of HBM",
        f"breaks even at {round(min(r['breakeven_at_cast_floor'] for r in rows), -1):.0f}-"
        f"{round(max(r['breakeven_at_cast_floor'] for r in rows), -1):.0f} tokens",
    ]
    flat = " ".join(doc.split())
    for w in words:
        assert " ".join(w.split()) in flat, w
