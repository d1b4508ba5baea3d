"""The ``mxperf`` command picks Arrow's system allocator, unless the user chose a pool."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNIPPET = (
    "import pyarrow as pa; from tracing.outputs.store import use_system_allocator; "
    "before = pa.default_memory_pool().backend_name; print(before, use_system_allocator())"
)


def _run(env_pool: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    env["PYTHONPATH"] = str(ROOT)
    if env_pool is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = env_pool
    out = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, env=env, check=True)
    return out.stdout.split()


def test_default_pool_is_replaced_by_the_system_allocator():
    before, after = _run(None)
    assert before != "system" and after == "system"  # the wheels default to mimalloc (or jemalloc)


@pytest.mark.parametrize("pool", ["mimalloc", "system"])
def test_a_pool_chosen_in_the_environment_is_left_alone(pool):
    assert _run(pool) == [pool, pool]


def test_the_cli_entry_point_installs_it(tmp_path):
    code = (
        "import pyarrow as pa, mxperf.cli as c, sys; rc = c.main(['ranges', sys.argv[1]]); "
        "print(rc, pa.default_memory_pool().backend_name)"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "missing")], capture_output=True, text=True, env=env
    )
    assert out.stdout.split() == ["2", "system"]  # a bad path is exit 2, and the pool was set before that
