"""The store interface the invariant checker reads, for a vLLM engine: layout + load record.

``pipeline.sync.invariants.check_sync`` reads ``engine.weights`` (a ``SamplerWeights`` for mxperf's own sampler):
its config, mode and grid fraction (to build the expected sampler tensors), and ``load_record()`` (which
destination rows the last load wrote, and with which version: I2 coverage and I7 atomicity).

For vLLM, the live tensors come from the engine itself (``VllmSampler.read_back``: the kernels' weights), and
the load record is rebuilt from what the **worker** reports it received and passed to ``reload_weights`` (the
names, returned by the worker extension): each received HF name marks the destination rows vLLM's
``stacked_params_mapping`` routes it to, with the load's version. A tensor left out of the push therefore
leaves rows unwritten (I2 fails, whatever vLLM then does with the stale rows); a name vLLM cannot route is
``unmapped``. vLLM's post-load processing (CPU repacking) runs once inside each ``reload_weights``.

``mode`` here is the mode the checker compares against: ``bf16`` (vLLM computes in BF16 on CPU). In the
weight-only-grid mode the BF16 values must equal the learner's dequantized MXFP8 bytes instead of its BF16
weights; ``pipeline.engines.vllm.checks.check_sync_vllm`` replaces I1 with that comparison (and
``make_vllm_weight_sync`` makes an MXFP8 learner send its bytes).
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.sampler.weights import LoadRecord, row_index, sampler_layout


class VllmWeightsView:
    """``engine.weights`` for a ``VllmSampler``: layout of vLLM's Qwen3 and the record of the last load."""

    def __init__(self, config: Any, engine: Any) -> None:
        self.config = config
        self.mode = "bf16"
        self.grid_fraction = 1.0
        self.layout = sampler_layout(config, "bf16", 1.0)
        self.dests = self.layout.dests
        self.routes = self.layout.pieces_by_source()
        self._engine = engine
        self._record = LoadRecord(-1, {}, {}, {})

    def record_load(self, version: int, received: list[str]) -> LoadRecord:
        """Rebuild the load record from the names the worker received in the load of ``version``."""
        rec = self._record.next_load(version, self.dests.values(), scales=False)
        rec.post_process_calls = 1  # vLLM's post-load processing runs inside reload_weights
        for name in received:
            pieces = self.routes.get(name)
            if pieces is None:
                if name not in self.layout.ignored:
                    rec.unmapped.append(name)
                continue
            for p in pieces:
                idx = row_index(p)
                rec.writes[p.dest][idx] += 1
                rec.row_versions[p.dest][idx] = version
        self._record = rec
        return rec

    def load_record(self) -> LoadRecord:
        return self._record

    def read_back(self) -> dict[str, torch.Tensor]:
        return self._engine.read_back()
