"""The labelled-trace path on a real trace: ``mxperf ingest --label`` then ``mxperf fit``.

The real trace (HTA's A100 DDP capture, tests/data/real) is one job at one micro-batch size. The label's
precision is required by the micro-batch schema; the fit must then say plainly what one trace cannot give.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mxperf.cli import main
from perfmodel.inputs.load import load_inputs

TRACE = Path(__file__).resolve().parent.parent / "data" / "real" / "hta_a100_ddp_rank0_hostbound.json.gz"


@pytest.fixture(scope="module")
def labelled_ingest(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ingest") / "a100"
    rc = main(
        [
            "ingest",
            str(TRACE),
            "-o",
            str(out),
            "--label",
            "model=cnn-a100,precision=bf16,tokens_per_microbatch=1024",
        ]
    )
    assert rc == 0
    return out


def test_one_labelled_trace_gives_micro_batches_with_host_stall(labelled_ingest: Path) -> None:
    inputs = load_inputs([labelled_ingest])
    mb = inputs.microbatches
    assert len(mb) == 3  # one forward/backward in each of ProfilerStep#4..6, found from the trace
    assert (mb["source"] == "detected").all()
    assert mb["host_stall_seconds"].notna().all()
    # The capture is host-bound (README: busy 23.8 % of the span): stall is most of each step.
    assert ((mb["host_stall_seconds"] / mb["seconds"]) > 0.5).all()
    (summary,) = inputs.summaries
    assert "host stall" in summary.gives
    assert "breakeven alone" in summary.cannot_give
    assert summary.machine.startswith("traced on NVIDIA A100-PG509-200 (ingested on ")  # not this CPU box


def test_fit_on_one_labelled_trace_says_what_is_missing(
    labelled_ingest: Path, tmp_path: Path, capsys
) -> None:
    rc = main(["fit", str(labelled_ingest), "-o", str(tmp_path / "fit")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "only one precision" in err
    assert "one labelled trace is one size" in err
    assert not (tmp_path / "fit").exists()
