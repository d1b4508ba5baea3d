"""The phase map against every range / timer name verl, NeMo RL, Megatron and vLLM really emit (golden list in
tests/data/framework_names/names.csv, each with the repo, commit, file and line it comes from), near misses
that must stay "other", and the phase-map file format."""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path

import pytest

from tracing.analysis.phases import DEFAULT_PHASE_MAP, default_phase_map, load_phase_map
from tracing.outputs.errors import InputError
from tracing.outputs.schema import PHASES

NAMES = Path(__file__).parents[1] / "data" / "framework_names" / "names.csv"
ROWS = list(csv.DictReader(NAMES.open(newline="")))


def _why(name: str) -> str:
    pm = default_phase_map()
    i = pm.rule_for(name)
    return (
        "no rule" if i is None else f"rule {i} ({pm.frameworks[i] or 'generic'}): {pm.rules[i][0].pattern!r}"
    )


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['framework']}:{r['name']}" for r in ROWS])
def test_every_real_framework_name_maps_to_its_phase(row):
    got = default_phase_map().phase_of(row["name"])
    assert got == row["phase"], (
        f"{row['name']!r} ({row['repo']} {row['path']}:{row['line']}) -> {got}, expected {row['phase']}; "
        f"decided by {_why(row['name'])}"
    )


def test_golden_list_is_well_formed_and_covers_the_frameworks():
    assert len({r["name"] for r in ROWS}) == len(ROWS), "one row per name"
    for r in ROWS:
        assert r["phase"] in PHASES and r["repo"] and r["commit"] and r["path"] and int(r["line"]) > 0
    phases_by_fw = {fw: {r["phase"] for r in ROWS if r["framework"] == fw} for fw in ("verl", "nemo_rl")}
    for fw, phases in phases_by_fw.items():  # every RL phase is named by both frameworks
        assert {"generate", "logprob", "update", "sync", "reward"} <= phases, fw
    assert {r["framework"] for r in ROWS} == {"verl", "nemo_rl", "megatron", "vllm"}


@pytest.mark.parametrize(
    ("name", "phase"),
    [  # the names issue #11 found in "other" or in the wrong phase
        ("megatron_policy_worker/train", "update"),
        ("dtensor_policy_worker_v2/train", "update"),
        ("megatron_policy_worker/train_microbatch", "update"),
        ("dtensor_policy_worker/stream_weights_via_ipc_zmq", "sync"),
        ("vllm_internal_worker_extension/update_weights_via_ipc_zmq", "sync"),
        ("vllm_genertion_worker/update_weights_from_collective", "sync"),  # NeMo RL's spelling
        ("prepare_for_generation/transfer_and_update_weights", "sync"),  # was "generate"
        ("sync_rollout_weights", "sync"),
        ("generate_async", "generate"),
        ("compute_rm_score", "reward"),
        # a CamelCase class qualifier (as some wrappers print methods) keeps the phase
        ("ActorRolloutRefWorker.update_actor", "update"),
        ("FSDPEngine::train_batch", "update"),
    ],
)
def test_names_that_used_to_be_other_or_wrong(name, phase):
    assert default_phase_map().phase_of(name) == phase


@pytest.mark.parametrize(
    "name",
    [
        "recmetrics_update",  # anchored: a phase word inside another word is not the phase
        "## forward ##",
        "Optimizer.step#AdamW.step",
        "ProfilerStep#3",
        "ncclDevKernel_AllReduce",
        "aten::log_softmax",
        "dump_rollout_generations",
        "rl/sync-rollout-state",  # Megatron RL moves rollout data, not weights
        "rl/forward-pass",  # inside rl/get-logprobs
        "megatron.core.pipeline_parallel.schedules.forward_backward_no_pipelining",
        "megatron.core.rl.update",  # a lowercase module path is not a class qualifier
        "decode",  # Megatron's inference step names are matched with their case (Prefill / Decode)
        "idle/refit_bubble",  # NeMo RL async GRPO idle time
        "micro_batch3",  # verl engine micro-batch: inside logprob and update alike
        "capture_512_FULL",  # vLLM CUDA-graph capture at start-up
        "aten::mm, seq = 3, op_id = 9, sizes = [[4, 8], [8, 2]]",  # emit_nvtx op range
    ],
)
def test_near_misses_stay_other(name):
    assert default_phase_map().phase_of(name) == "other", _why(name)


def test_map_sources_are_the_commits_the_golden_names_were_read_at():
    doc = tomllib.loads(DEFAULT_PHASE_MAP.read_text())
    sources = {(s["repo"], s["commit"]) for s in doc["source"]}
    assert {(r["repo"], r["commit"]) for r in ROWS} <= sources
    pm = default_phase_map()
    assert len(pm.sources) == len(doc["source"]) and len(pm.frameworks) == len(pm.rules)


def test_user_map_with_framework_and_note_is_read(tmp_path):
    p = tmp_path / "map.toml"
    p.write_text(
        "[[source]]\nrepo = 'me/rl'\ncommit = 'abc'\n\n"
        "[[rule]]\nframework = 'mine'\npattern = '^rollout_phase$'\nphase = 'generate'\nnote = 'why'\n"
    )
    pm = load_phase_map(p)
    assert pm.phase_of("rollout_phase") == "generate" and pm.phase_of("gen") == "other"
    assert pm.frameworks == ("mine",) and pm.sources == ((("repo", "me/rl"), ("commit", "abc")),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[rule]]\npattern = 'x'\nphase = 'update'\nphsae = 'sync'\n", r"rule 0 has unknown key\(s\) phsae"),
        ("[[rule]]\npattern = 'x'\nphase = 'train'\n", r"rule 0 needs a string 'pattern' and a 'phase'"),
        ("[[rule]]\npattern = '('\nphase = 'update'\n", r"rule 0 pattern '\(' is not a regular expression"),
        ("rule = [1]\n", r"rule 0 is not a table"),
        ("[[rule]\n", r"not valid TOML"),
    ],
)
def test_bad_phase_map_is_one_line_naming_the_file(tmp_path, text, message):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(InputError, match=rf"bad\.toml: .*{message}"):
        load_phase_map(p)
