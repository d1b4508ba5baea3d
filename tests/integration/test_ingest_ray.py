"""`mxperf ingest --ray`: files mapped over a local 2-CPU Ray cluster (marker `ray`; needs the ray extra)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mxperf.cli import main

RANKS = Path(__file__).parent.parent / "data" / "real" / "hta_sampled_2rank"
HAS_RAY = importlib.util.find_spec("ray") is not None


@pytest.mark.skipif(HAS_RAY, reason="ray is installed: the missing-extra message cannot be shown")
def test_ray_flag_without_ray_says_how_to_install(tmp_path, capsys):
    assert main(["ingest", str(RANKS), "-o", str(tmp_path / "o"), "--ray", "local"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'mxperf[ray]'" in err[0]
    assert list((tmp_path / "o").rglob("*.parquet")) == []


@pytest.mark.ray
@pytest.mark.skipif(not HAS_RAY, reason="needs the ray extra: pip install 'mxperf[ray]'")
def test_ray_ingest_matches_serial_ingest(tmp_path, capsys):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert main(["ingest", str(RANKS), "-o", str(tmp_path / "serial"), "--json"]) == 0
        serial = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert main(["ingest", str(RANKS), "-o", str(tmp_path / "ray"), "--json", "--ray", "local"]) == 0
        distributed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    finally:
        ray.shutdown()
    assert distributed == serial
    assert sorted(p.name for p in (tmp_path / "ray" / "events").iterdir()) == [
        "rank-0.parquet",
        "rank-1.parquet",
    ]
