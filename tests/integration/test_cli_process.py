"""The ``mxperf`` process as users meet it: a start-up that imports nothing heavy, a torch-less install that
says what to install, real read-only and full disks (a tmpfs in a private mount namespace), a taken port,
and mxperf's own trace ingested without labels."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATA_DIR, REPO_ROOT
from test_analysis_without_torch import _BLOCK

from mxperf.cli import main
from tracing.outputs import store
from tracing.outputs.manifest import read_manifest

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
CSV = DATA_DIR / "perfmodel" / "sim_no_stall.csv"
HEAVY = ("pandas", "numpy", "pyarrow", "torch", "scipy", "matplotlib", "streamlit")
_NO_TORCH = _BLOCK  # a meta-path finder that refuses torch and transformers


def _python(code: str, *, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("argv", [["--help"], ["--version"], []])
def test_help_and_version_import_nothing_heavy(argv: list[str]) -> None:
    code = (
        "import sys\nfrom mxperf.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_torch_less_install_lists_what_each_command_needs_and_says_it_in_one_line() -> None:
    code = _NO_TORCH + (
        "from mxperf.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('RC', main(['run', '--steps', '2']))\n"
        "print('RC', main(['sweep', '--help']))\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    listing = " ".join(proc.stdout.split())
    assert "run GRPO steps" in listing and "[needs pip install 'mxperf[train]']" in listing
    assert (
        "ingest Kineto" in listing
        and "ingest Kineto / Nsight Systems traces or an mxperf run: events, GPU busy, host stall, per-range time [needs"
        not in listing
    )
    assert proc.stdout.count("RC 2") == 2
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 2 and "Traceback" not in proc.stderr
    assert errors[0].startswith("mxperf run: error: mxperf run needs torch")
    assert "pip install 'mxperf[train]'" in errors[0]


def _private_tmpfs(script: str, mnt: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh) with a tmpfs mounted at ``mnt`` in a private mount namespace."""
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare (a private mount namespace for a real read-only / full disk)")
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {mnt}"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {probe.stderr.decode().strip()}")
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], env=ENV, capture_output=True, text=True, timeout=300
    )


def test_a_read_only_disk_is_one_line_and_the_old_output_stays(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    py = f"{sys.executable} -m mxperf.cli"
    fit = f"{py} fit {CSV} --bootstrap 20 -o {mnt}/fit"
    script = (
        f"set -e; mount -t tmpfs -o size=16m tmpfs {mnt}; {fit} >/dev/null 2>&1; "
        f"mount -o remount,ro {mnt}; set +e; {fit} --force; echo RC=$?; cat {mnt}/fit/manifest.json"
    )
    proc = _private_tmpfs(script, mnt)
    assert "RC=2" in proc.stdout, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr
    assert err[0].startswith("mxperf fit: error: ") and "Read-only file system" in err[0]
    assert str(mnt / "fit") in err[0]
    manifest = json.loads(proc.stdout.split("RC=2", 1)[1])
    assert manifest["status"] == "complete"


def test_a_full_disk_is_one_line_naming_the_file_and_the_old_output_stays(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    py = f"{sys.executable} -m mxperf.cli"
    trace = DATA_DIR / "real" / "hta_a100_ddp_rank0_hostbound.json.gz"
    ingest = f"{py} ingest {trace} -o {mnt}/ing"
    # room for one ingest output, then fill what is left: the rerun runs out of space while writing
    script = (
        f"set -e; mount -t tmpfs -o size=6m tmpfs {mnt}; {ingest} 2>/dev/null; "
        f"dd if=/dev/zero of={mnt}/filler bs=64k 2>/dev/null || true; set +e; "
        f"{ingest} --force; echo RC=$?; cat {mnt}/ing/manifest.json; ls -a {mnt}"
    )
    proc = _private_tmpfs(script, mnt)
    assert "RC=2" in proc.stdout, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert err[0].startswith("mxperf ingest: error: ") and "No space left on device" in err[0]
    assert str(mnt / "ing") in err[0] and ".mxperf-partial" not in err[0] and ".tmp" not in err[0]
    after = proc.stdout.split("RC=2", 1)[1]
    manifest = json.loads(after[: after.rindex("}") + 1])
    assert manifest["status"] == "complete" and manifest["kind"] == "ingest"
    assert ".mxperf-partial" not in after  # the attempt was cleaned away


def test_dash_on_a_taken_port_is_one_line_before_anything_serves(tmp_path: Path, capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["dash", str(tmp_path), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--port {port}: 127.0.0.1:{port} cannot be served" in err[0]
    assert "serving" not in err[0]


def test_mxperfs_own_trace_alone_needs_no_precision_label(tmp_path: Path, capsys) -> None:
    torch = pytest.importorskip("torch")
    from tracing.capture.profiler import Capture, CaptureConfig
    from tracing.capture.ranges import RangeLog
    from tracing.outputs.manifest import OutputDir

    run = tmp_path / "run"
    log = RangeLog(emit_nvtx=False, encode_attrs=True)  # as a traced `mxperf run` names its ranges
    layer = torch.nn.Linear(8, 8)
    config = {"model": "tiny-dense", "learner": "mxfp8", "sampler": "mxfp8", "tokens_per_microbatch": 64}
    with OutputDir(run, kind="run", command=["t"], config=config) as od:
        with Capture(od.path, CaptureConfig(wait=0, warmup=1, active=2), rank=0) as cap:
            for step in range(3):
                with log.range("update/microbatch", step=step, microbatch=0, tokens=60, precision="mxfp8"):
                    layer(torch.randn(2, 8)).sum().backward()
                cap.step()
        store.write_table(log.to_frame(), od.path / store.RANGES)
    out = tmp_path / "ing"
    assert main(["ingest", str(run / "trace" / "rank-0.json.gz"), "-o", str(out)]) == 0, (
        capsys.readouterr().err
    )
    mb = store.read_table(out / store.MICROBATCHES)
    assert len(mb) == 2 and set(mb["precision"]) == {"mxfp8"} and set(mb["model"]) == {"tiny-dense"}
    assert read_manifest(out)["status"] == "complete"


def test_the_first_warm_start_and_trace_writing_say_what_they_are_doing(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    torch = pytest.importorskip("torch")
    from tracing.capture.profiler import Capture, CaptureConfig

    monkeypatch.setenv("MXPERF_CACHE", str(tmp_path / "cache"))
    assert main(["pretrain", "--steps", "4", "--batch-size", "4"]) == 0
    err = capsys.readouterr().err
    assert f"warm start: 4 supervised steps, the first time only (then cached in {tmp_path / 'cache'})" in err
    assert "warm start: step 4/4, loss" in err
    assert main(["pretrain", "--steps", "4", "--batch-size", "4"]) == 0
    assert "warm start:" not in capsys.readouterr().err  # cached: nothing long to announce

    lines: list[str] = []
    layer = torch.nn.Linear(8, 8)
    with Capture(
        tmp_path / "run", CaptureConfig(wait=0, warmup=0, active=1), rank=0, log=lines.append
    ) as cap:
        layer(torch.randn(2, 8)).sum().backward()
        cap.step()
    assert lines[0] == "trace: writing trace/rank-0.json.gz (profiler export, then gzip) ..."
    assert lines[1].startswith("trace: wrote trace/rank-0.json.gz (") and lines[1].endswith(" s")


def test_an_interrupted_capture_says_interrupted_and_a_crashed_one_failed(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from tracing.capture.profiler import Capture, CaptureConfig

    layer = torch.nn.Linear(4, 4)
    for name, error, status in (
        ("ctrl-c", KeyboardInterrupt, "interrupted"),
        ("bug", RuntimeError, "failed"),
    ):
        with (
            pytest.raises(error),
            Capture(tmp_path / name, CaptureConfig(wait=0, warmup=0, active=2), rank=0) as cap,
        ):
            layer(torch.randn(2, 4)).sum().backward()
            cap.step()
            raise error
        manifest = store.read_json(tmp_path / name / "trace" / "capture-rank-0.json")
        assert manifest["status"] == status


def test_the_command_leaves_at_once_with_everything_written_and_said(tmp_path: Path) -> None:
    """``python -m mxperf`` (``mxperf.cli.entry``) ends with ``os._exit`` after the command: stdout through a
    pipe still ends with the whole JSON line, the output folder is complete, the exit code is the command's,
    and the ``atexit`` handlers ran (a file one of them writes)."""
    trace = DATA_DIR / "real" / "hta_a100_ddp_rank0_hostbound.json.gz"
    marker = tmp_path / "atexit-ran"
    code = (
        "import atexit, runpy, sys\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
        "sys.argv = ['mxperf', *sys.argv[1:]]\n"
        "runpy.run_module('mxperf', run_name='__main__')\n"
    )
    argv = [sys.executable, "-c", code, "ingest", str(trace), "-o", str(tmp_path / "out"), "--json"]
    buffered = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED"}  # stdout to a pipe: block-buffered
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=buffered, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["traces"][0]["format"] == "kineto"
    assert read_manifest(tmp_path / "out")["status"] == "complete"
    assert marker.exists()
    bad = subprocess.run(
        [sys.executable, "-m", "mxperf", "ingest", str(tmp_path / "none.json"), "-o", str(tmp_path / "o2")],
        cwd=REPO_ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("mxperf ingest: error: ")
        and "Traceback" not in bad.stderr
    )
