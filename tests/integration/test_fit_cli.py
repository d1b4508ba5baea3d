"""``mxperf fit`` end to end: outputs, the --json contract, and bad input (exit 2, one line, nothing written)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mxperf.cli import main
from perfmodel.inputs.simulate import simulate_sweep
from perfmodel.report.results import load_fits
from tracing.outputs import store
from tracing.outputs.manifest import OutputDir, read_manifest

DATA = Path(__file__).resolve().parent.parent / "data" / "perfmodel"
REPO = Path(__file__).resolve().parent.parent.parent


def _fit(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["fit", *args, "--bootstrap", "200"])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _verdict(lines: list[str]) -> str:
    """The first comparison's verdict on stdout: after the three-line step answer."""
    return lines[3]


def test_csv_fit_writes_fits_report_plots_and_json(tmp_path: Path, capsys) -> None:
    out = tmp_path / "fit"
    rc, stdout, _ = _fit(
        capsys,
        str(DATA / "sim_with_stall.csv"),
        "-o",
        str(out),
        "--json",
        "--global-batch",  # the CSV records none: without it there is no step-level output (none invented)
        "65536",
        "--what-if",
        "fixed_scale=0.5",
        "--what-if",
        "weight_quant=per_step",
    )
    assert rc == 0
    lines = stdout.strip().splitlines()
    doc = json.loads(lines[-1])
    assert lines[:3] == doc["answer"]  # the three-line step answer first, then each comparison's verdict
    assert lines[3].startswith("sim-dense/update: mxfp8 vs bf16: mxfp8 adds")
    assert "pays off above" in lines[3]
    assert doc["schema_version"] == 1
    (entry,) = doc["models"]
    assert {
        "model",
        "phase",
        "baseline",
        "precision",
        "fits",
        "breakeven",
        "host_stall_share_of_added_fixed",
    } <= set(entry)
    for prec in ("bf16", "mxfp8"):
        assert {"fixed_s", "per_token_s", "fixed_ci", "per_token_ci", "r2", "n_points"} <= set(
            entry["fits"][prec]
        )
    be = entry["breakeven"]
    assert {"case", "tokens", "ci", "ci_method", "ci_reason", "extrapolated"} <= set(be)
    assert {"model_ok", "crossing", "basis"} <= set(be)  # SPEC v2
    assert be["basis"] == "wall" and be["model_ok"] is True
    lo, hi = be["crossing"]  # measured sizes around the true 4,500 (4,096's difference is within noise)
    assert lo < 4500 < hi and {lo, hi} <= set(entry["fits"]["bf16"]["sizes"])
    for prec in ("bf16", "mxfp8"):
        assert {"per_step_s", "per_step_ci"} <= set(entry["fits"][prec])
        assert entry["fits"][prec]["per_step_s"] is None and entry["fits"][prec]["per_step_reason"]
    assert entry["breakeven_gpu_busy"] is None and "GPU busy" in entry["breakeven_gpu_busy_reason"]
    assert be["case"] == "faster_above" and be["ci_method"] == "fieller"
    assert be["ci"][0] < 4500 < be["ci"][1]  # the simulated truth
    assert 0.6 < entry["host_stall_share_of_added_fixed"] < 0.95
    assert entry["step"]["what_if"]["weight_quant_s"]["mxfp8"] > 0
    assert load_fits(out) == json.loads((out / store.FITS).read_text())
    assert read_manifest(out)["kind"] == "fit" and read_manifest(out)["status"] == "complete"
    report = (out / store.REPORT).read_text()
    assert "pays off above" in report and "hold-out MAPE" in report
    sb = entry["step"]["what_if"]["step_breakeven_tokens"]["mxfp8"]
    want = "none (no crossing up to the global batch)" if sb is None else f"{sb:,.0f} tokens"
    assert f"step-level breakeven mxfp8: {want}" in report
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == [
        "host_stall_sim-dense_update_mxfp8.png",
        "step_time_sim-dense_update_mxfp8.png",
        "time_vs_tokens_sim-dense_update_mxfp8.png",
    ]
    for name in pngs:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in report


def test_no_stall_input_gives_null_share_with_reason_and_no_stall_plot(tmp_path: Path, capsys) -> None:
    rc, stdout, _ = _fit(capsys, str(DATA / "sim_no_stall.csv"), "-o", str(tmp_path / "o"), "--json")
    assert rc == 0
    entry = json.loads(stdout.strip().splitlines()[-1])["models"][0]
    assert entry["host_stall_share_of_added_fixed"] is None
    assert "GPU trace" in entry["host_stall"]["reason"]
    assert not list((tmp_path / "o").glob("host_stall_*.png"))


def test_sweep_directory_fit_with_memory_cap_and_global_batch(tmp_path: Path, capsys) -> None:
    sweep = tmp_path / "sweep"
    with OutputDir(sweep, kind="sweep", command=["t"]) as od:
        store.write_table(simulate_sweep(), od.path / store.MICROBATCHES)
    rc, stdout, _ = _fit(
        capsys,
        str(sweep),
        "-o",
        str(tmp_path / "fit"),
        "--json",
        "--global-batch",
        "65536",
        "--mem-cap-bytes",
        str(5e7 + 4096 * 3000),
    )
    assert rc == 0
    rec = json.loads(stdout.strip().splitlines()[-1])["models"][0]["step"]["recommendation"]
    assert rec["global_batch_tokens"] == 65536
    assert rec["precision"] == "bf16" and rec["tokens_per_microbatch"] == 3000


BAD = [
    (["bad_one_precision.csv"], "only one precision"),
    (["bad_one_size.csv"], "a fit needs >= 2"),
    (["bad_nan_seconds.csv"], "NaN"),
    (["bad_negative_seconds.csv"], "negative"),
    (["bad_empty.csv"], "empty file"),
    (["bad_header_only.csv"], "no micro-batch rows"),
    (["bad_unknown_precision.csv"], "unknown precision"),
    (["does_not_exist.csv"], "no such file"),
]


@pytest.mark.parametrize(("files", "message"), BAD)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path: Path, capsys, files, message) -> None:
    out = tmp_path / "fit"
    rc, stdout, stderr = _fit(capsys, *(str(DATA / f) for f in files), "-o", str(out))
    assert rc == 2
    assert stderr.startswith("mxperf fit: error:") and message in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert stdout == ""
    assert not out.exists()


def test_existing_report_is_not_overwritten_without_force(tmp_path: Path, capsys) -> None:
    out = tmp_path / "fit"
    assert _fit(capsys, str(DATA / "sim_no_stall.csv"), "-o", str(out))[0] == 0
    before = (out / store.FITS).read_bytes()
    rc, _, stderr = _fit(capsys, str(DATA / "sim_with_stall.csv"), "-o", str(out))
    assert rc == 2 and "--force" in stderr
    assert (out / store.FITS).read_bytes() == before
    rc, _, _ = _fit(capsys, str(DATA / "bad_nan_seconds.csv"), "-o", str(out), "--force")
    assert rc == 2 and (out / store.FITS).read_bytes() == before  # bad input never clears the old report
    assert _fit(capsys, str(DATA / "sim_with_stall.csv"), "-o", str(out), "--force")[0] == 0
    assert (out / store.FITS).read_bytes() != before


def test_cli_process_prints_no_traceback_on_bad_input(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mxperf",
            "fit",
            str(DATA / "bad_one_precision.csv"),
            "-o",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_fit_command_does_not_import_torch(tmp_path: Path) -> None:
    code = (
        "import argparse, sys; from mxperf.commands import fit as cli_fit; p = argparse.ArgumentParser(); "
        "cli_fit.add_arguments(p); "
        f"rc = cli_fit.run(p.parse_args([{str(DATA / 'sim_no_stall.csv')!r}, '-o', {str(tmp_path / 'o')!r}])); "
        "assert rc == 0, rc; assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_extra_columns_are_ignored_with_a_note(tmp_path: Path, capsys) -> None:
    rc, stdout, stderr = _fit(capsys, str(DATA / "extra_column.csv"), "-o", str(tmp_path / "o"), "--json")
    assert rc == 0
    assert "note:" in stderr and "gpu_temp" in stderr and "ignored" in stderr
    doc = json.loads(stdout.strip().splitlines()[-1])
    assert any("gpu_temp" in n for n in doc["notes"])
    assert "gpu_temp" in (tmp_path / "o" / store.REPORT).read_text()


def _knee_table():
    from perfmodel.inputs.simulate import KNEE

    return simulate_sweep(KNEE, rng=__import__("numpy").random.default_rng(4), stall_per_token_s=0.0)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_host_gpu_knee_is_fitted_by_parts_and_named_in_the_headline(
    tmp_path: Path, capsys, fmt: str
) -> None:
    path = tmp_path / f"knee.{fmt}"
    df = _knee_table()
    df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path, index=False)
    rc, stdout, _ = _fit(capsys, str(path), "-o", str(tmp_path / "o"), "--json")
    assert rc == 0
    lines = stdout.strip().splitlines()
    (entry,) = json.loads(lines[-1])["models"]
    be = entry["breakeven"]
    assert be["model_ok"] is False  # straight lines are rejected ...
    assert be["model"] == "parts" and be["ci_method"] == "bootstrap"  # ... a model that fits gives n*
    assert be["ci"][0] <= 4250 <= be["ci"][1]  # the true crossing of max(host, GPU)
    assert be["crossing"][0] <= 4250 <= be["crossing"][1]
    verdict = _verdict(lines)
    assert "straight lines are rejected" in verdict and "parts model" in verdict
    assert "Measured:" in verdict and "host overhead removed" in verdict
    gb = entry["breakeven_gpu_busy"]
    assert gb["basis"] == "gpu_busy" and gb["model_ok"] is True
    assert gb["ci"][0] <= 500 <= gb["ci"][1]  # busy: (3 - 2) ms / (4 - 2) us
    knee = entry["fits"]["bf16"]["knee"]
    assert knee["chosen"] and knee["knee_ci"][0] <= 2000 <= knee["knee_ci"][1]
    share = entry["host_stall"]  # at zero tokens from the knee models (not at the smallest size measured)
    assert (
        share["basis"].startswith("zero-size intercepts")
        and 0.5 < share["share_ci"][0] < share["share_ci"][1] < 1.5
    )
    assert (tmp_path / "o" / "gpu_busy_sim_update_mxfp8.png").is_file()
    report = (tmp_path / "o" / store.REPORT).read_text()
    assert "model_ok (straight lines not rejected): **no**" in report and "Measured crossing" in report


def test_one_measurement_per_size_without_bootstrap_is_undetermined(tmp_path: Path, capsys) -> None:
    csv = tmp_path / "two.csv"
    csv.write_text(
        "model,precision,tokens_per_microbatch,seconds\n"
        "m,bf16,256,0.011\nm,bf16,4096,0.026\nm,mxfp8,256,0.0195\nm,mxfp8,4096,0.027\n"
    )
    rc, stdout, _ = _fit(capsys, str(csv), "-o", str(tmp_path / "o"), "--json", "--bootstrap", "0")
    assert rc == 0
    be = json.loads(stdout.strip().splitlines()[-1])["models"][0]["breakeven"]
    assert be["case"] == "undetermined" and be["tokens"] is None
    assert "undetermined" in _verdict(stdout.splitlines())


def test_a_knee_model_without_bootstrap_is_undetermined_not_a_traceback(tmp_path: Path, capsys) -> None:
    path = tmp_path / "knee.csv"
    _knee_table().drop(columns=["gpu_busy_seconds", "host_stall_seconds"]).to_csv(path, index=False)
    rc = main(["fit", str(path), "-o", str(tmp_path / "o"), "--json", "--bootstrap", "0"])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    (entry,) = json.loads(stdout.strip().splitlines()[-1])["models"]
    be = entry["breakeven"]
    assert be["model"] == "knee" and be["case"] == "undetermined" and be["tokens"] is None
    assert 3000 < be["tokens_estimate"] < 6000  # the point estimate is still given, flagged
    assert all(s["case"] == "undetermined" and s["tokens"] is None for s in entry["step"]["step_breakeven"])
    assert "undetermined (point estimate" in _verdict(stdout.splitlines())
