"""Loading sweep / ingest / run directories and CSVs into the micro-batch table, and refusing bad ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfmodel.inputs.columns import FIT_COLUMNS, sum_sq_lengths
from perfmodel.inputs.load import check_fittable, load_inputs, read_csv_table
from perfmodel.inputs.simulate import simulate_sweep
from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import OutputDir
from tracing.outputs.schema import MICROBATCH_COLUMNS

DATA = Path(__file__).resolve().parent.parent / "data" / "perfmodel"


def _dir(path: Path, kind: str, tables: dict[str, pd.DataFrame]) -> Path:
    with OutputDir(path, kind=kind, command=["test"]) as od:
        for name, df in tables.items():
            store.write_table(df, od.path / name)
    return path


def test_csv_gets_defaults_for_optional_columns() -> None:
    df = read_csv_table(DATA / "sim_no_stall.csv")
    assert list(df.columns) == list(FIT_COLUMNS)
    assert set(MICROBATCH_COLUMNS) <= set(df.columns)
    assert (df["source"] == "csv").all()
    assert df["host_stall_seconds"].isna().all()
    assert (df["num_tokens"] == df["tokens_per_microbatch"]).all()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("bad_empty.csv", "empty file"),
        ("bad_header_only.csv", "no micro-batch rows"),
        ("bad_nan_seconds.csv", "NaN, infinite or negative 'seconds'"),
        ("bad_negative_seconds.csv", "NaN, infinite or negative 'seconds'"),
        ("bad_unknown_precision.csv", "unknown precision id(s) mxfp4"),
    ],
)
def test_bad_csv_is_refused_naming_the_file_and_the_problem(name: str, message: str) -> None:
    with pytest.raises(InputError) as exc:
        read_csv_table(DATA / name)
    assert name in str(exc.value)
    assert message in str(exc.value)


def test_unknown_columns_are_ignored_with_a_note_never_refused() -> None:
    notes: list[str] = []
    df = read_csv_table(DATA / "extra_column.csv", notes)
    assert len(df) > 0 and "gpu_temp" not in df.columns
    (note,) = notes
    assert "extra_column.csv" in note and "gpu_temp" in note and "ignored" in note
    inputs = load_inputs([DATA / "extra_column.csv"])
    assert inputs.notes == notes


def _v2_table() -> pd.DataFrame:
    """Every column of the v2 micro-batch contract plus the extras fit reads and one it does not."""
    df = simulate_sweep(
        global_tokens=[8192, 16384], seq_len=256, seq_len_spread=0.4, repeats=2, sizes=(512, 1024, 2048)
    )
    df["source"] = "detected"
    df["rank"] = pd.array([0, 1] * (len(df) // 2), dtype="Int64")
    df["trace"] = "traces/rank-0.json.gz"
    df["mfu"] = 0.4
    return df


@pytest.mark.parametrize("fmt", ["csv", "parquet", "plain-parquet"])
def test_every_v2_column_is_accepted_from_csv_and_parquet(tmp_path: Path, fmt: str) -> None:
    df = _v2_table()
    path = tmp_path / f"mb.{fmt.split('-')[-1]}"
    if fmt == "csv":
        df.to_csv(path, index=False)  # seq_lens becomes text: "[256, 256]"
    elif fmt == "parquet":
        store.write_table(df, path)
    else:  # written by pandas alone (no mxperf metadata), as another tool would
        df.to_parquet(path, index=False)
    inputs = load_inputs([path])
    mb = inputs.microbatches
    assert len(mb) == len(df)
    assert set(mb["source"]) == {"detected"} and mb["rank"].tolist() == df["rank"].tolist()
    assert mb["global_tokens"].notna().all()
    expected, bad = sum_sq_lengths(df["seq_lens"])
    assert bad == 0
    np.testing.assert_allclose(mb["sum_sq_tokens"].to_numpy(float), expected)
    assert any("mfu" in n for n in inputs.notes)
    check_fittable(mb, "bf16")


def test_a_gpu_sweeps_own_microbatches_csv_is_read(tmp_path: Path) -> None:
    # benchmarks/gpu_sweep.py writes exactly the contract's columns, source included
    df = simulate_sweep(sizes=(512, 1024, 2048), repeats=2)
    df["gpu_busy_seconds"] = pd.array([None] * len(df), dtype="Float64")
    path = tmp_path / "microbatches.csv"
    df[list(MICROBATCH_COLUMNS)].to_csv(path, index=False)
    mb = load_inputs([path]).microbatches
    assert len(mb) == len(df) and (mb["source"] == "sweep").all()


def test_a_file_that_is_not_parquet_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "mb.parquet"
    bad.write_text("model,precision\n")
    with pytest.raises(InputError, match=r"mb\.parquet: not a readable Parquet table"):
        load_inputs([bad])


@pytest.mark.parametrize(
    ("text", "expected"),
    [("[512, 300]", 512**2 + 300**2), ("512;300", 512**2 + 300**2), ("128", 128**2), ("", np.nan)],
)
def test_sequence_lengths_are_read_from_text_or_lists(text: str, expected: float) -> None:
    got, bad = sum_sq_lengths(pd.Series([text or None, [3, 4]], dtype=object))
    assert got[1] == 25.0 and bad == 0
    assert (np.isnan(got[0]) and np.isnan(expected)) or got[0] == expected


def test_one_precision_or_one_size_is_not_fittable() -> None:
    one_prec = load_inputs([DATA / "bad_one_precision.csv"]).microbatches
    with pytest.raises(InputError, match="only one precision"):
        check_fittable(one_prec, "bf16")
    one_size = load_inputs([DATA / "bad_one_size.csv"]).microbatches
    with pytest.raises(InputError, match=r"mxfp8: 1 micro-batch size \(1024\); a fit needs >= 2"):
        check_fittable(one_size, "bf16")
    ok = load_inputs([DATA / "sim_no_stall.csv"]).microbatches
    with pytest.raises(InputError, match="no fp8-tensor baseline"):
        check_fittable(ok, "fp8-tensor")
    with pytest.raises(InputError, match="--min-tokens 8192"):
        check_fittable(ok, "bf16", min_tokens=8192)


def test_sweep_directory_is_read(tmp_path: Path) -> None:
    d = _dir(tmp_path / "sweep", "sweep", {store.MICROBATCHES: simulate_sweep()})
    inputs = load_inputs([d])
    assert len(inputs.microbatches) == len(simulate_sweep())
    assert inputs.summaries[0].kind == "sweep"
    assert "host stall" in inputs.summaries[0].gives


def test_unlabelled_ingest_directory_is_refused_with_the_fix(tmp_path: Path) -> None:
    d = _dir(tmp_path / "ingest", "ingest", {store.DEVICES: pd.DataFrame({"device": [0]})})
    with pytest.raises(InputError, match="--label model=M,precision=P,tokens_per_microbatch=N"):
        load_inputs([d])


def test_labelled_ingests_of_two_sizes_combine_and_bring_kernel_classes(tmp_path: Path) -> None:
    sim = simulate_sweep(sizes=(1024, 4096), repeats=1)
    kernels = pd.DataFrame({"kernel_class": ["quantize"], "total_ns": [1_000_000]})
    dirs = []
    for (prec, n), g in sim.groupby(["precision", "tokens_per_microbatch"]):
        dirs.append(
            _dir(
                tmp_path / f"{prec}-{n}",
                "ingest",
                {store.MICROBATCHES: g.assign(source="trace"), store.KERNELS: kernels},
            )
        )
    inputs = load_inputs(dirs)
    check_fittable(inputs.microbatches, "bf16")
    assert inputs.kernels is not None and set(inputs.kernels["precision"]) == {"bf16", "mxfp8"}
    assert inputs.kernel_microbatches["mxfp8"] == 6
    assert "breakeven alone" in inputs.summaries[0].cannot_give


def test_run_directory_gives_its_phase_seconds_per_step(tmp_path: Path) -> None:
    metrics = pd.DataFrame(
        {
            "step": [0, 1, 2],
            "generate_s": [1.0, 2.0, 3.0],
            "sync_ns": [5e8, 5e8, 7e8],
            "update_s": [9.0, 9.0, 9.0],
            "kl_k1": [0.0, 0.1, 0.2],
        }
    )
    run = _dir(tmp_path / "run", "run", {store.METRICS: metrics})
    sweep = _dir(tmp_path / "sweep", "sweep", {store.MICROBATCHES: simulate_sweep()})
    inputs = load_inputs([sweep, run])
    assert inputs.other_phases_s == {}  # given only by --other-phase: a run's phases are its precision's
    phases = inputs.runs[0].phases
    assert phases["generate"] == [1.0, 2.0, 3.0] and phases["update"] == [9.0] * 3
    assert phases["sync"] == pytest.approx([0.5, 0.5, 0.7])


def test_run_directory_alone_cannot_be_fitted(tmp_path: Path) -> None:
    run = _dir(tmp_path / "run", "run", {store.METRICS: pd.DataFrame({"generate_s": [1.0]})})
    with pytest.raises(InputError, match="a run directory alone cannot be fitted"):
        load_inputs([run])


def test_incomplete_directory_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "sweep"
    with pytest.raises(RuntimeError), OutputDir(d, kind="sweep", command=["t"]) as od:
        store.write_table(simulate_sweep(), od.path / store.MICROBATCHES)
        raise RuntimeError("crash")
    with pytest.raises(InputError, match="status 'failed'"):
        load_inputs([d])


def test_one_ingest_of_traces_of_two_precisions_keeps_each_traces_kernels_apart(tmp_path: Path) -> None:
    # e.g. `mxperf ingest traces/*/rank-0.json.gz` over a GPU sweep: one directory, many precisions
    sim = simulate_sweep(sizes=(1024, 4096), repeats=1)
    pairs = zip(sim["precision"], sim["tokens_per_microbatch"], strict=True)
    names = [f"traces/{p}-t{n}.json.gz" for p, n in pairs]
    sim = sim.assign(source="trace", trace=names)
    kernels = pd.DataFrame(
        {
            "trace": [*sorted(set(names)), "traces/unlabelled.json.gz"],
            "kernel_class": ["quantize"] * (sim["trace"].nunique() + 1),
            "total_ns": [1_000_000] * (sim["trace"].nunique() + 1),
        }
    )
    d = _dir(tmp_path / "ing", "ingest", {store.MICROBATCHES: sim, store.KERNELS: kernels})
    inputs = load_inputs([d])
    k = inputs.kernels
    assert k is not None and len(k) == sim["trace"].nunique()  # the unlabelled trace's kernels are left out
    for trace, prec in k[["trace", "precision"]].itertuples(index=False):
        assert trace.split("/")[1].startswith(prec + "-t")
    counts = sim[sim["phase"] == "update"]["precision"].value_counts()
    assert inputs.kernel_microbatches == {p: int(n) for p, n in counts.items()}


def test_folders_that_are_not_fit_inputs_say_what_they_are(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputError, match="not an mxperf output directory"):
        load_inputs([tmp_path / "plain"])
    d = _dir(tmp_path / "consistency", "run", {"consistency.parquet": pd.DataFrame({"kl_k3": [0.1]})})
    with pytest.raises(InputError, match="a run directory without per-step metrics"):
        load_inputs([d])
