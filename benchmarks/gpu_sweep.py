"""GPU sweep: BF16 vs FP8 linear layers of a Qwen3-8B-shaped layer stack across micro-batch sizes.

What runs. A stack of L decoder layers reduced to their linear layers (vLLM's fused shapes: ``qkv_proj``
[(32+2*8)*128, 4096], ``o_proj`` [4096, 4096], ``gate_up_proj`` [2*12288, 4096], ``down_proj`` [4096, 12288]),
chained as a decoder layer chains them -- the core attention is not a linear layer and is left out: its
output is stood in for by the query columns (the first ``q_heads * head_dim`` = 4096) of the QKV projection.
One forward through the stack is one micro-batch of ``tokens_per_microbatch`` tokens (phase ``logprob``: a
full-sequence forward). Dense presets only (an MoE preset's MLP is not one ``gate_up_proj``). The BF16
weights are drawn once per run on the CPU and copied to the device for every (precision, size), so the
sweep's time goes to the GPU, not to the CPU random-number generator.

Precisions (precision ids; Hopper has no MXFP8 tensor cores, so no ``mxfp8`` here):

- ``bf16``: ``x @ W.T`` in BF16.
- ``fp8-tensor``: ``torch._scaled_mm`` on E4M3 operands, one fp32 scale per tensor (amax / 448, current
  scaling for activations, once for weights).
- ``fp8-rowwise``: the same with one fp32 scale per activation row and per weight row (SM 9.0+).

Activations are quantized on every call (dynamic scaling), so the per-micro-batch cost includes the quantize
kernels -- that is the fixed + per-token overhead the cost model fits. Values are **clamped to +-448 before
the cast**: torch < 2.13 does not saturate float8 casts (it overflows to NaN).

Outputs (``-o DIR``): ``manifest.json`` (kind ``sweep``), ``microbatches.csv`` and, where pandas + pyarrow
import, ``microbatches.parquet`` (else ``--finalize DIR`` on a machine with them); per (precision, size) a
Kineto trace ``traces/<precision>-t<tokens>/rank-0.json.gz`` with an ``mxperf.toml`` label sidecar for
``mxperf ingest``. The traced forwards run under a profiler schedule (one warm-up forward, discarded, then
``TRACED_MICROBATCHES`` recorded ones): the first forward under CUPTI pays the profiler's own start-up cost.
Runs with the image's packages only (``PYTHONPATH=.``; no nvtx package needed).

    PYTHONPATH=. python benchmarks/gpu_sweep.py -o runs/gpu-sweep [--layers 4] [--tokens 512,1024,...]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FP8_MAX = 448.0
PRECISIONS = ("bf16", "fp8-tensor", "fp8-rowwise")
PHASE = "logprob"
RANGE_NAME = "logprob/microbatch"  # ingest: --microbatch-range 'logprob/microbatch'
TRACED_MICROBATCHES = 2
PROFILER_WARMUP = 1  # profiled forwards discarded before the traced ones
# The micro-batch contract (tracing/outputs/schema.py MICROBATCH_COLUMNS), repeated here because tracing.outputs.schema needs
# pandas, which the GPU image may lack; tests/unit/test_gpu_sweep.py asserts the two agree.
MICROBATCH_COLUMNS = (
    "model",
    "precision",
    "phase",
    "tokens_per_microbatch",
    "num_tokens",
    "repeat",
    "step",
    "microbatch",
    "seconds",
    "gpu_busy_seconds",
    "host_stall_seconds",
    "peak_mem_bytes",
    "flops",
    "source",
)


@dataclass(frozen=True)
class StackShape:
    """Linear shapes of one decoder layer (N = out_features, K = in_features)."""

    name: str
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    @property
    def linears(self) -> dict[str, tuple[int, int]]:
        qkv = (self.q_heads + 2 * self.kv_heads) * self.head_dim
        return {
            "qkv_proj": (qkv, self.hidden),
            "o_proj": (self.hidden, self.q_heads * self.head_dim),
            "gate_up_proj": (2 * self.intermediate, self.hidden),
            "down_proj": (self.hidden, self.intermediate),
        }

    @property
    def q_width(self) -> int:
        """Columns of the QKV output that are queries: the width of the attention output o_proj reads."""
        return self.q_heads * self.head_dim

    def flops_per_token(self, layers: int) -> float:
        return 2.0 * layers * sum(n * k for n, k in self.linears.values())


def shape_from_preset(name: str) -> StackShape:
    """Shapes from mxperf's dense model presets (``qwen3-8b``) -- one source of truth for the dimensions."""
    from pipeline.model.presets import get_preset

    p = get_preset(name)
    if p.is_moe:
        raise SystemExit(
            f"--model {name}: an MoE preset; this sweep stacks dense decoder layers (use qwen3-8b or tiny-dense)"
        )
    return StackShape(
        name,
        int(p.get("hidden_size")),
        int(p.get("num_attention_heads")),
        int(p.get("num_key_value_heads")),
        p.head_dim,
        int(p.get("intermediate_size")),
    )


# -- FP8 quantization (E4M3, fp32 scales) ---------------------------------------------------------------
def quantize_fp8(x: torch.Tensor, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 data, fp32 scale) with scale = amax / 448 per tensor ([]) or per row ([M, 1]); x ~ data * scale.
    Clamped before the cast (torch < 2.13 does not saturate)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True) if rowwise else xf.abs().amax()
    scale = (amax / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    data = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return data, scale.float()


class Linear:
    """One linear layer at a precision: BF16 weights, or E4M3 weights + fp32 scales quantized once."""

    def __init__(self, w_NK: torch.Tensor, precision: str) -> None:
        self.precision = precision
        if precision == "bf16":
            self.w = w_NK.to(torch.bfloat16)
            return
        rowwise = precision == "fp8-rowwise"
        w_fp8, w_scale = quantize_fp8(w_NK, rowwise)
        self.w_t = w_fp8.t()  # [K, N] column-major: what _scaled_mm wants as mat2
        self.w_scale = w_scale.t().contiguous() if rowwise else w_scale  # [1, N] or []
        self.rowwise = rowwise

    def __call__(self, x_MK: torch.Tensor) -> torch.Tensor:
        if self.precision == "bf16":
            return x_MK @ self.w.t()
        x_fp8, x_scale = quantize_fp8(x_MK, self.rowwise)
        sa, sb = x_scale, self.w_scale
        if x_MK.device.type == "cpu" and not self.rowwise:
            # CPU torch's per-tensor _scaled_mm is a naive reference (seconds for a tiny GEMM); a per-tensor
            # scale is a rowwise scale with equal rows, so the (fast) rowwise kernel computes the same thing.
            sa = x_scale.expand(x_MK.shape[0], 1).contiguous()
            sb = self.w_scale.expand(1, self.w_t.shape[1]).contiguous()
        return torch._scaled_mm(x_fp8, self.w_t, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


def make_weights(shape: StackShape, layers: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """BF16 [N, K] weights on the CPU (std 0.02, as HF initializes Qwen3): drawn once, shared by every
    precision and size (drawing a Qwen3-8B layer takes seconds of CPU time)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [
        {
            name: (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
            for name, (n, k) in shape.linears.items()
        }
        for _ in range(layers)
    ]


def build_stack(
    weights: list[dict[str, torch.Tensor]], precision: str, device: torch.device
) -> list[dict[str, Linear]]:
    """The layers of ``weights`` on ``device`` at ``precision`` (FP8: weights quantized here, once)."""
    return [{name: Linear(w.to(device), precision) for name, w in layer.items()} for layer in weights]


def stack_forward(stack: list[dict[str, Linear]], x: torch.Tensor, q_width: int) -> torch.Tensor:
    """Decoder-layer chaining of the linears (residuals, SwiGLU); attention core left out (module docstring)."""
    for layer in stack:
        qkv = layer["qkv_proj"](x)
        x = x + layer["o_proj"](qkv[:, :q_width].contiguous())
        gate, up = layer["gate_up_proj"](x).chunk(2, dim=-1)
        x = x + layer["down_proj"](torch.nn.functional.silu(gate) * up)
    return x


# -- measurement --------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mem(device: torch.device) -> float | None:
    return float(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def measure(
    shape: StackShape,
    weights: list[dict[str, torch.Tensor]],
    precision: str,
    tokens: int,
    repeats: int,
    warmup: int,
    device: torch.device,
    trace_dir: Path | None,
) -> list[dict[str, Any]]:
    """Rows of ``microbatches`` for one (precision, size): ``repeats`` timed forwards after ``warmup``, without
    the profiler. With ``trace_dir``, ``TRACED_MICROBATCHES`` more forwards then run under the Kineto profiler,
    after one profiled warm-up forward that the profiler discards (not in the table: profiling inflates host
    time; ``mxperf ingest`` measures those from the trace)."""
    layers = len(weights)
    stack = build_stack(weights, precision, device)
    g = torch.Generator(device="cpu").manual_seed(tokens)
    x = torch.randn(tokens, shape.hidden, generator=g).to(device=device, dtype=torch.bfloat16)
    for _ in range(warmup):
        stack_forward(stack, x, shape.q_width)
    _sync(device)
    rows = []
    for rep in range(repeats):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter_ns()
        y = stack_forward(stack, x, shape.q_width)
        _sync(device)
        seconds = (time.perf_counter_ns() - t0) / 1e9
        if not bool(torch.isfinite(y).all()):
            raise FloatingPointError(f"{precision} at {tokens} tokens produced non-finite outputs")
        rows.append(
            {
                "model": shape.name,
                "precision": precision,
                "phase": PHASE,
                "tokens_per_microbatch": tokens,
                "num_tokens": tokens,
                "repeat": rep,
                "step": 0,
                "microbatch": rep,
                "seconds": seconds,
                "gpu_busy_seconds": None,  # from the trace: mxperf ingest
                "host_stall_seconds": None,
                "peak_mem_bytes": _peak_mem(device),
                "flops": shape.flops_per_token(layers) * tokens,
                "source": "sweep",
            }
        )
    if trace_dir is not None:
        with _profiler(device) as prof:
            for _ in range(PROFILER_WARMUP + TRACED_MICROBATCHES):
                with torch.profiler.record_function(RANGE_NAME):
                    stack_forward(stack, x, shape.q_width)
                    _sync(device)
                prof.step()
        write_trace(prof, trace_dir, shape.name, precision, tokens, 0)
    return rows


def _profiler(device: torch.device) -> Any:
    """Kineto (CPU + CUDA activity on a GPU): ``PROFILER_WARMUP`` steps traced and discarded, then
    ``TRACED_MICROBATCHES`` recorded (torch.profiler.schedule: warm-up results are skewed by start-up cost)."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    sched = torch.profiler.schedule(wait=0, warmup=PROFILER_WARMUP, active=TRACED_MICROBATCHES, repeat=1)
    return torch.profiler.profile(activities=acts, schedule=sched)


def write_trace(prof: Any, trace_dir: Path, model: str, precision: str, tokens: int, rep: int) -> Path:
    """``traces/<precision>-t<tokens>/rank-0.json.gz`` plus its ``mxperf.toml`` labels for ingest."""
    d = trace_dir / f"{precision}-t{tokens}"
    d.mkdir(parents=True, exist_ok=True)
    path = d / "rank-0.json.gz"
    prof.export_chrome_trace(str(path))
    (d / "mxperf.toml").write_text(
        f'[labels]\nmodel = "{model}"\nprecision = "{precision}"\ntokens_per_microbatch = {tokens}\n'
        f'phase = "{PHASE}"\nrepeat = {rep}\n'
    )
    return path


def machine() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "capability": list(torch.cuda.get_device_capability(0)) if cuda else None,
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
    }


# -- outputs ------------------------------------------------------------------------------------------------
def write_microbatches(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """``microbatches.csv`` always; ``microbatches.parquet`` (tracing.outputs.store) when pandas + pyarrow import."""
    written = [out / "microbatches.csv"]
    with open(written[0], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=MICROBATCH_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r[k] is None else r[k]) for k in MICROBATCH_COLUMNS})
    try:
        written.append(finalize(out))
    except ImportError as exc:
        print(
            f"[gpu_sweep] no parquet here ({exc}); run `--finalize {out}` where pandas+pyarrow exist",
            file=sys.stderr,
        )
    return written


def finalize(out: Path) -> Path:
    """microbatches.csv -> microbatches.parquet with the shared schema (needs pandas + pyarrow)."""
    import pandas as pd

    from tracing.outputs import store
    from tracing.outputs.schema import MICROBATCH_COLUMNS as SCHEMA

    df = pd.read_csv(out / "microbatches.csv")
    for col, dtype in SCHEMA.items():
        df[col] = df[col].astype(dtype)
    return store.write_table(df[list(SCHEMA)], out / store.MICROBATCHES)


class Manifest:
    """manifest.json (docs/contracts.md output-folder fields) written first as ``running``, rewritten at the end. Uses
    tracing.outputs.manifest.OutputDir when importable (it needs pandas), else writes the same fields itself."""

    def __init__(self, out: Path, config: dict[str, Any], force: bool) -> None:
        self.out = out
        try:
            from tracing.outputs.manifest import OutputDir

            self._impl: Any = OutputDir(out, kind="sweep", command=sys.argv, config=config, force=force)
            self._impl.update(machine=machine() | self._impl.data["machine"])
        except ImportError:
            if out.exists() and any(out.iterdir()) and not force:
                raise SystemExit(
                    f"{out}: output directory is not empty; choose another -o or pass --force"
                ) from None
            self._impl = None
            self.data = {
                "schema_version": 1,
                "kind": "sweep",
                "status": "running",
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "mxperf_version": _mxperf_version(),
                "git_sha": os.environ.get("MXPERF_GIT_SHA"),
                "command": sys.argv,
                "config": config,
                "machine": machine(),
                "compute_dtype": "bfloat16",
            }

    @property
    def path(self) -> Path:
        """Where to write while the block runs (OutputDir builds in a temp folder and swaps it in at the end)."""
        return self._impl.path if self._impl is not None else self.out

    def __enter__(self) -> Manifest:
        if self._impl is not None:
            self._impl.__enter__()
        else:
            self.out.mkdir(parents=True, exist_ok=True)
            self._write()
        return self

    def update(self, **fields: Any) -> None:
        if self._impl is not None:
            self._impl.update(**fields)
        else:
            self.data.update(fields)

    def _write(self) -> None:
        tmp = self.out / "manifest.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.out / "manifest.json")

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._impl is not None:
            self._impl.__exit__(exc_type, exc, tb)
            return
        self.data["status"] = "complete" if exc_type is None else "failed"
        if exc_type is not None:
            self.data["error"] = f"{exc_type.__name__}: {exc}"
        self.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._write()


def _mxperf_version() -> str | None:
    try:
        from tracing.outputs.version import __version__

        return __version__
    except ImportError:
        return None


def supported_precisions(device: torch.device, wanted: list[str]) -> tuple[list[str], dict[str, str]]:
    """The precisions this device runs, and the reason for each one it does not."""
    if device.type != "cuda":
        return wanted, {}
    from pipeline.device import HardwareUnavailableError, require_scaled_mm

    ok, skipped = [], {}
    for p in wanted:
        try:
            if p != "bf16":
                require_scaled_mm(p)
            ok.append(p)
        except HardwareUnavailableError as exc:
            skipped[p] = str(exc)
    return ok, skipped


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="BF16 vs FP8 linear layers of a Qwen3-8B-shaped stack (see docstring)"
    )
    p.add_argument(
        "-o", "--out", type=Path, help="output directory (refuses a non-empty one without --force)"
    )
    p.add_argument("--force", action="store_true")
    p.add_argument(
        "--model", default="qwen3-8b", help="shape preset (pipeline.model.presets); tiny-dense for CPU tests"
    )
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", default="512,1024,2048,4096,8192,16384", help="micro-batch sizes in tokens")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda", help="cuda (the device check) or cpu (tests)")
    p.add_argument("--no-trace", action="store_true", help="skip the Kineto traces")
    p.add_argument("--max-seconds", type=float, default=420.0, help="stop starting new sizes after this")
    p.add_argument("--finalize", type=Path, help="only convert DIR/microbatches.csv to parquet, then exit")
    args = p.parse_args(argv)
    if args.finalize is None and args.out is None:
        p.error("-o/--out is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.finalize is not None:
        print(finalize(args.finalize))
        return 0
    torch.set_num_threads(1) if args.device == "cpu" else None
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no CUDA device here; use --device cpu for a functional run")
    shape = shape_from_preset(args.model)
    tokens = [int(t) for t in args.tokens.split(",") if t]
    wanted = [p for p in args.precisions.split(",") if p]
    unknown = sorted(set(wanted) - set(PRECISIONS))
    if unknown:
        raise SystemExit(f"unknown precision(s) {unknown}; this sweep runs {', '.join(PRECISIONS)}")
    precisions, skipped = supported_precisions(device, wanted)
    config = {
        "model": args.model,
        "layers": args.layers,
        "tokens": tokens,
        "precisions": precisions,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "device": args.device,
        "phase": PHASE,
        "shape": shape.__dict__,
        "skipped_precisions": skipped,
    }
    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    not_run: list[str] = []
    with Manifest(args.out, config, args.force) as man:
        weights = make_weights(shape, args.layers)
        # Sizes outer, precisions inner: a time cut-off leaves every precision with the same sizes.
        for n in tokens:
            if time.perf_counter() - t_start > args.max_seconds:
                not_run.append(f"{n}")
                continue
            for prec in precisions:
                trace_dir = None if args.no_trace else man.path / "traces"
                rows += measure(shape, weights, prec, n, args.repeats, args.warmup, device, trace_dir)
                med = sorted(r["seconds"] for r in rows[-args.repeats :])[args.repeats // 2]
                print(f"[gpu_sweep] {prec:12s} {n:6d} tokens  median {med * 1e3:9.3f} ms", file=sys.stderr)
        files = write_microbatches(rows, man.path)
        man.update(
            sizes_not_run=not_run,
            files=[str(f.relative_to(man.path)) for f in files],
            wall_s=time.perf_counter() - t_start,
        )
    print(
        json.dumps(
            {
                "schema_version": 1,
                "run_dir": str(args.out),
                "status": "complete",
                "rows": len(rows),
                "precisions": precisions,
                "skipped_precisions": skipped,
                "sizes_not_run": not_run,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
