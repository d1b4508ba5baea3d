"""``mxperf run`` step shapes: ``--max-new-tokens LO:HI`` and ``--max-digits LO:HI``, drawn per step from
the seed.

Real torch, tiny-dense from a random init (``pretrain_steps=0``), a few steps each.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from mxperf.cli import main
from pipeline.experiments.loop import RLLoop
from pipeline.experiments.run import execute_run
from pipeline.experiments.session import RunConfig
from tracing.outputs import store
from tracing.outputs.manifest import read_manifest

SMALL: dict[str, Any] = {
    "steps": 6,
    "prompts_per_step": 2,
    "samples_per_prompt": 2,
    "tokens_per_microbatch": 64,
    "eval_prompts": 2,
}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MXPERF_CACHE", str(tmp_path / "cache"))  # never write the user's ~/.cache


def _recording(seen: list[tuple[int, list[Any]]]) -> Any:
    """A loop factory whose sampler records (cap, rollouts) of every generation it serves."""

    def factory(session: Any, **kw: Any) -> RLLoop:
        generate = session.sampler.generate

        def record(prompts: Any, params: Any) -> Any:
            out = generate(prompts, params)
            seen.append((params.max_new_tokens, out))
            return out

        session.sampler.generate = record
        return RLLoop(session, **kw)

    return factory


def _run(tmp_path: Any, name: str, **cfg: Any) -> tuple[Any, dict[str, Any], list[tuple[int, list[Any]]]]:
    seen: list[tuple[int, list[Any]]] = []
    out = tmp_path / name
    execute_run(RunConfig(**{**SMALL, **cfg}), out, check_sync="first", loop_factory=_recording(seen))
    return store.read_table(out / store.METRICS), read_manifest(out), seen


def test_the_draw_depends_on_the_seed_alone_and_stays_in_the_range() -> None:
    def draws(seed: int) -> list[int]:
        cfg = RunConfig(steps=40, seed=seed, max_new_tokens=24, max_new_tokens_low=2)
        return cfg.step_shapes()["max_new_tokens"]["drawn"]

    assert draws(3) == draws(3) and draws(3) != draws(4)
    assert all(2 <= d <= 24 for d in draws(3)) and len(set(draws(3))) > 5
    fixed = RunConfig(steps=4, max_new_tokens=7).step_shapes()
    assert fixed["max_new_tokens"] == {"range": [7, 7], "drawn": [7, 7, 7, 7]}


@pytest.mark.parametrize("async_mode", [False, True])
def test_each_step_records_its_drawn_cap_and_the_tokens_it_generated(tmp_path, async_mode: bool) -> None:
    metrics, manifest, seen = _run(
        tmp_path, "r", max_new_tokens=12, max_new_tokens_low=1, async_mode=async_mode
    )
    drawn = manifest["step_shapes"]["max_new_tokens"]["drawn"]
    assert manifest["config"]["max_new_tokens_low"] == 1 and manifest["config"]["max_new_tokens"] == 12
    assert metrics["max_new_tokens"].tolist() == drawn and len(set(drawn)) > 1
    served = seen[: len(drawn)]  # async mode also submits the step after the last
    assert [cap for cap, _ in served] == drawn
    for (cap, rollouts), (_, row) in zip(served, metrics.iterrows(), strict=True):
        assert row["response_tokens"] == sum(len(r.response_ids) for r in rollouts)
        assert row["prompt_tokens"] == sum(len(r.prompt_ids) for r in rollouts)
        assert row["longest_response_tokens"] == max(len(r.response_ids) for r in rollouts) <= cap
    assert metrics["response_tokens"].nunique() > 1


def test_a_rerun_with_the_same_seed_draws_and_generates_the_same_shapes(tmp_path) -> None:
    cols = ["max_new_tokens", "prompt_tokens", "response_tokens"]
    first, _, _ = _run(tmp_path, "a", seed=5, max_new_tokens=10, max_new_tokens_low=2)
    again, _, _ = _run(tmp_path, "b", seed=5, max_new_tokens=10, max_new_tokens_low=2)
    other, _, _ = _run(tmp_path, "c", seed=6, max_new_tokens=10, max_new_tokens_low=2)
    assert first[cols].equals(again[cols])
    assert first["max_new_tokens"].tolist() != other["max_new_tokens"].tolist()


def test_a_digit_range_varies_the_prompts_by_step(tmp_path) -> None:
    metrics, manifest, seen = _run(tmp_path, "r", max_digits=5, max_digits_low=1, max_new_tokens=3)
    shapes = manifest["step_shapes"]["max_digits"]
    assert shapes["range"] == [1, 5] and len(set(shapes["drawn"])) > 1
    for digits, (_, rollouts), tokens in zip(shapes["drawn"], seen, metrics["prompt_tokens"], strict=True):
        assert all(len(r.prompt_ids) <= 2 * digits + 2 for r in rollouts)  # digits are one token each
        assert tokens == sum(len(r.prompt_ids) for r in rollouts)
    assert metrics["prompt_tokens"].nunique() > 1


@pytest.mark.parametrize(
    ("argv", "pattern"),
    [
        (["--max-new-tokens", "24:2"], r"--max-new-tokens 24:2: LO 24 is above HI 2"),
        (["--max-new-tokens", "0:4"], r"--max-new-tokens must be N or LO:HI \(integers >= 1\), got '0:4'"),
        (["--max-new-tokens", "0"], r"--max-new-tokens must be N or LO:HI"),
        (["--max-new-tokens", "many"], r"--max-new-tokens must be N or LO:HI"),
        (["--max-new-tokens", "2:"], r"--max-new-tokens must be N or LO:HI"),
        (["--max-new-tokens", "1:2:3"], r"--max-new-tokens must be N or LO:HI"),
        (["--max-new-tokens", "2:600"], r"--max-new-tokens 600: .* longer than tiny-dense's context of 512"),
        (["--max-digits", "3:1"], r"--max-digits 3:1: LO 3 is above HI 1"),
        (["--max-digits", "x"], r"--max-digits must be N or LO:HI"),
        (["--max-digits", "13"], r"--max-digits 13: the task allows 1..12 digits"),
    ],
)
def test_bad_shape_values_are_one_line_naming_the_flag(tmp_path, capsys, argv, pattern) -> None:
    out = tmp_path / "r"
    rc = main(["run", "--pretrain-steps", "0", "--steps", "1", *argv, "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("mxperf run: error: "), err
    assert re.search(pattern, err[0]), err[0]
    assert not out.exists()


def test_help_documents_the_ranges(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "LO:HI to draw each step's cap uniformly from LO..HI with --seed" in text
    assert "--max-digits MAX_DIGITS" in text and "prompt lengths vary by step" in text
