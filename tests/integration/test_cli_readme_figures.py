"""README's figures come from the commands README shows: scripts/readme_figures.py recomputes them and this
test compares (deterministic figures exactly; consistency within the script's stated tolerance; timings never)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

_spec = importlib.util.spec_from_file_location("readme_figures", REPO_ROOT / "scripts" / "readme_figures.py")
assert _spec is not None and _spec.loader is not None
rf = importlib.util.module_from_spec(_spec)
sys.modules["readme_figures"] = rf  # dataclasses look their module up there
_spec.loader.exec_module(rf)
README = (REPO_ROOT / "README.md").read_text()


def test_readme_states_every_figure_the_script_recomputes() -> None:
    stated = rf.readme_figures(README)
    assert len([k for k in stated if k.startswith("host-stall:")]) == 5
    assert len([k for k in stated if k.startswith("faults:")]) == 3
    assert len([k for k in stated if k.startswith("consistency:")]) == len(rf.CONSISTENCY_ROWS) * len(
        rf.MODELS
    )


def test_the_host_stall_figures_reproduce_exactly() -> None:
    stated = rf.readme_figures(README)
    for f in rf.host_stall_figures():
        assert stated[f.key] == f.value, (
            f"README says {stated[f.key]}, `mxperf ingest` gives {f.value} ({f.key})"
        )


def test_rewrite_changes_exactly_the_figures_that_differ() -> None:
    stated = rf.readme_figures(README)
    same = [rf.Figure(k, v) for k, v in stated.items()]
    assert rf.rewrite(README, same) == README
    changed = {
        "host-stall:a100_busy": "99.9",
        "faults:caught": "7",
        "consistency:bf16|tiny-moe": "1.23e-4 (1.00)",
    }
    new = rf.rewrite(README, [rf.Figure(k, changed.get(k, v)) for k, v in stated.items()])
    assert rf.readme_figures(new) == {**stated, **changed}
    assert len(new.splitlines()) == len(README.splitlines())


@pytest.mark.parametrize(
    ("key", "readme", "computed", "differs"),
    [
        ("host-stall:a100_busy", "23.8", "23.8", False),
        ("host-stall:a100_busy", "23.8", "23.9", True),
        ("consistency:bf16|tiny-dense", "4.98e-4 (1.00)", "5.00e-4 (1.00)", False),  # 0.4 %: within 2 %
        ("consistency:bf16|tiny-dense", "4.98e-4 (1.00)", "4.57e-4 (1.00)", True),  # 9 %
        ("consistency:mxfp8-floor (another MX grid)|tiny-dense", "4.61e-4 (0.93)", "4.62e-4 (1.08)", True),
        ("consistency:BF16 learner + BF16 sampler|tiny-dense", "5.66e-6", "5.30e-6", True),
        ("faults:caught", "10", "10", False),
        ("faults:caught", None, "10", True),
    ],
)
def test_tolerances(key: str, readme: str | None, computed: str, differs: bool) -> None:
    assert rf.differs(key, readme, computed) is differs


@pytest.mark.slow
def test_the_consistency_table_and_the_fault_counts_reproduce() -> None:
    stated = rf.readme_figures(README)
    bad = [
        f"{f.key}: README {stated.get(f.key)!r} vs {f.value!r}"
        for f in rf.compute(["consistency", "faults"])
        if rf.differs(f.key, stated.get(f.key), f.value)
    ]
    assert not bad, (
        "README figures that no longer reproduce (scripts/readme_figures.py --write):\n" + "\n".join(bad)
    )


def test_the_script_runs_as_a_command(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "readme_figures.py"), "--check", "--only", "host-stall"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 of 5 README figures reproduce" in proc.stderr
