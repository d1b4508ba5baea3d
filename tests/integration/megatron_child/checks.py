"""Megatron checks run in a child process (the CPU compat layer patches torch.cuda process-wide).

Usage: python tests/integration/megatron_child/checks.py OUT.json [full] -- prints nothing, writes one JSON object of
measurements that ``test_megatron_learner.py`` asserts on.
"""

from __future__ import annotations

import json
import sys

import torch


def _batch(seed: int):

    g = torch.Generator().manual_seed(seed)
    b, t = 6, 24
    ids = torch.randint(0, 512, (b, t), generator=g)
    lengths = [24, 20, 17, 24, 12, 22]
    am = torch.zeros(b, t, dtype=torch.long)
    for i, n in enumerate(lengths):
        am[i, :n] = 1
    resp = torch.zeros(b, t - 1)
    for i, n in enumerate(lengths):
        resp[i, 7 : n - 1] = 1.0  # prompt of 8 tokens, response after it
    adv = torch.randn(b, generator=g)
    return ids, am, resp, adv


def main(out_path: str, full: bool) -> None:
    torch.set_num_threads(1)
    from pipeline.engines.megatron.learner import MegatronLearner
    from pipeline.engines.megatron.model import attention_shape, build_gpt_model, forward_logits
    from pipeline.engines.megatron.weights import megatron_to_hf
    from pipeline.learner.grpo import GRPOBatch
    from pipeline.model.presets import build_model, get_preset

    preset = get_preset("tiny-dense")
    res: dict[str, object] = {}
    from pipeline.engines.megatron.compat import apply_cpu_compat, init_single_process_group

    res["compat_patches"] = apply_cpu_compat()
    init_single_process_group()
    from megatron.core import tensor_parallel

    tensor_parallel.model_parallel_cuda_manual_seed(0)
    ids, am, resp, adv = _batch(0)
    am[1, :] = 0
    am[1, 5:] = 1  # one left-padded row

    # 1. Export mapping, fp32, from Megatron's own random init (not HF's): Megatron's weights in HF names,
    # loaded into HF Qwen3, give the same logits.
    torch.manual_seed(5)
    m32 = build_gpt_model(preset, dtype=torch.float32)
    own = {k: v for k, v in m32.state_dict().items() if "_extra" not in k}
    hf = build_model(preset, seed=99)
    for fault in (None, "naive_qkv_split", "swap_gate_up"):
        hf.load_state_dict(megatron_to_hf(own, attention_shape(preset), fault=fault), strict=True)
        with torch.no_grad():
            lm = forward_logits(m32, ids, am)
            lh = hf(input_ids=ids, attention_mask=am).logits
        res[f"logits_maxdiff_fp32[{fault}]"] = float((lm - lh)[am.bool()].abs().max())
    res["logits_absmax"] = float(lh.abs().max())
    # Left padding: the padded row's real tokens get the logits of the unpadded sequence.
    with torch.no_grad():
        alone = forward_logits(m32, ids[1:2, 5:], am[1:2, 5:])
    res["left_pad_maxdiff_fp32"] = float((lm[1, 5:] - alone[0]).abs().max())

    if not full:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
        return

    # 2. Learner (bf16) log-probs vs HF fp32 at the same weights.
    learner = MegatronLearner(preset, "bf16", seed=3)
    hf.load_state_dict(learner.hf_state_dict(), strict=True)
    lp_meg = learner.logprobs(ids, am)
    with torch.no_grad():
        lh = hf(input_ids=ids, attention_mask=am).logits.float()
    lp_hf = torch.log_softmax(lh[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    valid = (am[:, 1:] * am[:, :-1]).bool()
    res["logprob_maxdiff_bf16_vs_hf_fp32"] = float((lp_meg - lp_hf)[valid].abs().max())
    exported = learner.export_weights(lambda name: True)
    res["export_dtypes"] = sorted({str(v.dtype) for v in exported.values()})
    res["export_names_match_hf"] = sorted(exported) == sorted(hf.state_dict())

    # 3. Micro-batch split invariance: one step with budget 1000 vs 48 tokens gives the same weights.
    old = learner.logprobs(ids, am)
    batch = GRPOBatch(ids, am, resp, adv, old, old.clone())
    grads, stats, learners = [], [], []
    for budget in (1000, 48):
        lrn = MegatronLearner(preset, "bf16", seed=3)
        stats.append(lrn.train_step(batch, budget))
        grads.append(torch.cat([m.grad.flatten() for m in lrn.master]))
        learners.append(lrn)
    res["grad_absmax"] = float(grads[0].abs().max())
    res["split_grad_maxdiff"] = float((grads[0] - grads[1]).abs().max())
    before = learner.hf_state_dict(master=True)
    after = learners[0].hf_state_dict(master=True)
    res["update_max_move"] = max(float((after[k] - before[k]).abs().max()) for k in after)
    after_lp = learners[0].logprobs(ids, am)
    res["stats"] = stats
    # A GRPO step moves log-probs in the direction of the advantage: sum_t A * (lp_after - lp_before) > 0.
    res["advantage_weighted_lp_change"] = float(((after_lp - old) * resp * adv[:, None]).sum())
    # 4. MXFP8 learner (emulated MXFP8 linears in the local spec): the exported bytes per HF name are the
    # rowwise quantization of that name's BF16 weight (row ops commute with 1x32 blocks along K).
    from pipeline.interfaces import scale_name
    from pipeline.quant import quantize_mxfp8

    mx = MegatronLearner(preset, "mxfp8", seed=3)
    sent = mx.export_weights(lambda name: True)
    bf16 = mx.export_weights(lambda name: False)
    quantized = sorted(n for n, t in sent.items() if t.dtype == torch.uint8 and not n.endswith("_scale"))
    res["mxfp8_quantized_names"] = quantized
    res["mxfp8_bytes_match_requantized_bf16"] = all(
        torch.equal(quantize_mxfp8(bf16[n]).data, sent[n])
        and torch.equal(quantize_mxfp8(bf16[n]).scale, sent[scale_name(n)])
        for n in quantized
    )
    lp_mx = mx.logprobs(ids, am)
    res["mxfp8_vs_bf16_logprob_maxdiff"] = float((lp_mx - lp_meg)[valid].abs().max())
    mx_stats = mx.train_step(batch, 48)
    res["mxfp8_grad_norm"] = mx_stats["grad_norm"]
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], full=len(sys.argv) > 2 and sys.argv[2] == "full")
