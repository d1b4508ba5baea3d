"""Issue #35 item 3 under AppTest: the Kernels and Diff pages. Every number they show is the one the CLI's
JSON gives for the same inputs (``mxperf kernels OUT --top 15 [--device D] --json``, ``mxperf diff A B
--json``, run as child processes); a broken ingest (no kernels.parquet, a table linked from outside RUNS_DIR)
is one clear message on its card, never an exception; the picks are in the URL.

Expected values are converted from the JSON here (ns / 1e6 = ms, ns / 1e3 = us, share x 100 = %), not by the
page's own table code."""

from __future__ import annotations

import base64
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboards import data

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "dashboards" / "app.py"
EXAMPLES = REPO / "examples" / "runs"
BF16, MXFP8 = "ingest-verl-sim-bf16", "ingest-verl-sim-mxfp8"
NAN = float("nan")


def _need(*rels: str) -> None:
    missing = [r for r in rels if not (EXAMPLES / r / "kernels.parquet").is_file()]
    if missing:
        pytest.skip(f"examples/runs lacks {', '.join(missing)}")


def _cli(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "mxperf.cli", *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _open(
    runs: Path, page: str, monkeypatch: pytest.MonkeyPatch, query: dict[str, str] | None = None
) -> AppTest:
    monkeypatch.setenv(data.RUNS_DIR_ENV, str(runs))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params = dict(query or {})
    at.run()
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _frame(at: AppTest, first_column: str, contains: str | None = None) -> pd.DataFrame:
    """The one dataframe on the page whose first column is ``first_column`` (and that has ``contains``)."""
    found = [
        d.value
        for d in at.dataframe
        if list(d.value.columns)[:1] == [first_column] and (contains is None or contains in d.value.columns)
    ]
    assert len(found) == 1, [list(d.value.columns) for d in at.dataframe]
    return found[0]


def _same(got: Any, want: Any, where: str) -> None:
    if want is None or (isinstance(want, float) and math.isnan(want)):
        assert got is None or pd.isna(got), (where, got, want)
    elif isinstance(want, str):
        assert got == want, (where, got, want)
    else:
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12), (where, got, want)


def _check(frame: pd.DataFrame, expected: list[dict[str, Any]], what: str) -> int:
    """Every expected cell equals the page's; the page has exactly these rows. Returns the cells checked."""
    assert len(frame) == len(expected), (what, len(frame), len(expected))
    n = 0
    for i, want in enumerate(expected):
        row = frame.iloc[i]
        for col, value in want.items():
            assert col in frame.columns, (what, col, list(frame.columns))
            _same(row[col], value, f"{what} row {i} {col}")
            n += 1
    return n


def _ms(ns: float | None) -> float:
    return NAN if ns is None else ns / 1e6


def _pct(x: float | None) -> float:
    return NAN if x is None else 100 * x


def _kernel_cells(r: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    cells = {
        "count": r["count"],
        "total ms": r["total_ns"] / 1e6,
        "share of GPU busy %": _pct(r["share_of_busy"]),
        "mean us": r["mean_ns"] / 1e3,
        "max us": r["max_ns"] / 1e3,
    }
    for p, ns in r["per_phase_ns"].items():
        cells[f"{p} ms"] = ns / 1e6
    for p in doc["microbatches"]:
        cells[f"ms per {p} micro-batch"] = _ms(r["per_microbatch_ns"].get(p))
    return cells


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


# --------------------------------------------------------------------------------------------- Kernels
def test_kernels_page_numbers_are_the_cli_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """The BF16 trace with its own device (the H100 its gpu_names say, as the default), then the MXFP8 one on
    B200 (MX peaks): classes, top kernels, communication, roofline; each cell against the CLI's JSON."""
    _need(BF16, MXFP8)
    manifest = json.loads((EXAMPLES / BF16 / "manifest.json").read_text())
    assert manifest["traces"][0]["gpu_names"] == ["NVIDIA H100 80GB HBM3"]  # maps to h100-sxm (alias)
    at = _open(EXAMPLES, "kernels", monkeypatch)
    at.selectbox(key="kn_ingest").set_value(BF16).run()
    assert at.selectbox(key="kn_device").value == "h100-sxm"  # the default: the trace's device
    cells = 0
    for rel, dev in ((BF16, "h100-sxm"), (MXFP8, "b200")):
        at.selectbox(key="kn_ingest").set_value(rel).run()
        at.selectbox(key="kn_device").set_value(dev).run()
        assert not at.exception and not at.warning, [w.value for w in at.warning]
        doc = _cli("kernels", str(EXAMPLES / rel), "--top", "15", "--device", dev)
        m = _metrics(at)
        assert m["GPU busy"] == f"{doc['busy_ns'] / 1e6:,.1f} ms"  # 1 decimal: fits its card at 1280 px
        assert m["GPU ops"] == f"{doc['ops']:,}"
        assert m["GPU op time, summed"] == f"{doc['op_ns'] / 1e6:,.1f} ms"
        assert m["Micro-batches"] == f"{sum(doc['microbatches'].values()):,}"
        per_phase = ", ".join(f"{p} {n}" for p, n in doc["microbatches"].items())
        assert any(f"Micro-batches per phase: {per_phase} (" in str(c.value) for c in at.caption)
        cells += _check(
            _frame(at, "class"),
            [{"class": r["kernel_class"], **_kernel_cells(r, doc)} for r in doc["classes"]],
            f"{rel} classes",
        )
        kernels = _frame(at, "kernel", "share of GPU busy %")
        cells += _check(
            kernels,
            [
                {"kernel": r["name"], "class": r["kernel_class"], **_kernel_cells(r, doc)}
                for r in doc["kernels"]
            ],
            f"{rel} kernels",
        )
        gemm = next(i for i, r in enumerate(doc["kernels"]) if r["shapes"])
        for s in doc["kernels"][gemm]["shapes"]:
            assert (
                f"{s['op']} {s['shapes']} x{s['count']}"
                in kernels.iloc[gemm]["GEMM shapes (op, input shapes, count)"]
            )
        comm = doc["communication"]
        cells += _check(
            _frame(at, "step", "busy union ms"),
            [
                {
                    "step": r["step"],
                    "rank": r["rank"],
                    "kernels": r["kernels"],
                    "comm ms": r["comm_ns"] / 1e6,
                    "busy union ms": r["comm_union_ns"] / 1e6,
                    "overlapped ms": r["overlapped_ns"] / 1e6,
                    "exposed ms": r["exposed_ns"] / 1e6,
                    "overlap % of union": _pct(r["overlap_share"]),
                    "rank's step ms": _ms(r["step_ns"]),
                    "exposed % of step": _pct(r["exposed_share_of_step"]),
                }
                for r in comm["per_rank_step"]
            ],
            f"{rel} communication",
        )
        roof = doc["roofline"]
        assert roof["device"]["id"] == dev and roof["gemms"]
        cells += _check(
            _frame(at, "kernel", "% of peak"),
            [
                {
                    "kernel": g["kernel"],
                    "precision": g["precision"],
                    "B": g["batch"],
                    "M": g["m"],
                    "N": g["n"],
                    "K": g["k"],
                    "count": g["count"],
                    "mean us": g["mean_ns"] / 1e3,
                    "GFLOP": g["flops"] / 1e9,
                    "MB": g["bytes"] / 1e6,
                    "FLOP per byte": g["intensity"],
                    "achieved TFLOP/s": g["achieved_flops"] / 1e12,
                    "peak TFLOP/s": NAN if g["peak_flops"] is None else g["peak_flops"] / 1e12,
                    "% of peak": _pct(g["fraction_of_peak"]),
                    "bound": g["bound"] or "",
                    "floor us": NAN if g["floor_ns"] is None else g["floor_ns"] / 1e3,
                    "shapes": g["shapes"],
                }
                for g in roof["gemms"]
            ],
            f"{rel} roofline",
        )
        captions = " ".join(str(c.value) for c in at.caption)
        for note in roof["notes"]:
            assert note in captions
        assert roof["device"]["name"] in captions
    # H100 has no MX tensor cores: the MXFP8 GEMMs have no peak there, and the page says why (the CLI's note)
    at.selectbox(key="kn_device").set_value("h100-sxm").run()
    doc = _cli("kernels", str(EXAMPLES / MXFP8), "--top", "15", "--device", "h100-sxm")
    table = _frame(at, "kernel", "% of peak")
    mx = [i for i, g in enumerate(doc["roofline"]["gemms"]) if g["precision"] == "mxfp8"]
    assert mx and all(pd.isna(table.iloc[i]["% of peak"]) for i in mx)
    assert any("no MX tensor cores" in str(c.value) for c in at.caption)
    assert cells > 500, cells


def test_kernels_page_multi_rank_communication_and_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """ingest-2rank: two ranks, no micro-batches, no device in gpu_names -> no roofline card, per step the
    slowest rank; --top all."""
    _need("ingest-2rank")
    at = _open(EXAMPLES, "kernels", monkeypatch)
    at.selectbox(key="kn_ingest").set_value("ingest-2rank").run()
    assert at.selectbox(key="kn_device").value == "(none)"
    at.selectbox(key="kn_top").set_value(0).run()
    assert not at.exception and not at.warning
    doc = _cli("kernels", str(EXAMPLES / "ingest-2rank"), "--top", "0")
    assert "roofline" not in doc and not [d for d in at.dataframe if "% of peak" in d.value.columns]
    assert _metrics(at)["Micro-batches"] == "0"
    assert any("Micro-batches per phase: none found" in str(c.value) for c in at.caption)
    assert len(_frame(at, "kernel", "share of GPU busy %")) == len(doc["kernels"]) > 15
    _check(
        _frame(at, "step", "slowest rank"),
        [
            {
                "step": s["step"],
                "ranks": s["ranks"],
                "comm ms": s["comm_ns"] / 1e6,
                "exposed ms": s["exposed_ns"] / 1e6,
                "slowest rank": s["slowest_rank"],
                "slowest rank's step ms": _ms(s["slowest_step_ns"]),
                "its exposed %": _pct(s["slowest_exposed_share"]),
            }
            for s in doc["communication"]["per_step"]
        ],
        "2rank per step",
    )
    assert any("pick one for the roofline" in str(c.value) for c in at.caption)


# --------------------------------------------------------------------------------------------- Diff
DIFF_COLS = {
    "gemm_ns": "GEMM ms",
    "quantize_ns": "casts / quantize ms",
    "other_ns": "other kernels ms",
    "host_stall_ns": "host stall ms",
    "residual_ns": "residual ms",
    "outside_ns": "outside micro-batches ms",
}


def _diff_cells(r: dict[str, Any], view: str) -> dict[str, Any]:
    if view == "size":
        head = {
            "phase": r["phase"],
            "tokens": r["tokens"],
            "micro-batches A": r["n_a"],
            "micro-batches B": r["n_b"],
        }
    elif view == "phase":
        head = {"phase": r["phase"], "steps": r["steps"]}
    else:
        head = {"step": r["step"], "tokens A": r["tokens_a"], "tokens B": r["tokens_b"]}
    d = r["delta"]
    cells = {**head, "A wall ms": r["a"]["wall_ns"] / 1e6, "B wall ms": r["b"]["wall_ns"] / 1e6}
    cells["B - A ms"] = d["wall_ns"] / 1e6
    cells.update({col: d[k] / 1e6 for k, col in DIFF_COLS.items() if k in d})
    cells["launches added"] = d["launches"]
    return cells


def _chart_bars(at: AppTest) -> dict[str, list[float]]:
    charts = at.get("plotly_chart")
    assert len(charts) == 1
    spec = json.loads(charts[0].proto.spec)
    return {t["name"]: _values(t["y"]) for t in spec["data"]}


def _values(y: Any) -> list[float]:
    """A trace's y as plotly's JSON holds it: a list, or a typed array (base64 of its bytes)."""
    if isinstance(y, dict):
        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"])).tolist()
    return list(y)


def test_diff_page_numbers_are_the_cli_json_for_the_examples_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    _need(BF16, MXFP8)
    doc = _cli("diff", str(EXAMPLES / BF16), str(EXAMPLES / MXFP8))
    at = _open(EXAMPLES, "diff", monkeypatch)
    # the sidebar pair is the tiny-dense runs (no kernels): the page starts from the BF16 / MXFP8 traces
    assert (at.selectbox(key="df_a").value, at.selectbox(key="df_b").value) == (BF16, MXFP8)
    assert not at.warning, [w.value for w in at.warning]
    cells = 0
    for view, key in (("size", "by_size"), ("phase", "by_phase"), ("step", "by_step")):
        at.radio(key="df_by").set_value(view).run()
        assert not at.exception and not at.warning
        first = {"size": "phase", "phase": "phase", "step": "step"}[view]
        frame = _frame(at, first, "B - A ms")
        cells += _check(frame, [_diff_cells(r, view) for r in doc[key]], view)
        bars = _chart_bars(at)  # the stacked bars are these numbers too
        assert bars["B - A (measured)"] == pytest.approx([r["delta"]["wall_ns"] / 1e6 for r in doc[key]])
        assert bars["GEMM"] == pytest.approx([r["delta"]["gemm_ns"] / 1e6 for r in doc[key]])
        assert bars["casts / quantize"] == pytest.approx([r["delta"]["quantize_ns"] / 1e6 for r in doc[key]])
        assert ("outside micro-batches" in bars) == (view != "size")
    update = next(r for r in doc["by_phase"] if r["phase"] == "update")
    assert update["delta"]["gemm_ns"] < 0 < update["delta"]["quantize_ns"]  # GEMM saved, casts added
    assert not doc["only_a"] and doc["only_b"]
    cells += _check(
        _frame(at, "kernel", "ms per micro-batch"),
        [
            {
                "kernel": r["name"],
                "class": r["kernel_class"],
                "count": r["count"],
                "total ms": r["total_ns"] / 1e6,
                "ms per micro-batch": _ms(r["per_microbatch_ns"]),
            }
            for r in doc["only_b"]
        ],
        "only in B",
    )
    assert any("No kernel found only in A" in str(c.value) for c in at.caption)
    assert cells > 300, cells


def test_diff_page_follows_the_sidebar_pair_of_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    _need(BF16, MXFP8)
    at = _open(EXAMPLES, "diff", monkeypatch)
    box = at.sidebar.selectbox(key="pair_choice")
    (option,) = [o for o in box.options if o.startswith("unlabelled-v32000-h1024:")]  # the verl-sim traces
    box.set_value("Choose two outputs…").run()
    at.sidebar.selectbox(key="pair_base").set_value(MXFP8).run()
    at.sidebar.selectbox(key="pair_other").set_value(BF16).run()
    assert (at.selectbox(key="df_a").value, at.selectbox(key="df_b").value) == (MXFP8, BF16)
    doc = _cli("diff", str(EXAMPLES / MXFP8), str(EXAMPLES / BF16))
    _check(_frame(at, "phase", "B - A ms"), [_diff_cells(r, "size") for r in doc["by_size"]], "swapped")
    at.sidebar.selectbox(key="pair_choice").set_value(option).run()
    assert (at.selectbox(key="df_a").value, at.selectbox(key="df_b").value) == (BF16, MXFP8)


# --------------------------------------------------------------------------------------------- bad input
@pytest.fixture
def broken_runs(tmp_path: Path) -> Path:
    _need(BF16, MXFP8)
    runs = tmp_path / "runs"
    runs.mkdir()
    for rel in (BF16, MXFP8):
        shutil.copytree(EXAMPLES / rel, runs / rel)
    shutil.copytree(EXAMPLES / BF16, runs / "ingest-old")
    (runs / "ingest-old" / "kernels.parquet").unlink()  # an ingest made before kernels.parquet existed
    shutil.copytree(EXAMPLES / MXFP8, runs / "ingest-linked")
    outside = tmp_path / "outside.parquet"
    shutil.copy(runs / "ingest-linked" / "kernels.parquet", outside)
    (runs / "ingest-linked" / "kernels.parquet").unlink()
    (runs / "ingest-linked" / "kernels.parquet").symlink_to(outside)
    return runs


def _one_warning(at: AppTest, *needles: str) -> str:
    assert not at.exception, [e.value for e in at.exception]
    texts = [str(w.value) for w in at.warning] + [str(e.value) for e in at.error]
    assert len(texts) == 1, texts
    for n in needles:
        assert n in texts[0], texts[0]
    return texts[0]


def test_an_ingest_without_kernels_parquet_is_one_clear_message(
    broken_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(broken_runs, "kernels", monkeypatch)
    at.selectbox(key="kn_ingest").set_value("ingest-old").run()
    msg = _one_warning(at, "ingest-old", "no kernels.parquet", "re-run mxperf ingest")
    assert str(broken_runs) not in msg  # named relative to RUNS_DIR
    at.selectbox(key="kn_ingest").set_value(BF16).run()  # the page goes on with a good one
    assert not at.warning and _frame(at, "class") is not None

    at = _open(broken_runs, "diff", monkeypatch)
    at.selectbox(key="df_a").set_value("ingest-old").run()
    at.selectbox(key="df_b").set_value(MXFP8).run()
    _one_warning(at, "ingest-old", "no kernels.parquet")


def test_a_table_linked_from_outside_runs_dir_is_not_read(
    broken_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(broken_runs, "kernels", monkeypatch)
    at.selectbox(key="kn_ingest").set_value("ingest-linked").run()
    _one_warning(at, "ingest-linked/kernels.parquet", "outside the runs directory")
    assert not at.dataframe


# --------------------------------------------------------------------------------------------- URL
def test_kernels_and_diff_picks_round_trip_through_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    _need(BF16, MXFP8)
    at = _open(EXAMPLES, "kernels", monkeypatch)
    at.selectbox(key="kn_ingest").set_value(MXFP8).run()
    at.selectbox(key="kn_top").set_value(5).run()
    at.selectbox(key="kn_device").set_value("gb200").run()
    at.switch_page("views/diff.py").run()
    at.selectbox(key="df_a").set_value(MXFP8).run()
    at.selectbox(key="df_b").set_value(BF16).run()
    at.radio(key="df_by").set_value("step").run()
    query = {k: at.query_params[k] for k in ("ingest", "top", "device", "diff_a", "diff_b", "by")}
    assert query == {
        "ingest": [MXFP8] if isinstance(at.query_params["ingest"], list) else MXFP8,
        "top": ["5"] if isinstance(at.query_params["top"], list) else "5",
        "device": ["gb200"] if isinstance(at.query_params["device"], list) else "gb200",
        "diff_a": [MXFP8] if isinstance(at.query_params["diff_a"], list) else MXFP8,
        "diff_b": [BF16] if isinstance(at.query_params["diff_b"], list) else BF16,
        "by": ["step"] if isinstance(at.query_params["by"], list) else "step",
    }
    flat = {k: v[0] if isinstance(v, list) else v for k, v in query.items()}
    again = _open(EXAMPLES, "kernels", monkeypatch, flat)  # a new session opened with that link
    assert again.selectbox(key="kn_ingest").value == MXFP8
    assert again.selectbox(key="kn_top").value == 5
    assert again.selectbox(key="kn_device").value == "gb200"
    assert len(_frame(again, "kernel", "share of GPU busy %")) == 5
    again.switch_page("views/diff.py").run()
    assert (again.selectbox(key="df_a").value, again.selectbox(key="df_b").value) == (MXFP8, BF16)
    assert again.radio(key="df_by").value == "step"
    bad = _open(
        EXAMPLES, "kernels", monkeypatch, {"device": "no-such-gpu", "top": "7"}
    )  # not offered: ignored
    assert bad.selectbox(key="kn_top").value == 15 and not bad.exception


# --------------------------------------------------------------------------------------------- other folders
@pytest.fixture(scope="module")
def fixture_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/dash_fixtures' RUNS_DIR (runs, a sweep and fit, two ingested Kineto traces, metric logs) with its
    broken, linked and odd outputs."""
    import dash_fixtures

    root = dash_fixtures.make_runs_dir(tmp_path_factory.mktemp("kn-fixtures") / "runs")
    dash_fixtures.add_broken_outputs(root)
    dash_fixtures.add_symlinked_outputs(root, tmp_path_factory.mktemp("kn-outside"))
    return dash_fixtures.add_odd_outputs(root)


@pytest.mark.parametrize("page", ["kernels", "diff"])
def test_every_pick_on_a_messy_folder_gives_tables_or_messages_not_exceptions(
    page: str, fixture_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dash_fixtures

    at = _open(fixture_runs, page, monkeypatch)
    key = {"kernels": "kn_ingest", "diff": "df_a"}[page]
    options = at.selectbox(key=key).options
    assert "ingest-gpu" in options and not [o for o in options if "metric" in o]  # metric logs: no kernels
    for rel in options:
        at.selectbox(key=key).set_value(rel).run()
        assert not at.exception, (rel, [e.value for e in at.exception])
        shown = [str(w.value) for w in at.warning]
        assert at.dataframe or shown, rel  # a table, or the reason there is none
        assert dash_fixtures.SECRET not in " ".join(shown + [d.value.to_string() for d in at.dataframe])


@pytest.mark.parametrize("page", ["kernels", "diff"])
def test_an_empty_runs_dir_says_how_to_get_traces(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(tmp_path, page, monkeypatch)
    assert any("mxperf ingest" in str(i.value) for i in at.info)


def test_the_kernels_and_diff_pages_say_when_ops_have_no_launch_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ingest of a trace without its cuda_runtime events: both pages show the CLI's notes (ops placed by
    their GPU start; host stall not measured), not per-micro-batch figures with nothing said."""
    import gzip

    import synthetic_traces as st_traces

    from mxperf.cli import main

    runs = tmp_path / "runs"
    for prec in ("bf16", "mxfp8"):
        job = st_traces.Job(framework="verl-fsdp", precision=prec, steps=((512, 1024), (2048,)), seed=1)
        full = st_traces.write_kineto(st_traces.simulate(job), tmp_path / prec / "prof_rank-0.json.gz")
        doc = json.loads(gzip.decompress(full.read_bytes()))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "cuda_runtime"]
        full.write_bytes(gzip.compress(json.dumps(doc).encode()))
        assert main(["ingest", str(full), "-o", str(runs / f"bare-{prec}"), "--no-progress"]) == 0
    want = _cli("kernels", str(runs / "bare-bf16"))["notes"]
    assert len(want) == 1 and "have no launch call" in want[0]
    at = _open(runs, "kernels", monkeypatch)
    at.selectbox(key="kn_ingest").set_value("bare-bf16").run()
    assert [str(w.value) for w in at.warning] == [f"Note: {want[0]}"]
    at = _open(runs, "diff", monkeypatch)
    at.selectbox(key="df_a").set_value("bare-bf16").run()
    at.selectbox(key="df_b").set_value("bare-mxfp8").run()
    shown = " ".join(str(w.value) for w in at.warning)
    assert "A: host stall not measured" in shown and "B: " in shown and "have no launch call" in shown
