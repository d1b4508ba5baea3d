"""`mxperf dash`: argument checks and the streamlit command line (bound to 127.0.0.1, headless)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mxperf.commands import dash as cli_dash

REPO = Path(__file__).resolve().parents[2]


def test_streamlit_command_is_headless_on_localhost_by_default(tmp_path: Path) -> None:
    parser = __import__("argparse").ArgumentParser()
    cli_dash.add_arguments(parser)
    args = parser.parse_args([str(tmp_path)])
    assert (args.address, args.port) == ("127.0.0.1", 8501)
    cmd = cli_dash.streamlit_command(tmp_path, args.port, args.address)
    assert cmd[1:5] == ["-m", "streamlit", "run", str(cli_dash.APP)]
    assert "--server.headless=true" in cmd and "--server.address=127.0.0.1" in cmd
    assert "--browser.gatherUsageStats=false" in cmd
    assert cli_dash.APP.name == "serve.py"  # the guarded ASGI entry, never the bare script
    assert "--server.maxUploadSize=200" in cmd and "--server.enableXsrfProtection=true" in cmd


def test_missing_runs_dir_is_one_line_error_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mxperf.cli", "dash", str(tmp_path / "nope")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"mxperf dash: error: {tmp_path / 'nope'}: not a directory; pass the folder that holds your mxperf outputs"
    ]


def test_bad_upload_limit_is_one_line_error_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mxperf.cli", "dash", str(tmp_path), "--max-upload-mb", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["mxperf dash: error: --max-upload-mb 0: must be >= 1"]


def test_served_app_is_the_guarded_st_app_and_its_modules_import() -> None:
    code = (
        "from dashboards import serve; import streamlit as st; "
        "assert isinstance(serve.app, st.App); "
        "assert serve.app._user_middleware[0].cls.__name__ == 'HostOriginGuard'; "
        "serve.build_one_figure(); print(serve.import_page_modules())"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
