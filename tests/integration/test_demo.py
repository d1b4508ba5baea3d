"""`mxperf demo` (what `make demo` runs) end to end on small sizes: sweep -> fit -> verdict, and a rerun."""

from __future__ import annotations

import json

from mxperf.cli import main
from tracing.outputs import store
from tracing.outputs.manifest import read_manifest


def test_demo_sweeps_fits_and_reruns_with_force(tmp_path, capsys):
    out = tmp_path / "demo"
    args = ["demo", "-o", str(out), "--tokens-per-microbatch", "32,64,96", "--repeats", "2"]
    args += ["--seq-len", "32", "--skip-consistency", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["status"] == "complete" and summary["fit"] == str(out / "fit")
    assert read_manifest(out / "sweep")["status"] == "complete"
    (model,) = store.read_json(out / "fit" / "fits.json")["models"]
    assert (
        set(model["fits"]) == {"bf16", "mxfp8"} and model["breakeven"]["case"]
    )  # a verdict, whichever it is
    assert f"dash {out}" in captured.out  # where to look next
    assert main(args) == 2  # the folder is not empty
    assert "--force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0
