"""``mxperf ingest`` of verl metric logs with real runs' quirks, then ``mxperf fit`` (#33 robustness sweep):
what the step answer cannot know is said, not given as a confident number."""

from __future__ import annotations

import json
from pathlib import Path

from mxperf.cli import main
from tracing.outputs import store

REPO = Path(__file__).resolve().parent.parent.parent
SWEEP = REPO / "examples" / "runs" / "sweep-tiny-dense"
GEN = {"bf16": 12.0, "mxfp8": 9.5}


def _ingest(tmp: Path, prec: str, steps: range) -> str:
    lines = [
        json.dumps(
            {
                "step": s,
                "data": {
                    "timing_s/gen": GEN[prec] + 0.1 * s,
                    "timing_s/old_log_prob": 3.0,
                    "timing_s/update_actor": 7.0,
                    "timing_s/step": GEN[prec] + 0.1 * s + 10.5,
                },
            }
        )
        for s in steps
    ]
    log = tmp / f"{prec}.jsonl"
    log.write_text("\n".join(lines) + "\n")
    out = tmp / f"ingest-{prec}"
    assert main(["ingest", str(log), "-o", str(out), "--label", f"model=tiny-dense,precision={prec}"]) == 0
    return str(out)


def _notes(tmp: Path, steps: range) -> tuple[list[str], str]:
    tmp.mkdir(parents=True)
    ingests = [_ingest(tmp, p, steps) for p in GEN]
    out = tmp / "fit"
    assert main(["fit", str(SWEEP), *ingests, "-o", str(out), "--bootstrap", "20", "--json"]) == 0
    return json.loads((out / store.FITS).read_text())["notes"], (out / store.REPORT).read_text()


def test_phases_from_one_logged_step_say_their_spread_is_unknown(tmp_path: Path, capsys) -> None:
    notes, report = _notes(tmp_path / "one", range(1, 2))
    capsys.readouterr()
    for prec in GEN:
        (note,) = [n for n in notes if n.startswith(f"tiny-dense {prec}: ") and "one step only" in n]
        assert "generate" in note and "spread is unknown" in note
    assert "measured in one step only" in report
    notes, _ = _notes(tmp_path / "many", range(1, 6))
    assert not [n for n in notes if "one step only" in n]
