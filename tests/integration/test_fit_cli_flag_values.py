"""``mxperf fit`` flag values from the robustness sweep (#33): each bad value is one line naming the flag, exit
2, nothing written; ``--bootstrap 0`` gives an answer that says it has no interval (it was a traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mxperf.cli import main
from perfmodel.step.model import parse_at, parse_phase_flags
from tracing.outputs.errors import InputError

REPO = Path(__file__).resolve().parent.parent.parent
SWEEP = REPO / "examples" / "runs" / "sweep-tiny-dense"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--at", "inf,512"], "--at 'inf,512'"),  # was OverflowError: a traceback, exit 1
        (["--at", "1000.5,512"], "whole numbers"),  # was truncated to 1000 unsaid
        (["--at", "1e30,512"], "2**53"),  # was 4.1e20 tokens in the answer (int64 overflow)
        (["--mem-cap-bytes", "nan"], "--mem-cap-bytes nan"),  # was "Out of range float values ..."
        (["--mem-cap-bytes", "inf"], "--mem-cap-bytes inf"),
        (["--other-phase", "generate=nan"], "--other-phase 'generate=nan'"),  # was "cannot convert NaN"
        (["--other-phase", "generate=inf"], "--other-phase 'generate=inf'"),
        (["--bootstrap", "1"], "--bootstrap 1"),  # was "slower (95 % CI -250.1 to -250.1 % gain)"
        (["--phase="], "--phase '': empty"),  # was "no micro-batches in phase(s) "
        (["--global-batch", "100000000000000000000000"], "--global-batch"),  # was a traceback
        (["--seed", "-1"], "--seed -1"),  # was numpy's "expected non-negative integer"
        (["--bootstrap", "100000000000000000000"], "--bootstrap"),  # was "Maximum allowed dimension exceeded"
    ],
)
def test_bad_flag_value_is_one_line_exit_2_nothing_written(tmp_path: Path, capsys, flag, message) -> None:
    out = tmp_path / "fit"
    rc = main(["fit", str(SWEEP), "-o", str(out), "--bootstrap", "20", *flag])
    cap = capsys.readouterr()
    assert rc == 2
    assert cap.err.startswith("mxperf fit: error: --") and message in cap.err
    assert len(cap.err.strip().splitlines()) == 1 and cap.out == ""
    assert not out.exists()


def test_bootstrap_0_answers_without_an_interval_and_says_so(tmp_path: Path, capsys) -> None:
    rc = main(["fit", str(SWEEP), "-o", str(tmp_path / "fit"), "--bootstrap", "0"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "Traceback" not in cap.err
    assert "no interval" in cap.out.splitlines()[0]


@pytest.mark.parametrize(
    "value", ["inf,512", "nan,512", "512.5,128", "1e400,512", "1,2,x", "9007199254740993,512"]
)
def test_at_refuses_values_that_are_not_whole_token_counts(value: str) -> None:
    with pytest.raises(InputError, match="--at"):
        parse_at([value])


def test_at_takes_whole_numbers_in_float_notation() -> None:
    assert parse_at(["1e5,512.0,2e4"]) == [(100000, 512, 20000)]


def test_empty_phase_name_is_refused() -> None:
    with pytest.raises(InputError, match="empty"):
        parse_phase_flags(["  "])
