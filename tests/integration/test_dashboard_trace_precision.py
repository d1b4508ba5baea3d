"""Issue #35 item 6 under AppTest: the precision and model found in a trace (an ingest's manifest
``traces[].precision_evidence``, its micro-batches' ``model``) pair BF16 vs MXFP8 in the sidebar and are shown
on Runs with the evidence; a label the kernels contradict is shown as such."""

from __future__ import annotations

import json
from pathlib import Path

import dash_fixtures
import pytest
from streamlit.testing.v1 import AppTest

from dashboards import data
from tracing.outputs import store

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "dashboards" / "app.py"
EXAMPLES = REPO / "examples" / "runs"
SIM = ("ingest-verl-sim-bf16", "ingest-verl-sim-mxfp8")


def _open(runs: Path, page: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    if page != "overview":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _sim() -> list[dict]:
    if not all((EXAMPLES / s / store.MANIFEST).is_file() for s in SIM):
        pytest.skip("examples/runs lacks the verl-sim ingests")
    return [json.loads((EXAMPLES / s / store.MANIFEST).read_text()) for s in SIM]


def test_the_verl_sim_pair_found_in_its_traces_is_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = _sim()
    found = [m["traces"][0]["precision_evidence"]["precision"] for m in manifests]
    assert found == ["bf16", "mxfp8"]  # what the kernels say; neither ingest is labelled
    assert not any((m["config"].get("labels") or {}).get("precision") for m in manifests)
    at = _open(EXAMPLES, "step_time", monkeypatch)
    option = "unlabelled-v32000-h1024: bf16 vs mxfp8"  # the model from the embedding table's shape
    assert option in at.sidebar.selectbox(key="pair_choice").options
    at.sidebar.selectbox(key="pair_choice").set_value(option).run()
    assert not at.exception
    captions = " ".join(str(c.value) for c in at.sidebar.caption)
    assert f"Baseline `{SIM[0]}`" in captions and f"compared `{SIM[1]}`" in captions
    for m in manifests:  # the evidence, as the manifest words it
        assert m["traces"][0]["precision_evidence"]["reason"] in captions


def test_runs_shows_precision_model_and_evidence_found_in_the_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = _sim()
    at = _open(EXAMPLES, "runs", monkeypatch)
    table = at.dataframe[0].value.set_index("path")
    for rel, m in zip(SIM, manifests, strict=True):
        ev = m["traces"][0]["precision_evidence"]
        row = table.loc[rel]
        assert row["precisions"] == ev["precision"]  # was blank
        assert row["model"] == "unlabelled-v32000-h1024"  # was None
        assert ev["reason"] in row["found in trace"] and "used" in row["found in trace"]
        assert "embedding" in row["found in trace"]
        assert row["label vs kernels"] is None
    pairs = at.dataframe[1].value
    assert ((pairs["baseline"] == SIM[0]) & (pairs["compared"] == SIM[1])).any()
    # a trace whose kernels name no precision id (FP32 GEMMs) says so and is not given one
    if "ingest-a100-hostbound" in table.index:
        row = table.loc["ingest-a100-hostbound"]
        assert row["precisions"] == "" and "fp32" in row["found in trace"]


@pytest.fixture(scope="module")
def mislabelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BF16 trace ingested by the real ``mxperf ingest`` with ``--label precision=mxfp8``."""
    import synthetic_traces as syn

    root = tmp_path_factory.mktemp("mislabelled") / "runs"
    trace = syn.write_kineto(
        syn.simulate(syn.Job(precision="bf16", steps=((1024, 1024), (2048, 512)))),
        root.parent / "bf16" / "rank-0.json.gz",
    )
    dash_fixtures.ingest(root, "ingest-labelled-mxfp8", [trace], "--label", "model=verl-like,precision=mxfp8")
    return root


def test_a_label_the_kernels_contradict_is_shown(mislabelled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = json.loads((mislabelled / "ingest-labelled-mxfp8" / store.MANIFEST).read_text())
    (ev,) = [t["precision_evidence"] for t in manifest["traces"] if t.get("precision_evidence")]
    assert ev["precision"] == "bf16"  # the kernels' word, against the label
    at = _open(mislabelled, "runs", monkeypatch)
    row = at.dataframe[0].value.set_index("path").loc["ingest-labelled-mxfp8"]
    assert row["precisions"] == "mxfp8"  # the label is kept, as mxperf ingest keeps it
    assert row["label vs kernels"] == "labelled mxfp8, but the GEMM kernels say bf16"
    assert "label used" in row["found in trace"]
    warning = " ".join(str(w.value) for w in at.warning)
    assert "ingest-labelled-mxfp8" in warning and "labelled mxfp8, but the GEMM kernels say bf16" in warning
