"""``mxperf kernels`` and ``mxperf diff`` end to end: a simulated verl BF16 / MXFP8 pair with the truth built in
(``tests/synthetic_traces.py``) is ingested, and the diff's per-micro-batch GEMM / cast / other split and
launch counts are checked against an independent count over the simulator's own launches; the parts add up
to the measured difference; the repository's example pair and bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.compute as pc
import pytest
import synthetic_traces as st

from mxperf.cli import main
from perfmodel.kernels.diff import PARTS, check_closed, side
from tracing.outputs import store

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "runs"
STEPS = ((1024, 512, 2048), (768, 1024, 256), (2048, 512, 768))
CLASS_OF = {
    st.KERNELS["gemm_bf16"]: "gemm",
    st.KERNELS["gemm_mxfp8"]: "gemm",
    st.KERNELS["quant"]: "quantize",
}


def _json_line(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pair")
    out = {}
    for k, prec in enumerate(("bf16", "mxfp8")):
        rank = st.simulate(st.Job(framework="verl-fsdp", precision=prec, steps=STEPS, seed=k))
        trace = st.write_kineto(rank, tmp / prec / "prof_rank-0.json.gz")
        out[prec] = (tmp / f"ing-{prec}", rank)
        assert main(["ingest", str(trace), "-o", str(out[prec][0])]) == 0
    return out


def _independent(rank: st.Rank) -> dict[tuple[str, int, int], dict[str, int]]:
    """Per truth micro-batch: GEMM / quantize / other GPU ns and launches, counted from the simulator's launch
    calls (a launch belongs to the latest-starting micro-batch whose window holds the call)."""
    rows = sorted(rank.truth, key=lambda t: t.start_ns)
    out = {
        (t.phase, t.step, t.microbatch): {"gemm_ns": 0, "quantize_ns": 0, "other_ns": 0, "launches": 0}
        for t in rows
    }
    for h in rank.host:
        if h.gpu is None:
            continue
        held = [t for t in rows if t.start_ns <= h.start < t.end_ns]
        if not held:
            continue
        acc = out[(held[-1].phase, held[-1].step, held[-1].microbatch)]
        cls = CLASS_OF.get(h.gpu.name, "other")
        acc[f"{cls}_ns"] += h.gpu.end - h.gpu.start
        acc["launches"] += 1
    return out


@pytest.mark.parametrize("prec", ["bf16", "mxfp8"])
def test_microbatch_split_matches_an_independent_count(pair, prec):
    folder, rank = pair[prec]
    truth = _independent(rank)
    s = side(folder)
    got = {(r["phase"], r["step"], r["microbatch"]): r for r in s["microbatches"]}
    assert set(got) == set(truth)
    for key, t in truth.items():
        r = got[key]
        for c in ("gemm_ns", "quantize_ns", "other_ns", "launches"):
            assert r[c] == t[c], (key, c)
        # the identity closes in integer ns
        assert r["wall_ns"] == sum(r[p] for p in PARTS)
    if prec == "bf16":
        assert all(r["quantize_ns"] == 0 for r in s["microbatches"])
    else:
        assert all(r["quantize_ns"] > 0 for r in s["microbatches"])


def test_diff_adds_up_and_names_the_kernels_of_one_side(pair, capsys):
    a, b = pair["bf16"][0], pair["mxfp8"][0]
    assert main(["diff", str(a), str(b), "--json"]) == 0
    doc = _json_line(capsys.readouterr().out)
    assert doc["a"]["precision"] == "bf16" and doc["b"]["precision"] == "mxfp8"
    sizes = {(r["phase"], r["tokens"]) for r in doc["by_size"]}
    assert sizes == {(p, n) for p in ("logprob", "update") for n in (256, 512, 768, 1024, 2048)}
    for view in ("by_size", "by_phase", "by_step"):
        assert doc[view]
        for row in doc[view]:
            assert check_closed(row) == pytest.approx(0.0, abs=1e-6)
    for row in doc["by_size"]:  # MXFP8 adds casts and launches, its GEMMs are cheaper (the simulator's costs)
        assert (
            row["delta"]["quantize_ns"] > 0 and row["delta"]["gemm_ns"] < 0 and row["delta"]["launches"] > 0
        )
    assert [r["step"] for r in doc["by_step"]] == [0, 1, 2]
    # logprob and update both run every micro-batch of a step
    assert all(r["tokens_a"] == r["tokens_b"] == 2 * sum(STEPS[r["step"]]) for r in doc["by_step"])
    assert doc["only_a"] == []
    assert {r["name"] for r in doc["only_b"]} == {st.KERNELS["gemm_mxfp8"], st.KERNELS["quant"]}
    assert main(["diff", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "residual" in text and "kernels only in B:" in text
    assert doc["notes"] == []  # every op launched, every host stall measured: nothing to say


def test_a_side_without_launch_calls_says_its_host_stall_and_placement_are_not_measured(
    pair, tmp_path, capsys
):
    """B's trace without its cuda_runtime events: its host stall is not 0 but unknown, and its ops are placed by
    their GPU start; the diff still adds up, and says both (A, launched, says nothing)."""
    rank = st.simulate(st.Job(framework="verl-fsdp", precision="mxfp8", steps=STEPS, seed=1))
    trace = st.write_kineto(rank, tmp_path / "full" / "prof_rank-0.json.gz")
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "cuda_runtime"]
    bare = tmp_path / "bare" / "prof_rank-0.json.gz"
    bare.parent.mkdir()
    bare.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert main(["ingest", str(bare), "-o", str(tmp_path / "ing")]) == 0
    capsys.readouterr()
    assert main(["diff", str(pair["bf16"][0]), str(tmp_path / "ing"), "--json"]) == 0
    got = _json_line(capsys.readouterr().out)
    assert all(check_closed(r) == pytest.approx(0.0, abs=1e-6) for r in got["by_size"])
    n = got["b"]["microbatches"]
    assert [x.split(":")[0] for x in got["notes"]] == ["B", "B"]
    assert f"host stall not measured in {n} of {n} micro-batches" in got["notes"][0]
    assert "have no launch call" in got["notes"][1] and "start on the GPU" in got["notes"][1]


def test_kernels_on_the_example_pair_agree_with_the_kernel_table(capsys):
    folder = EXAMPLES / "ingest-verl-sim-mxfp8"
    assert main(["kernels", str(folder), "--json", "--top", "3", "--device", "b200"]) == 0
    doc = _json_line(capsys.readouterr().out)
    table = store.read_arrow(folder / store.KERNELS)
    for row in doc["classes"]:
        mask = pc.equal(table.column("kernel_class"), row["kernel_class"])
        assert row["total_ns"] == pc.sum(table.filter(mask).column("total_ns")).as_py()
        assert row["count"] == pc.sum(table.filter(mask).column("count")).as_py()
        assert sum(row["per_phase_ns"].values()) <= row["total_ns"]
    assert len(doc["kernels"]) == 3
    top = doc["kernels"][0]
    assert top["total_ns"] == max(table.column("total_ns").to_pylist())
    assert top["shapes"] and top["shapes"][0]["op"] == "aten::linear"
    roof = doc["roofline"]
    assert roof["device"]["id"] == "b200" and roof["gemms"]
    for g in roof["gemms"]:
        assert g["flops"] == 2 * g["batch"] * g["m"] * g["n"] * g["k"]
        assert g["bound"] in ("compute", "memory")


def test_diff_on_the_example_pair_adds_up(capsys):
    a, b = EXAMPLES / "ingest-verl-sim-bf16", EXAMPLES / "ingest-verl-sim-mxfp8"
    assert main(["diff", str(a), str(b), "--json"]) == 0
    doc = _json_line(capsys.readouterr().out)
    assert len(doc["by_size"]) == 16
    for view in ("by_size", "by_phase", "by_step"):
        for row in doc[view]:
            assert check_closed(row) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["kernels", "{trace}"], "a file"),
        (["kernels", "{fit}"], "'fit' folder"),
        (["kernels", "{missing}"], "no such folder"),
        (["kernels", "{ingest}", "--device", "a100"], "not in perfmodel/kernels/devices.toml"),
        (["kernels", "{ingest}", "--top", "-1"], "--top -1"),
        (["diff", "{ingest}", "{metrics}"], "no event tables"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys, tmp_path):
    names = {
        "trace": str(ROOT / "tests/data/real/hta_a100_ddp_rank0_hostbound.json.gz"),
        "fit": str(EXAMPLES / "fit-verl-sim"),
        "missing": str(tmp_path / "nope"),
        "ingest": str(EXAMPLES / "ingest-verl-sim-bf16"),
        "metrics": str(EXAMPLES / "metrics-verl-bf16"),
    }
    assert main([a.format(**names) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mxperf {argv[0]}: error: ") and needle in err[0]


def test_the_cost_models_terms_split_by_part_add_up(capsys):
    import numpy as np

    a, b = EXAMPLES / "ingest-verl-sim-bf16", EXAMPLES / "ingest-verl-sim-mxfp8"
    assert main(["diff", str(a), str(b), "--json"]) == 0
    doc = _json_line(capsys.readouterr().out)
    terms = {t["phase"]: t for t in doc["terms"]}
    assert set(terms) == {"logprob", "update"}
    assert all(t["sizes"] == [8, 8] for t in terms.values())  # distinct sizes per side, shown with the terms
    sides = [side(a)["microbatches"], side(b)["microbatches"]]
    for phase, t in terms.items():
        for term in ("fixed_ns", "per_token_ns"):
            parts = sum(t[term][k] for k in PARTS)
            assert parts == pytest.approx(t[term]["wall_ns"], rel=1e-9, abs=1e-6)
        for key in ("wall_ns", *PARTS):  # each part's line, fitted independently per side
            fits = []
            for rows in sides:
                mine = [r for r in rows if r["phase"] == phase]
                fits.append(np.polyfit([r["tokens"] for r in mine], [r[key] for r in mine], 1))
            slope, intercept = fits[1] - fits[0]
            assert t["fixed_ns"][key] == pytest.approx(intercept, abs=1e-3 * max(1.0, abs(intercept)))
            assert t["per_token_ns"][key] == pytest.approx(slope, abs=1e-6 * max(1.0, abs(slope)))
    # MXFP8's added fixed cost on the update is its cast kernels; its per-token saving is the GEMMs'
    upd = terms["update"]
    assert upd["fixed_ns"]["quantize_ns"] == pytest.approx(upd["fixed_ns"]["wall_ns"], rel=0.01)
    assert upd["per_token_ns"]["gemm_ns"] < upd["per_token_ns"]["wall_ns"] < 0
