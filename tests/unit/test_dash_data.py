"""dashboards.data: discovery, manifest summaries, RUNS_DIR confinement, per-output errors."""

from __future__ import annotations

import os
from pathlib import Path

import dash_fixtures
import pandas as pd
import pytest

from dashboards import data
from tracing.outputs import store


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = dash_fixtures.make_runs_dir(tmp_path_factory.mktemp("runs"))
    dash_fixtures.add_broken_outputs(root)
    return dash_fixtures.add_symlinked_outputs(root, tmp_path_factory.mktemp("outside"))


def _by_rel(runs: Path) -> dict[str, data.OutputEntry]:
    return {e.rel: e for e in data.discover_outputs(runs)}


def test_discovery_finds_every_output_dir_and_summarizes_manifests(runs: Path) -> None:
    entries = _by_rel(runs)
    assert {"run-bf16", "run-mxfp8", "sweep-tiny-dense", "fit-tiny-dense", "ingest-gpu"} <= set(entries)
    run = entries["run-mxfp8"]
    assert (run.kind, run.status, run.model, run.learner, run.sampler) == (
        "run",
        "complete",
        "tiny-dense",
        "mxfp8",
        "mxfp8",
    )
    assert run.steps == dash_fixtures.STEPS
    assert entries["sweep-tiny-dense"].precision_label == "bf16, mxfp8"


def test_discovery_does_not_descend_into_events_or_trace_folders(runs: Path) -> None:
    assert not any(rel.startswith("ingest-gpu/") for rel in _by_rel(runs))


def test_unreadable_manifest_is_an_entry_with_its_error_not_a_crash(runs: Path) -> None:
    bad = _by_rel(runs)["bad-manifest"]
    assert not bad.usable
    assert "not valid JSON" in bad.error


def test_entries_frame_marks_running_and_failed_outputs_with_a_reason(runs: Path) -> None:
    table = data.entries_frame(data.discover_outputs(runs)).set_index("path")
    assert table.loc["run-halfwritten", "status"] == "running"
    assert "still being written" in table.loc["run-halfwritten", "problem"]
    assert "out of memory" in table.loc["run-failed", "problem"]
    assert table.loc["bad-manifest", "status"] == "unreadable"
    assert pd.isna(table.loc["run-bf16", "problem"])


def test_half_written_output_is_refused_with_status_in_the_message(runs: Path) -> None:
    half = _by_rel(runs)["run-halfwritten"]
    with pytest.raises(data.CardError, match="status: running"):
        data.load_table(runs, half, store.METRICS)


def test_corrupt_table_raises_card_error_naming_the_file(runs: Path) -> None:
    corrupt = _by_rel(runs)["run-corrupt"]
    with pytest.raises(data.CardError, match=r"run-corrupt/metrics\.parquet: not a readable Parquet"):
        data.load_table(runs, corrupt, store.METRICS)


def test_missing_table_is_card_error_or_none_when_optional(runs: Path) -> None:
    sweep = _by_rel(runs)["sweep-tiny-dense"]
    with pytest.raises(data.CardError, match=r"has no sync_checks\.parquet"):
        data.load_table(runs, sweep, store.SYNC_CHECKS)
    assert data.load_table(runs, sweep, store.SYNC_CHECKS, required=False) is None


def test_paths_outside_runs_dir_are_refused(runs: Path) -> None:
    with pytest.raises(data.CardError, match="outside the runs directory"):
        data.resolve_inside(runs, "../etc/passwd")
    with pytest.raises(data.CardError, match="outside the runs directory"):
        data.resolve_inside(runs, "/etc/passwd")
    assert (
        data.resolve_inside(runs, "run-bf16/metrics.parquet") == runs.resolve() / "run-bf16/metrics.parquet"
    )


def test_symlink_escaping_runs_dir_is_refused(runs: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret.parquet"
    outside.write_bytes(b"x")
    link = runs / "run-bf16" / "escape.parquet"
    os.symlink(outside, link)
    try:
        entry = _by_rel(runs)["run-bf16"]
        with pytest.raises(data.CardError, match="outside the runs directory"):
            data.load_table(runs, entry, "escape.parquet")
    finally:
        link.unlink()


def test_runs_dir_from_env_rejects_a_missing_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(data.InputError, match="does not exist"):
        data.runs_dir_from_env()
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(tmp_path))
    assert data.runs_dir_from_env() == tmp_path.resolve()


def test_list_files_finds_rank_tables(runs: Path) -> None:
    ingest = _by_rel(runs)["ingest-gpu"]
    assert data.list_files(runs, ingest, "events/rank-*.parquet") == [
        "events/rank-0.parquet",
        "events/rank-1.parquet",
    ]


def test_fit_inputs_are_matched_by_trailing_path() -> None:
    fit = data.OutputEntry(
        rel="fits/a",
        kind="fit",
        status="complete",
        manifest={"config": {"inputs": ["examples/runs/sweeps/s1/", "/abs/x/s2"]}},
    )
    cands = [data.OutputEntry(rel=r, kind="sweep", status="complete") for r in ("sweeps/s1", "s2", "s3", "1")]
    assert [e.rel for e in data.inputs_of(fit, cands)] == ["sweeps/s1", "s2"]


def test_a_manifest_linked_from_outside_is_never_read(runs: Path) -> None:
    entries = _by_rel(runs)
    linked = entries["linked-manifest"]
    assert not linked.usable and linked.model is None
    assert "outside the runs directory" in linked.error and "link" in linked.error
    assert dash_fixtures.SECRET not in repr(data.entries_frame(list(entries.values())).to_dict())
    assert not any(rel.startswith("linked-folder") for rel in entries)  # linked folders are not walked


def test_a_table_linked_from_outside_is_refused_on_its_card_not_a_crash(runs: Path) -> None:
    run = _by_rel(runs)["run-linked-sync"]
    assert data.has_file(runs, run, store.SYNC_CHECKS)  # listed, so the page says why it cannot show it
    assert data.file_stamp(runs, run, store.SYNC_CHECKS) == 0  # the cache key never raises
    with pytest.raises(data.CardError, match="outside the runs directory"):
        data.load_table(runs, run, store.SYNC_CHECKS)


def test_list_files_never_offers_a_link_leaving_runs_dir(runs: Path) -> None:
    ingest = _by_rel(runs)["ingest-gpu"]
    assert (runs / "ingest-gpu" / "events" / "rank-9.parquet").is_symlink()
    assert "events/rank-9.parquet" not in data.list_files(runs, ingest, "events/rank-*.parquet")


def test_a_fit_takes_device_and_emulation_from_its_inputs(runs: Path) -> None:
    fit = _by_rel(runs)["fit-tiny-dense"]
    assert fit.device.startswith("CPU") and fit.low_precision == "emulated"
    broken = _by_rel(runs)["fit-of-broken-sweep"]
    assert broken.device == "not recorded"


def test_ingested_gpu_trace_shows_the_gpu_that_made_it(runs: Path) -> None:
    ingest = _by_rel(runs)["ingest-gpu"]
    assert ingest.device == f"2 x {dash_fixtures.GPU_NAME} (from the trace)"
    table = data.entries_frame(list(_by_rel(runs).values())).set_index("path")
    assert table.loc["run-mxfp8", "low precision"] == "emulated"
    assert table.loc["run-bf16", "low precision"] == "n/a"
