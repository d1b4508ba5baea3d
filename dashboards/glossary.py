"""The dashboard's glossary: the terms its pages use, each in two or three sentences (shown on every page)."""

from __future__ import annotations

from tracing.outputs.precisions import PRECISION_IDS

TERMS: dict[str, str] = {
    "n, N": "n = tokens per micro-batch (what one forward/backward processes); N = tokens per learner step "
    "(the global batch). A step runs N / n micro-batches, so n can never exceed N.",
    "fixed / per-token cost": "Each micro-batch costs fixed + per_token x n seconds. The fixed part does not "
    "grow with n (kernel launches, weight and scale casts, host work); the per-token part does (GEMMs).",
    "per-step cost": "A cost paid once per step whatever n is (a weight cast cached across micro-batches, "
    "the optimizer step). Spread over micro-batches it would look like per-token cost.",
    "n* (breakeven)": "The micro-batch size where the low precision starts (or stops) being faster: n* = "
    "added fixed cost / per-token saving. Reported with a 95 % interval; 'extrapolated' when outside the "
    "measured sizes.",
    "measured crossing": "The two adjacent measured sizes between which the measured time difference "
    "changes sign: the model-free answer, and a check on n*.",
    "model ok": "Whether the straight-line model is not rejected by the data for either precision. When it is "
    "rejected, n* is only reported if a model that fits gives it.",
    "knee": "Where time per micro-batch stops being set by the host launching kernels and starts being set by "
    "the GPU (time = max(host, GPU)): small micro-batches are launch-bound.",
    "GPU-busy breakeven": "The same breakeven on GPU busy time only: what the answer would be with host "
    "overhead removed (CUDA graphs, fused casts).",
    "host stall": "Time the GPU sat idle because the next kernel's launch call had not returned yet "
    "(launch-end rule). Only a GPU trace has it; a CPU run never shows it as 0.",
    "GPU busy": "The union of kernel, memcpy and memset time over all streams of a GPU.",
    "step = max over ranks": "In synchronous data parallelism a step ends when its slowest rank ends, so the "
    "job's step time is the maximum over ranks (never their sum).",
    "straggler": "The slowest rank of a step; its lag is how much longer it took than the median rank.",
    "median [IQR], n": "Medians over steps with the interquartile range (25th-75th percentile) and the number "
    "of steps. The first step (warm-up) is left out when there are three or more. A change whose two IQRs "
    "overlap is marked 'within spread'.",
    "emulated": "On a CPU, MXFP8/FP8 are emulated (values quantized and dequantized around higher-precision "
    "GEMMs): the numerics are exact, the costs are not a GPU's.",
    "I1-I7": "The weight-sync invariants checked against the live sampler after every sync: I1 grid identity, "
    "I2 coverage, I3 layout and mapping, I4 derived-state freshness, I5 precision policy, I6 auxiliary state, "
    "I7 version atomicity.",
    "k1 / k3": "KL estimators on the sampled tokens: k1 = mean(lp_sampler - lp_learner) is unbiased but can be "
    "negative on a finite sample; k3 = mean(exp(r) - r - 1), r = lp_learner - lp_sampler, is never negative.",
    "token_mult_prob_error": "mean(exp(|lp_sampler - lp_learner|)) over sampled tokens; 1.0 = identical.",
    "source (micro-batches)": "How a micro-batch row was found: 'sweep' (mxperf sweep), 'range' (an explicit "
    "micro-batch range in the trace), 'detected' (cut from the forward/backward structure of the trace).",
}


def glossary_markdown() -> str:
    """The glossary as a Markdown list, precision ids last."""
    lines = [f"- **{term}**: {text}" for term, text in TERMS.items()]
    lines.append("- **precision ids**: " + ", ".join(f"`{p}`" for p in PRECISION_IDS))
    return "\n".join(lines)
