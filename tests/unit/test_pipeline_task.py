"""Task, reward and tokenizer."""

from __future__ import annotations

import pytest

from pipeline.model.task import AdditionTask, Problem
from pipeline.model.tokenizer import load_tokenizer, train_tokenizer


def test_reward_is_one_for_exact_partial_for_some_digits_zero_without_digits():
    p = Problem("12+34=", "46")
    assert AdditionTask.reward(p, "46") == 1.0
    assert AdditionTask.reward(p, "16") == pytest.approx(0.25)
    assert AdditionTask.reward(p, "x") == 0.0
    assert AdditionTask.reward(p, "") == 0.0


def test_problems_are_reproducible_and_correct():
    task = AdditionTask(1, 3)
    a, b = task.problems(20, seed=5), task.problems(20, seed=5)
    assert a == b and a != task.problems(20, seed=6)
    for p in a:
        x, y = p.prompt[:-1].split("+")
        assert int(x) + int(y) == int(p.answer)


def test_tokenizer_splits_digits_and_round_trips(tmp_path):
    tok = train_tokenizer(AdditionTask().corpus(500, 0))
    ids = tok.encode("123+45=")
    assert len(ids) == 7  # one token per digit and per symbol
    assert tok.decode([*ids, tok.eos_id, ids[0]]) == "123+45="
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again.encode("987+6=") == tok.encode("987+6=")
    assert (again.pad_id, again.eos_id) == (0, 1)


def test_bad_task_range_is_rejected():
    with pytest.raises(ValueError, match="min_digits"):
        AdditionTask(3, 2)
