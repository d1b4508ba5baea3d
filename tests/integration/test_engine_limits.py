"""The engine's limits come from the environment: a value it cannot use, or a limit the trace runs out of, is
one line naming the variable (exit 2), with nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from mxperf.cli import main

A100 = Path(__file__).parent.parent / "data" / "real" / "hta_a100_ddp_rank0_hostbound.json.gz"


def _ingest_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    out = tmp_path / "out"
    assert main(["ingest", str(A100), "-o", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert not out.exists()
    assert {p.name for p in tmp_path.iterdir()} <= {"spill"}  # the one file a test made, if any
    return err


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("abc", "not a memory size"),
        ("0", "not a memory size"),
        ("-5GB", "expected a positive memory size"),
        (
            "1MB",
            f"{A100}: the trace engine ran out of memory at MXPERF_MEMORY_LIMIT=1MB",
        ),  # hit while ingesting
    ],
)
def test_memory_limit(tmp_path, capsys, monkeypatch, value, says):
    monkeypatch.setenv("MXPERF_MEMORY_LIMIT", value)
    err = _ingest_fails(tmp_path, capsys)
    assert says in err and "MXPERF_MEMORY_LIMIT" in err


@pytest.mark.parametrize("value", ["0", "-2", "two", "100000"])
def test_threads(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("MXPERF_THREADS", value)
    err = _ingest_fails(tmp_path, capsys)
    assert f"MXPERF_THREADS={value!r}: expected a whole number of threads, 1 to 1024" in err


def test_temp_dir_that_cannot_be_made_or_written(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "spill"
    a_file.write_text("not a folder")
    for value in (a_file, a_file / "below", tmp_path / "no" / "such"):
        monkeypatch.setenv("MXPERF_TEMP_DIR", str(value))
        err = _ingest_fails(tmp_path, capsys)
        why = "No such file or directory" if "such" in str(value) else "Not a directory"
        assert f"MXPERF_TEMP_DIR={str(value)!r}: the engine cannot spill there ({why}: " in err


def test_temp_dir_made_only_by_the_engine(tmp_path, capsys, monkeypatch):
    """A folder that does not exist yet is fine (its parent can hold it): nothing makes it before DuckDB spills."""
    spill = tmp_path / "spill"
    monkeypatch.setenv("MXPERF_TEMP_DIR", str(spill))
    monkeypatch.setenv("MXPERF_THREADS", "1")
    assert main(["ingest", str(A100), "-o", str(tmp_path / "out"), "--no-progress"]) == 0
    assert (tmp_path / "out" / "devices.parquet").exists()
    assert not spill.exists()


def test_full_spill_folder_is_named(tmp_path):
    """DuckDB's own error when its spill folder fills (its temp-folder cap standing in for a full disk)."""
    import duckdb

    from tracing.ingest import engine

    config = {"memory_limit": "20MB", "threads": 1, "temp_directory": str(tmp_path)}
    con = duckdb.connect(config={**config, "max_temp_directory_size": "1MB"})
    with pytest.raises(engine.EngineError) as err, engine.engine_errors(str(tmp_path)):
        con.sql("select i, i * 2 as j from range(3000000) t(i) order by j desc").fetchall()
    assert str(err.value).startswith(f"the trace engine ran out of disk spilling to {tmp_path} at ")
    assert "point MXPERF_TEMP_DIR at a folder with more free space" in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_kernels_over_an_ingest_names_the_memory_limit(tmp_path, capsys, monkeypatch):
    """`mxperf kernels` reads an ingest's Parquet in the same engine: its memory limit is named, not the tables."""
    out = tmp_path / "out"
    assert main(["ingest", str(A100), "-o", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("MXPERF_MEMORY_LIMIT", "1MB")
    assert main(["kernels", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "mxperf kernels: error: the trace engine ran out of memory at MXPERF_MEMORY_LIMIT=1MB"
    )
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(("env", "rows", "want"), [(None, 99_999, 1), (None, 100_000, None), ("3", 10, 3)])
def test_a_small_trace_runs_on_one_thread_unless_told(tmp_path, monkeypatch, env, rows, want):
    from tracing.ingest import engine

    if env is None:
        monkeypatch.delenv("MXPERF_THREADS", raising=False)
    else:
        monkeypatch.setenv("MXPERF_THREADS", env)
    with engine.session(str(tmp_path)) as con:
        engine.fit_threads(con, rows)
        got = con.execute("select current_setting('threads')").fetchone()[0]
    assert got == (want if want is not None else engine.threads())
