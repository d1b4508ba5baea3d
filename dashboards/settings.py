"""What ``mxperf dash`` passes to the dashboard server: environment variable names and their defaults.

Kept free of heavy imports so the command line can read them without loading pandas or Streamlit.
"""

from __future__ import annotations

RUNS_DIR_ENV = "MXPERF_RUNS_DIR"  # the folder of outputs the app reads (and the only one it writes to)
ALLOWED_HOSTS_ENV = "MXPERF_DASH_ALLOWED_HOSTS"  # comma-separated Host names the guard accepts
MAX_UPLOAD_ENV = "MXPERF_DASH_MAX_UPLOAD_MB"  # the Add a trace page's upload limit
DEFAULT_MAX_UPLOAD_MB = 200
LOCAL_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")
