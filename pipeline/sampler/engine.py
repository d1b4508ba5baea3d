"""mxperf's sampler engine: batched generation with a KV cache, a versioned prefix cache, live weight sync.

A separate engine, not a view of the learner (``pipeline.interfaces.SamplerEngine``): its weights live in a
``pipeline.sampler.weights.SamplerWeights`` store in vLLM's layout and arrive as safetensors **bytes**; its
forward is ``pipeline.sampler.forward`` (incremental BF16 decoding). What it adds on top, as a serving engine:

- **Prefix cache.** The prompt's KV (and last logits) are kept per prompt token sequence, stamped with the
  weight version that computed them. GRPO sends each prompt n times: all n samples reuse one prefill. The
  lookup matches tokens only (as real engines do), so an entry from old weights is served unless the cache is
  reset at sync -- invariant I6 is a real property here.
- **FP8 KV cache** (``kv_cache="fp8"``): K and V stored as E4M3 with one fp32 scale per layer and tensor,
  calibrated (amax / 448 over a fixed calibration batch) **for each weight version**.
- **Async requests.** ``submit`` runs a generation on a worker thread, so a sync can arrive while requests
  are decoding. A correct ``update_weights`` is the sequence

      _pause_admission -> _drain -> _load -> _recalibrate_kv_scales -> _reset_prefix_cache -> _commit_version
      -> resume

  each an overridable method, so the fault injector can break any one. Each rollout records its
  ``dispatch_version`` (stamped at admission) and every version its decode steps ran on
  (``weight_versions``; a step overlapping a load records both). A load that raises leaves the engine
  failed (fail-stop): no version bump and no generation until a later sync succeeds.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.interfaces import Rollout, SamplingParams
from pipeline.sampler.forward import FP8_MAX, Dims, KVCache, forward
from tracing.outputs.errors import InputError

KV_CACHE_DTYPES = ("bf16", "fp8")


class EngineFailedError(RuntimeError):
    """The engine refuses to serve after a failed or partial weight load (fail-stop)."""


@dataclass
class _PrefixEntry:
    version: int
    k: list[torch.Tensor]  # per layer [Nkv, P, D] in the cache dtype
    v: list[torch.Tensor]
    last_logits: torch.Tensor  # [V] float32
    k_scales: list[float]
    v_scales: list[float]


def _store_class() -> Any:
    from pipeline.sampler.weights import SamplerWeights

    return SamplerWeights


class Sampler:
    """A :class:`pipeline.interfaces.SamplerEngine` (see the module docstring)."""

    def __init__(
        self,
        config: Any,
        mode: str = "bf16",
        *,
        grid_fraction: float = 1.0,
        kv_cache: str = "bf16",
        prefix_cache: bool = True,
        calibration_prompts: Sequence[Sequence[int]] = (),
        eos_id: int = 1,
        pad_id: int = 0,
        weights: Any = None,
        device: Any = None,
    ) -> None:
        """``device``: where the weight store, the KV cache and every decode step live (default: the CPU)."""
        if kv_cache not in KV_CACHE_DTYPES:
            raise InputError(f"unknown --kv-cache {kv_cache!r}; choose one of {', '.join(KV_CACHE_DTYPES)}")
        if not 0.0 <= grid_fraction <= 1.0:
            raise InputError(f"--grid-fraction must be in [0, 1], got {grid_fraction}")
        self.config = config
        self.mode = mode
        self.grid_fraction = grid_fraction
        self.kv_cache = kv_cache
        self.dims = Dims.from_config(config)
        self.device = torch.device(device if device is not None else "cpu")
        self.weights = (
            weights
            if weights is not None
            else _store_class()(config, mode, grid_fraction=grid_fraction, device=self.device)
        )
        self.use_prefix_cache = prefix_cache
        self.calibration_prompts = [list(p) for p in calibration_prompts]
        self.eos_id, self.pad_id = eos_id, pad_id
        n = self.dims.num_layers
        self.k_scales, self.v_scales = [1.0] * n, [1.0] * n
        self.kv_scale_version: int | None = None
        self._prefix: dict[tuple[int, ...], _PrefixEntry] = {}
        self._version = -1
        self._pending_version: int | None = None
        self._loading = False
        self._failed: str | None = None
        self._cv = threading.Condition()
        self._admission_open = True
        self._inflight = 0
        self._update_lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.stats = {"prefix_hits": 0, "prefix_misses": 0, "decode_steps": 0}

    # -- SamplerEngine ---------------------------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        return self._version

    def read_back(self) -> dict[str, torch.Tensor]:
        return self.weights.read_back()

    def aux_state(self) -> Mapping[str, Any]:
        with self._cv:
            return {
                "weight_version": self._version,
                "prefix_cache_versions": sorted({e.version for e in self._prefix.values()}),
                "prefix_cache_entries": len(self._prefix),
                "kv_cache": self.kv_cache,
                "kv_scale_version": self.kv_scale_version,
                "k_scales": list(self.k_scales),
                "v_scales": list(self.v_scales),
                "admission_open": self._admission_open,
                "inflight": self._inflight,
                "failed": self._failed,
            }

    def update_weights(self, payload: bytes, version: int) -> None:
        """Load a full push and refresh every derived / auxiliary state (see the module docstring)."""
        with self._update_lock:
            self._pause_admission()
            try:
                self._drain()
                try:
                    self._pending_version = version
                    self._loading = True
                    self._load(payload)
                except Exception as exc:
                    self._failed = f"weight load for version {version} failed: {exc}"
                    raise
                finally:
                    self._loading = False
                self._recalibrate_kv_scales(version)
                self._reset_prefix_cache()
                self._commit_version(version)
            finally:
                self._resume_admission()

    def _pause_admission(self) -> None:
        with self._cv:
            self._admission_open = False

    def _drain(self) -> None:
        with self._cv:
            self._cv.wait_for(lambda: self._inflight == 0)

    def _load(self, payload: bytes) -> None:
        self.weights.load_weights(payload)

    def _recalibrate_kv_scales(self, version: int) -> None:
        """FP8 KV: per-layer scale = amax / 448 of K and V on the calibration batch, under the new weights."""
        if self.kv_cache == "fp8" and self.calibration_prompts:
            prompts = self.calibration_prompts
            width = max(len(p) for p in prompts)
            ids, pos, valid = _left_pad(prompts, width, self.pad_id, self.device)
            cache = KVCache(self.dims, len(prompts), width, fp8=False, track_amax=True, device=self.device)
            with torch.no_grad():
                forward(self.weights, self.dims, ids, pos, valid, cache, 0)
            self.k_scales = [max(a, 1e-8) / FP8_MAX for a in cache.observed_amax_k]
            self.v_scales = [max(a, 1e-8) / FP8_MAX for a in cache.observed_amax_v]
        self.kv_scale_version = version

    def _reset_prefix_cache(self) -> None:
        with self._cv:
            self._prefix.clear()

    def _commit_version(self, version: int) -> None:
        with self._cv:
            self._version = version
            self._pending_version = None
            self._failed = None

    def _resume_admission(self) -> None:
        with self._cv:
            self._admission_open = True
            self._cv.notify_all()

    # -- generation --------------------------------------------------------------------------------------
    def submit(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> concurrent.futures.Future:
        """Generate on the engine's worker thread; the result is a Future of ``list[Rollout]``."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampler")
        return self._pool.submit(self.generate, prompts, params)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _admit(self) -> int:
        with self._cv:
            self._cv.wait_for(lambda: self._admission_open)
            if self._failed is not None:
                raise EngineFailedError(self._failed)
            if self._version < 0:
                raise EngineFailedError("no weights loaded yet: call update_weights first")
            self._inflight += 1
            return self._version

    def _release(self) -> None:
        with self._cv:
            self._inflight -= 1
            self._cv.notify_all()

    def _versions_now(self) -> set[int]:
        versions = {self._version}
        if self._loading and self._pending_version is not None:
            versions.add(self._pending_version)
        return versions

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Rollout]:
        """Sample one response per prompt (duplicate prompts share one prefill through the prefix cache)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs at least one prompt and no empty prompt")
        dispatch = self._admit()
        try:
            with torch.no_grad():
                return self._generate(prompts, params, dispatch)
        finally:
            self._release()

    def _prefill(self, prompts: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], _PrefixEntry]:
        """Prompt KV per distinct prompt: from the prefix cache (tokens only), else one batched prefill."""
        found: dict[tuple[int, ...], _PrefixEntry] = {}
        missing = []
        for p in dict.fromkeys(prompts):
            entry = self._prefix.get(p) if self.use_prefix_cache else None
            if entry is not None:
                found[p] = entry
                self.stats["prefix_hits"] += 1
            else:
                missing.append(p)
                self.stats["prefix_misses"] += 1
        if missing:
            width = max(len(p) for p in missing)
            ids, pos, valid = _left_pad(missing, width, self.pad_id, self.device)
            cache = self._cache(len(missing), width)
            versions = self._versions_now()
            logits = forward(self.weights, self.dims, ids, pos, valid, cache, 0)
            version = max(versions | self._versions_now())
            for i, p in enumerate(missing):
                lo = width - len(p)
                entry = _PrefixEntry(
                    version,
                    [k[i, :, lo:].clone() for k in cache.k],
                    [v[i, :, lo:].clone() for v in cache.v],
                    logits[i, -1].clone(),
                    list(self.k_scales),
                    list(self.v_scales),
                )
                found[p] = entry
                if self.use_prefix_cache:
                    with self._cv:
                        self._prefix[p] = entry
        return found

    def score(
        self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Teacher-forced: the engine's log-prob of each given response token, through the same prefill +
        incremental decode path as generation (for comparisons at fixed weights on a fixed batch)."""
        if len(prompts) != len(responses) or any(len(r) == 0 for r in responses):
            raise ValueError("score needs one non-empty response per prompt")
        params = SamplingParams(max_new_tokens=max(len(r) for r in responses))
        dispatch = self._admit()
        try:
            with torch.no_grad():
                out = self._generate(prompts, params, dispatch, forced=[list(r) for r in responses])
        finally:
            self._release()
        return [r.logprobs for r in out]

    def _cache(self, batch: int, columns: int) -> KVCache:
        return KVCache(
            self.dims,
            batch,
            columns,
            fp8=self.kv_cache == "fp8",
            k_scales=self.k_scales,
            v_scales=self.v_scales,
            device=self.device,
        )

    def _generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        dispatch: int,
        forced: list[list[int]] | None = None,
    ) -> list[Rollout]:
        keys = [tuple(int(t) for t in p) for p in prompts]
        entries = self._prefill(keys)
        b = len(keys)
        width = max(len(p) for p in keys)
        cache = self._cache(b, width + params.max_new_tokens)
        versions: list[set[int]] = [set() for _ in range(b)]
        for i, key in enumerate(keys):
            e = entries[key]
            lo = width - len(key)
            for layer in range(self.dims.num_layers):
                cache.k[layer][i, :, lo:width] = e.k[layer]
                cache.v[layer][i, :, lo:width] = e.v[layer]
            cache.valid_BC[i, lo:width] = True
            versions[i].add(e.version)
        logits = torch.stack([entries[k].last_logits for k in keys])
        dev = self.device
        positions = torch.tensor([len(k) for k in keys], device=dev)
        gen = torch.Generator(device=dev).manual_seed(params.seed)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        forced_ids = None
        if forced is not None:
            steps = params.max_new_tokens
            forced_ids = torch.tensor([[*f, *[self.eos_id] * (steps - len(f))] for f in forced], device=dev)
            forced_len = torch.tensor([len(f) for f in forced], device=dev)
        out_ids: list[list[int]] = [[] for _ in range(b)]
        out_lp: list[list[float]] = [[] for _ in range(b)]
        for step in range(params.max_new_tokens):
            logp = torch.log_softmax(logits, dim=-1)
            tokens = _sample(logits, params, gen) if forced_ids is None else forced_ids[:, step]
            # one device -> host copy per step: the tokens, their log-probs and which rows were still live
            chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
            live = (~done).tolist()
            for i, (tok, lp) in enumerate(zip(tokens.tolist(), chosen.tolist(), strict=True)):
                if live[i]:
                    out_ids[i].append(int(tok))
                    out_lp[i].append(float(lp))
            done |= tokens == self.eos_id
            if forced_ids is not None:
                done |= forced_len <= step + 1
            if bool(done.all()) or step == params.max_new_tokens - 1:
                break
            before = self._versions_now()
            feed = torch.where(done, torch.full_like(tokens, self.pad_id), tokens)
            logits = forward(
                self.weights,
                self.dims,
                feed[:, None],
                positions[:, None],
                ~done[:, None],
                cache,
                width + step,
            )[:, -1]
            used = before | self._versions_now()
            for i, finished in enumerate(done.tolist()):
                if not finished:
                    versions[i] |= used
            positions = positions + 1
            self.stats["decode_steps"] += 1
        return [
            Rollout(
                prompt_ids=list(keys[i]),
                response_ids=out_ids[i],
                logprobs=out_lp[i],
                dispatch_version=dispatch,
                weight_versions=versions[i],
                finish_reason="stop" if out_ids[i] and out_ids[i][-1] == self.eos_id else "length",
            )
            for i in range(b)
        ]


def _left_pad(
    prompts: Sequence[Sequence[int]], width: int, pad_id: int, device: Any = None
) -> tuple[torch.Tensor, ...]:
    """(ids, positions, valid) [B, width] for left-padded prompts, on ``device``."""
    b = len(prompts)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    valid = torch.zeros(b, width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        valid[i, width - len(p) :] = True
    positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
    return ids.to(device), positions.to(device), valid.to(device)


def _sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> torch.Tensor:
    """Temperature + nucleus (top-p) sampling; returns [B] token ids."""
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < params.top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)
