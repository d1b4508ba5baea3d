"""README's figures come from the commands README shows: scripts/readme_figures.py recomputes them and this
test compares (deterministic figures exactly; consistency within the script's stated tolerance; timings never).
The consistency figures run as the script's own process: it pins torch's CPU kernels before importing torch."""

from __future__ import annotations

import importlib.util
import platform
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


def _script(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "readme_figures.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


MXFP8_ROW = "mxfp8, all linear layers on the learner's grid"
# the script pins torch's AVX2 CPU kernels (README's figures were computed with them)
x86_64 = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="README's figures use torch's AVX2 CPU kernels",
)


@x86_64
def test_two_consistency_cells_reproduce_and_a_drifted_one_is_named(tmp_path: Path) -> None:
    """Two tiny-dense cells (the MXFP8 learner against the BF16 and the MXFP8 sampler: one pairing each), checked
    against a README copy whose MXFP8 cell is 4 % off: exactly that cell is named, with README's own value as
    what the command gives; the BF16 cell, unchanged, reproduces."""
    key = f"consistency:{MXFP8_ROW}|tiny-dense"
    stated = rf.readme_figures(README)[key]
    k3, ratio = rf._numbers(stated)
    drifted = f"{rf._e(k3 * 1.04)} ({ratio:.2f})"
    start, end = rf._table_span(README)
    table = README[start:end]
    assert table.count(f"| {MXFP8_ROW} | {stated} |") == 1
    altered = tmp_path / "README.md"
    altered.write_text(
        README[:start]
        + table.replace(f"| {MXFP8_ROW} | {stated} |", f"| {MXFP8_ROW} | {drifted} |")
        + README[end:]
    )
    assert rf.readme_figures(altered.read_text())[key] == drifted
    args = ["--check", "--only", "consistency", "--model", "tiny-dense", "--row", "bf16", "--row", MXFP8_ROW]
    proc = _script(*args, "--readme", str(altered), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [f"{key}: README says {drifted!r}, the command gives {stated!r}"], (
        proc.stdout + proc.stderr
    )
    assert "1 of 2 README figures reproduce" in proc.stderr


def test_figures_are_refused_where_torch_already_runs_other_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert torch.backends.cpu.get_cpu_capability()  # torch imported before the script could pin its kernels
    for name in rf.KERNEL_ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit, match="AVX2"):
        rf.compute(["consistency"], ("tiny-dense",), ("bf16",))


@pytest.mark.slow
@x86_64
def test_the_consistency_table_and_the_fault_counts_reproduce(tmp_path: Path) -> None:
    proc = _script("--check", "--only", "consistency", "--only", "faults", cwd=tmp_path, timeout=1200)
    assert proc.returncode == 0, (
        "README figures that no longer reproduce (scripts/readme_figures.py --write):\n"
        + proc.stdout
        + proc.stderr
    )
    n = len(rf.CONSISTENCY_ROWS) * len(rf.MODELS) + 3
    assert f"{n} of {n} README figures reproduce" in proc.stderr


def test_the_script_runs_as_a_command(tmp_path: Path) -> None:
    proc = _script("--check", "--only", "host-stall", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 of 5 README figures reproduce" in proc.stderr
