"""`mxperf ingest` / `ranges` import no pandas (issue #31 item 5): it is ~0.4-0.7 s of a 1 MB trace's whole
ingest. Each command runs in its own process under ``python -X importtime``, which names every module the
process imports (or tries to); none may mention pandas. The tables they write are unchanged (the golden
references hold), and a process that imports pandas before or after an ingest still gets its frames."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import golden
import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
A100 = DATA / "real" / "hta_a100_ddp_rank0_hostbound.json.gz"
NSYS = DATA / "real" / "nsysai_h100x2_mfu_before.sqlite"
RANKS = DATA / "real" / "hta_sampled_2rank"
RUN = REPO / "examples" / "runs" / "run-tiny-dense-bf16"  # an mxperf run folder: its range log
METRIC_LOG = DATA / "metric_logs" / "verl_grpo_bf16.jsonl"
NEMO_LOG = DATA / "metric_logs" / "nemo_rl_grpo_metrics.json"
MODULE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$")


def _mxperf(*argv: str, check: bool = True) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """``mxperf ARGV`` under ``-X importtime``: the modules it imported (or tried to), and the process."""
    code = "import sys; from mxperf.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *argv], capture_output=True, text=True, cwd=REPO
    )
    lines = proc.stderr.splitlines()
    modules = [m.group(1) for line in lines if (m := MODULE.match(line))]
    if check:
        shown = "\n".join(line for line in lines if not MODULE.match(line))
        assert proc.returncode == 0, f"mxperf {' '.join(argv)} exited {proc.returncode}:\n{shown}"
        assert len(modules) > 50  # importtime did report (the check below can fail)
    return modules, proc


def _pandas(modules: list[str]) -> list[str]:
    return [m for m in modules if "pandas" in m.lower()]  # as `grep -i pandas` would find them


@pytest.mark.parametrize(
    "inputs",
    [
        pytest.param([A100], id="kineto"),
        pytest.param([NSYS], id="nsys"),
        pytest.param([RANKS], id="folder-of-ranks"),
        pytest.param([RUN], id="run-folder-range-log"),
        pytest.param([METRIC_LOG, NEMO_LOG], id="metric-logs"),
    ],
)
def test_ingest_imports_no_pandas(inputs, tmp_path):
    out = tmp_path / "out"
    modules, _ = _mxperf("ingest", *map(str, inputs), "-o", str(out), "--json")
    assert _pandas(modules) == []
    if NSYS not in inputs:  # (ADBC's SQLite driver imports pyarrow.dataset, which imports it)
        # its wrappers cost ~30 ms; tracing calls the kernels directly
        assert "pyarrow.compute" not in modules
    assert (out / "manifest.json").is_file() and any(out.glob("*.parquet"))


def test_a_pool_of_workers_and_mxperf_ranges_import_no_pandas(tmp_path):
    out = tmp_path / "out"
    modules, _ = _mxperf("ingest", str(RANKS), "-o", str(out), "--workers", "2")
    assert _pandas(modules) == []
    assert (out / "stragglers.parquet").is_file()  # the cross-rank tables too
    for argv in (["--json"], ["--by", "phase"], ["--match", "^aten::", "--top", "3"]):
        modules, proc = _mxperf("ranges", str(out), *argv)
        assert _pandas(modules) == [] and proc.stdout.strip()


@pytest.mark.parametrize(
    "name",
    [
        "real_hta_a100_ddp_rank0_hostbound",
        "synth_verl_fsdp_bf16",  # micro-batches found and written
        "synth_nemo_rl_mxfp8",  # an nsys export of NeMo RL
        "synth_verl_fsdp_bf16_2rank",  # the cross-rank tables
    ],
)
def test_what_the_process_writes_is_the_golden_output(name, tmp_path):
    """The tables of a process that never imports pandas are today's (pyarrow converts without it)."""
    inputs, facts = golden.case(name).make(tmp_path)
    out = tmp_path / "out"
    modules, proc = _mxperf("ingest", *(str(p.resolve()) for p in inputs), "-o", str(out), "--json")
    assert _pandas(modules) == []
    json_line = proc.stdout.strip().splitlines()[-1]
    assert golden.compare(out, golden.golden_dir(name), json_line, facts) == []


def test_labels_colocated_processes_and_a_phase_map_import_no_pandas(tmp_path):
    inputs, _ = golden.case("synth_verl_fsdp_bf16_2rank").make(tmp_path)
    phase_map = REPO / "tracing" / "analysis" / "phase_map.toml"
    flags = ["--colocated", "--label", "model=m,precision=bf16", "--phase-map", str(phase_map)]
    out = tmp_path / "out"
    modules, _ = _mxperf("ingest", *map(str, inputs), "-o", str(out), *flags)
    assert _pandas(modules) == []
    assert (out / "microbatches.parquet").is_file()


@pytest.mark.parametrize("src", [A100, NSYS], ids=["kineto", "nsys"])
def test_annotate_imports_no_pandas(tmp_path, src):
    modules, _ = _mxperf("annotate", str(src), "-o", str(tmp_path / "annotated.json.gz"))
    assert _pandas(modules) == []


def test_pandas_before_or_after_an_ingest_in_one_process(tmp_path):
    """``import mxperf.cli`` then an ingest, then pandas: the frames come back as usual (pyarrow imports pandas
    on its next use); and a process that imported pandas first keeps it (nothing is kept out)."""
    after = f"""
import sys
import mxperf.cli
assert mxperf.cli.main(["ingest", {str(A100)!r}, "-o", {str(tmp_path / "a")!r}]) == 0
assert "pandas" not in sys.modules
import pandas as pd
import pyarrow as pa
from tracing.outputs import store
df = store.read_table({str(tmp_path / "a" / "devices.parquet")!r})
assert str(df["trace"].dtype) == "string" and str(df["rank"].dtype) == "Int64", df.dtypes
assert pa.array(pd.Series([1, None], dtype="Int64")).null_count == 1
print("ok", len(df))
"""
    before = f"""
import pandas as pd
from mxperf.cli import main
assert main(["ingest", {str(A100)!r}, "-o", {str(tmp_path / "b")!r}]) == 0
import sys
assert sys.modules["pandas"] is pd
print("ok")
"""
    for code in (after, before):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]
