"""``mxperf dash RUNS_DIR``: open the dashboard over a folder of output directories.

Runs ``streamlit run dashboards/serve.py`` headless, bound to 127.0.0.1 by default (the dashboard serves
files from RUNS_DIR; exposing it on another interface is an explicit choice with ``--address``), behind a
Host/Origin check (``dashboards/guard.py``: DNS rebinding, cross-site pages). RUNS_DIR, the allowed hosts and
the upload limit are passed in the environment; the app reads and writes nothing outside RUNS_DIR.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from tracing.outputs.errors import InputError

APP = Path(__file__).resolve().parents[2] / "dashboards" / "serve.py"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs_dir", metavar="RUNS_DIR", help="folder holding run/sweep/ingest/fit output dirs"
    )
    parser.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    parser.add_argument(
        "--address", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name browsers may use besides 127.0.0.1/localhost/the bound address (repeatable)",
    )
    parser.add_argument(
        "--max-upload-mb", type=int, default=200, help="largest trace upload on Add a trace (default 200)"
    )


def streamlit_command(runs_dir: Path, port: int, address: str, max_upload_mb: int = 200) -> list[str]:
    """The ``streamlit run`` command line (headless, no usage stats, no file watcher on RUNS_DIR)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless=true",
        f"--server.address={address}",
        f"--server.port={port}",
        "--browser.gatherUsageStats=false",
        "--server.fileWatcherType=none",
        "--server.runOnSave=false",
        "--global.developmentMode=false",
        "--client.toolbarMode=minimal",
        f"--server.maxUploadSize={max_upload_mb}",
        "--server.enableXsrfProtection=true",
        "--server.enableCORS=true",
    ]


def check_port_free(address: str, port: int) -> None:
    """One clear line when ``address:port`` cannot be served (taken, or not an address of this machine),
    before anything says it is serving; binds the way the server does (SO_REUSEADDR)."""
    import socket

    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise InputError(f"--address {address}: not an address here ({exc.strerror})") from None
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(where)
        except OSError as exc:
            raise InputError(
                f"--port {port}: {address}:{port} cannot be served ({exc.strerror}; another server, perhaps "
                "an earlier mxperf dash, may hold it); pass another --port"
            ) from None


def check_streamlit() -> None:
    """One line when the installed Streamlit cannot serve the guarded app (``st.App``, Streamlit >= 1.67
    tested), without importing Streamlit."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("streamlit.web.server.starlette.starlette_app") is None:
        try:
            have = importlib.metadata.version("streamlit")
        except importlib.metadata.PackageNotFoundError:
            have = "none"
        raise InputError(
            f"mxperf dash needs Streamlit with st.App (1.67 is tested; installed: {have}): pip install -U 'streamlit>=1.67'"
        )


def run(args: argparse.Namespace) -> int:
    runs_dir = Path(args.runs_dir).expanduser().resolve()
    if not runs_dir.is_dir():
        raise InputError(f"{args.runs_dir}: not a directory; pass the folder that holds your mxperf outputs")
    if not 0 < args.port < 65536:
        raise InputError(f"--port {args.port}: must be between 1 and 65535")
    if args.max_upload_mb < 1:
        raise InputError(f"--max-upload-mb {args.max_upload_mb}: must be >= 1")
    check_port_free(args.address, args.port)
    check_streamlit()
    from dashboards.guard import allowed_hosts
    from dashboards.settings import ALLOWED_HOSTS_ENV, MAX_UPLOAD_ENV, RUNS_DIR_ENV

    env = {
        **os.environ,
        RUNS_DIR_ENV: str(runs_dir),
        ALLOWED_HOSTS_ENV: ",".join(allowed_hosts(args.address, args.allow_host)),
        MAX_UPLOAD_ENV: str(args.max_upload_mb),
    }
    print(f"mxperf dash: serving {runs_dir} at http://{args.address}:{args.port}", file=sys.stderr)
    proc = subprocess.Popen(streamlit_command(runs_dir, args.port, args.address, args.max_upload_mb), env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=10)
        raise
