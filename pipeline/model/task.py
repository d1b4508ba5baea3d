"""A synthetic task with a verifiable reward: multi-digit addition, generated from a seed.

A problem is a prompt ``"123+45="`` and its answer ``"168"``. The policy must write the digits of the sum
and then the end-of-sequence token. The reward is checked, not learned:

    reward = 1.0                                   exact answer
           = 0.5 * (matching digits / answer len)  otherwise (digits compared right-aligned, like a
                                                   schoolbook sum), 0 for a response with no digits

The partial credit gives GRPO a signal (groups with different rewards) from a weak warm-started policy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str


@dataclass(frozen=True)
class AdditionTask:
    """Sums of two numbers with ``min_digits``..``max_digits`` digits each."""

    min_digits: int = 1
    max_digits: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits <= 12:
            raise ValueError(
                f"need 1 <= min_digits <= max_digits <= 12, got {self.min_digits}, {self.max_digits}"
            )

    @property
    def max_answer_chars(self) -> int:
        return self.max_digits + 1

    def _number(self, rng: random.Random) -> int:
        digits = rng.randint(self.min_digits, self.max_digits)
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)

    def problems(self, n: int, seed: int) -> list[Problem]:
        """``n`` problems, identical for identical (task, n, seed)."""
        rng = random.Random(seed)
        out = []
        for _ in range(n):
            a, b = self._number(rng), self._number(rng)
            out.append(Problem(f"{a}+{b}=", str(a + b)))
        return out

    def corpus(self, n: int, seed: int) -> list[str]:
        """Solved problems as text lines (tokenizer training and warm-start data)."""
        return [p.prompt + p.answer for p in self.problems(n, seed)]

    @staticmethod
    def reward(problem: Problem, response: str) -> float:
        """The verifiable reward of ``response`` (text before the end-of-sequence token)."""
        text = response.strip()
        if text == problem.answer:
            return 1.0
        digits = "".join(ch for ch in text if ch.isdigit())
        if not digits:
            return 0.0
        matches = sum(a == b for a, b in zip(reversed(digits), reversed(problem.answer), strict=False))
        return 0.5 * matches / max(len(problem.answer), len(digits))
