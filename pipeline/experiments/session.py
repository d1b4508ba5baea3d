"""Everything one RL run needs, built from a :class:`RunConfig`: task, tokenizer, (warm-started) model,
learner, sampler, the range log, and the fixed evaluation batch.

``RunConfig`` validates itself (unknown ids, budget, grid fraction, context) and raises ``InputError`` with
the fix, so the CLI fails in one line before any work starts.

Step shapes. A range (``max_new_tokens_low``..``max_new_tokens``, ``max_digits_low``..``max_digits``) makes
each step draw its cap on new tokens, or the most digits of its numbers, uniformly from the range; a draw
depends only on (what, seed, step), so a rerun, async mode's look-ahead and every engine see the same shapes.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

from pipeline.experiments.settings import ExperimentSettings, at_least, one_of, positive
from pipeline.interfaces import SamplingParams
from pipeline.learner.engine import LEARNER_PRECISIONS
from pipeline.learner.grpo import GRPOConfig
from pipeline.model.presets import ModelPreset, build_config, get_preset
from pipeline.model.pretrain import PretrainConfig, warm_start
from pipeline.model.task import AdditionTask, Problem
from pipeline.model.tokenizer import TaskTokenizer, train_tokenizer
from pipeline.sampler.layout import SAMPLER_MODES
from tracing.capture.ranges import RangeLog
from tracing.outputs.errors import InputError

TOKENIZER_SEED = 12345  # the tokenizer depends on the task only, never on the run seed
TOKENIZER_CORPUS = 4000


@dataclass(frozen=True)
class RunConfig(ExperimentSettings):
    learner: str = "bf16"
    sampler: str = "bf16"
    grid_fraction: float = 1.0
    kv_cache: str = "bf16"
    steps: int = 3
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    max_new_tokens: int = 5  # the cap on new tokens (the top of the range when max_new_tokens_low is set)
    max_new_tokens_low: int | None = None  # set: each step draws its cap from low..max_new_tokens
    temperature: float = 1.0
    top_p: float = 1.0
    tokens_per_microbatch: int = 128
    lr: float = 3e-5
    tis_cap: float | None = 2.0
    min_digits: int = 1
    max_digits: int = 2
    max_digits_low: int | None = None  # set: each step draws its numbers' most digits from low..max_digits
    eval_prompts: int = 16
    async_mode: bool = False
    sampler_engine: str = "native"  # native | vllm (pipeline.engines.factory)
    learner_engine: str = "native"  # native | megatron

    def __post_init__(self) -> None:
        from pipeline.engines.factory import LEARNER_ENGINES, SAMPLER_ENGINES

        super().__post_init__()
        one_of("sampler_engine", self.sampler_engine, SAMPLER_ENGINES)
        one_of("learner_engine", self.learner_engine, LEARNER_ENGINES)
        one_of("learner", self.learner, LEARNER_PRECISIONS)
        self.check_gemm((self.learner,))
        one_of("sampler", self.sampler, SAMPLER_MODES)
        one_of("kv_cache", self.kv_cache, ("bf16", "fp8"))
        if not 0.0 <= self.grid_fraction <= 1.0:
            raise InputError(f"--grid-fraction must be in [0, 1], got {self.grid_fraction}")
        at_least(1, steps=self.steps, prompts_per_step=self.prompts_per_step)
        at_least(1, max_new_tokens=self.max_new_tokens, eval_prompts=self.eval_prompts)
        at_least(1, min_digits=self.min_digits, max_digits=self.max_digits)
        if self.samples_per_prompt < 2:
            raise InputError(
                f"--samples-per-prompt must be >= 2, got {self.samples_per_prompt}: GRPO normalises rewards "
                "within each prompt's group, so a group of one has zero advantage and the update does nothing"
            )
        positive(lr=self.lr, temperature=self.temperature)
        try:
            GRPOConfig(lr=self.lr, tis_cap=self.tis_cap)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.min_digits > self.max_digits:
            raise InputError(f"--min-digits {self.min_digits} is above --max-digits {self.max_digits}")
        self._check_ranges()
        longest = self.max_sequence_tokens
        if self.tokens_per_microbatch < longest:
            raise InputError(
                f"--tokens-per-microbatch {self.tokens_per_microbatch} is smaller than one sequence "
                f"(up to {longest} tokens: prompt + {self.max_new_tokens} new); use at least {longest}"
            )

    def _check_ranges(self) -> None:
        """Step-shape ranges, the task's digit limit and the model's context (InputError naming the flag)."""
        for name, low, high in (
            ("max_new_tokens", self.max_new_tokens_low, self.max_new_tokens),
            ("max_digits", self.max_digits_low, self.max_digits),
        ):
            if low is not None:
                at_least(1, **{name: low})
                if low > high:
                    raise InputError(f"--{name.replace('_', '-')} {low}:{high}: LO {low} is above HI {high}")
        if self.max_digits_low is not None and self.max_digits_low < self.min_digits:
            raise InputError(
                f"--max-digits {self.max_digits_low}:{self.max_digits}: "
                f"LO is below --min-digits {self.min_digits}"
            )
        try:
            AdditionTask(self.min_digits, self.max_digits)
        except ValueError as exc:
            raise InputError(
                f"--max-digits {self.max_digits}: the task allows 1..12 digits ({exc})"
            ) from None
        context = int(get_preset(self.model).config_kwargs.get("max_position_embeddings", 0))
        prompt = self.max_sequence_tokens - self.max_new_tokens
        if context and self.max_sequence_tokens > context:
            raise InputError(
                f"--max-new-tokens {self.max_new_tokens}: a prompt of up to {prompt} tokens plus "
                f"{self.max_new_tokens} new ones is longer than {self.model}'s context of {context} "
                f"positions; use at most {context - prompt}"
            )

    @property
    def task(self) -> AdditionTask:
        """The task the tokenizer, the warm start and the evaluation batch cover (every step's digits)."""
        return AdditionTask(self.min_digits, self.max_digits)

    def step_max_new_tokens(self, step: int) -> int:
        """The cap on new tokens of ``step`` (drawn when a range is set)."""
        low = self.max_new_tokens if self.max_new_tokens_low is None else self.max_new_tokens_low
        return draw_step_value("max_new_tokens", self.seed, step, low, self.max_new_tokens)

    def step_max_digits(self, step: int) -> int:
        """The most digits of ``step``'s numbers (drawn when a range is set)."""
        low = self.max_digits if self.max_digits_low is None else self.max_digits_low
        return draw_step_value("max_digits", self.seed, step, low, self.max_digits)

    def step_shapes(self) -> dict[str, Any]:
        """What the manifest records: per shape its range and the value each step drew."""
        return {
            "max_new_tokens": {
                "range": [self.max_new_tokens_low or self.max_new_tokens, self.max_new_tokens],
                "drawn": [self.step_max_new_tokens(t) for t in range(self.steps)],
            },
            "max_digits": {
                "range": [self.max_digits_low or self.max_digits, self.max_digits],
                "drawn": [self.step_max_digits(t) for t in range(self.steps)],
            },
        }

    @property
    def max_sequence_tokens(self) -> int:
        """Upper bound of prompt + response tokens (digits are one token each: see pipeline.model.tokenizer)."""
        return 2 * self.max_digits + 2 + self.max_new_tokens


def draw_step_value(what: str, seed: int, step: int, low: int, high: int) -> int:
    """A uniform draw from ``low..high`` fixed by (what, seed, step) alone (``low`` when they are equal)."""
    if low == high:
        return low
    return random.Random(f"mxperf/{what}/{seed}/{step}").randint(low, high)


def build_tokenizer(task: AdditionTask) -> TaskTokenizer:
    return train_tokenizer(task.corpus(TOKENIZER_CORPUS, TOKENIZER_SEED))


class Session:
    """The objects of one run (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        ranges: RangeLog | None = None,
        progress: Any = None,
        sampler_profile_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """``sampler_profile_dir``: where a sampler in its own process (vLLM) writes its profiler traces, when
        the run is traced (an in-process sampler is in the run's own trace)."""
        from pipeline.engines.factory import make_learner_backend, make_sampler_engine

        self.cfg = cfg
        self.preset: ModelPreset = get_preset(cfg.model)
        self.task = cfg.task
        self.tokenizer = build_tokenizer(self.task)
        self.pad_id = self.tokenizer.pad_id
        self.ranges = ranges or RangeLog()
        device = cfg.torch_device
        model, self.warm_start_meta = warm_start(
            self.preset,
            self.task,
            self.tokenizer,
            PretrainConfig(steps=cfg.pretrain_steps, seed=cfg.seed),
            progress=progress,
            device=device,
        )
        self.learner = make_learner_backend(
            cfg.learner_engine,
            model=model,
            preset=self.preset,
            precision=cfg.learner,
            config=GRPOConfig(lr=cfg.lr, tis_cap=cfg.tis_cap),
            ranges=self.ranges,
            **cfg.learner_options(),
        )
        self.eval_problems = self.task.problems(cfg.eval_prompts, seed=10_000_019 + cfg.seed)
        engine_options: dict[str, Any] = {
            "grid_fraction": cfg.grid_fraction,
            "kv_cache": cfg.kv_cache,
            "calibration_prompts": [self.tokenizer.encode(p.prompt) for p in self.eval_problems],
            "device": device,
        }
        if cfg.sampler_engine == "vllm":
            engine_options.update(initial_weights=model.state_dict(), seed=cfg.seed)
            if sampler_profile_dir is not None:
                engine_options["profile_dir"] = sampler_profile_dir
        self.sampler = make_sampler_engine(
            cfg.sampler_engine,
            config=build_config(self.preset),
            mode=cfg.sampler,
            eos_id=self.tokenizer.eos_id,
            pad_id=self.pad_id,
            **engine_options,
        )

    def engine_info(self) -> dict[str, Any]:
        """What the manifest records about the engines: where each runs (``learner_device`` /
        ``sampler_device``), the learner's GEMM backend, vLLM's weight-only grid on CPU."""
        from pipeline.device import device_label

        info: dict[str, Any] = {
            "sampler_engine": self.cfg.sampler_engine,
            "learner_engine": self.cfg.learner_engine,
            "learner_device": device_label(self.learner.device),
            "sampler_device": device_label(getattr(self.sampler, "device", "cpu")),
        }
        describe = getattr(self.learner, "describe", None)
        if callable(describe):
            info["learner"] = describe()
        manifest_info = getattr(self.sampler, "manifest_info", None)
        if callable(manifest_info):
            info["sampler"] = manifest_info()
        return info

    def step_prompts(self, step: int) -> tuple[list[Problem], list[list[int]]]:
        """The step's problems, each repeated ``samples_per_prompt`` times (contiguous GRPO groups); with a
        digit range, its numbers have ``min_digits`` up to the step's drawn digits."""
        n = self.cfg.samples_per_prompt
        task = self.task
        if self.cfg.max_digits_low is not None:
            task = AdditionTask(self.cfg.min_digits, self.cfg.step_max_digits(step))
        base = task.problems(self.cfg.prompts_per_step, seed=self.cfg.seed * 1_000_003 + step)
        problems = [p for p in base for _ in range(n)]
        return problems, [self.tokenizer.encode(p.prompt) for p in problems]

    def sampling_params(self, step: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.cfg.step_max_new_tokens(step),
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            seed=self.cfg.seed * 7919 + step,
        )
