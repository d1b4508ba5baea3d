"""Issue #35 "Must show": one sweep over every page of the dashboard on examples/runs (AppTest, the real pages)
that checks the numbers each page shows against the files they come from, read here directly with pandas /
json -- never through the dashboard's own functions. A shown number equals the file's value rounded to the
digits shown (:func:`_shown`). The per-page tests (test_dashboard_answer, _v3, _item1, _kernels, _timeline)
check more of each page; this one makes sure no page is left out. The sweep reports what it checked per page
in ``tests/artifacts/dashboard-numbers-checked.json``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import test_dashboard_answer as ta
from streamlit.testing.v1 import AppTest

from tracing.outputs import store

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "runs"
ARTIFACTS = REPO / "tests" / "artifacts"
GPU_KINDS = {"kernel", "memcpy", "memset"}
CPU_KINDS = {"cpu_op", "runtime", "driver", "python"}
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def _shown(text: object, value: float) -> bool:
    """``text`` (a number as the page shows it: thousands commas, a unit after it; or a number cell, rounded
    by the page or kept whole) is ``value`` rounded to the digits shown."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        if math.isclose(float(text), value, rel_tol=1e-9, abs_tol=1e-15):
            return True
        text = repr(float(text))  # a cell the page rounded (1222.85 for 1222.847): its digits say how far
    m = NUMBER.search(str(text))
    assert m, f"no number in {text!r}"
    raw = m.group(0).replace(",", "")
    if "e" in raw:
        mant = raw.split("e")[0]
        decimals = len(mant.split(".")[1]) if "." in mant else 0
        tol = 0.5 * 10 ** (int(raw.split("e")[1]) - decimals)
    else:
        tol = 0.5 * 10 ** -(len(raw.split(".")[1]) if "." in raw else 0)
    return abs(float(raw) - value) <= tol * (1 + 1e-9)


def _numbers(text: str) -> list[str]:
    return [n for n in NUMBER.findall(text)]


def _read(rel: str, name: str) -> pd.DataFrame:
    return pd.read_parquet(EXAMPLES / rel / name)


def _frame(at: AppTest, first: str, where: str) -> pd.DataFrame:
    for df in at.dataframe:
        v = df.value
        if len(v.columns) and v.columns[0] == first:
            return v
    raise AssertionError(f"{where}: no table starting with column {first!r}")


def _open(monkeypatch: pytest.MonkeyPatch, page: str) -> AppTest:
    from dashboards import data

    monkeypatch.setenv(data.RUNS_DIR_ENV, str(EXAMPLES))
    at = AppTest.from_file(str(REPO / "dashboards" / "app.py"), default_timeout=90)
    at.run()
    if page != "overview":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, (page, [e.value for e in at.exception])
    return at


# --------------------------------------------------------------------------------------------- per page
def _overview(at: AppTest, n: list[str]) -> None:
    rel = at.selectbox(key="ov_fit").value
    doc = json.loads((EXAMPLES / rel / store.FITS).read_text())
    lines = doc["answer"] if doc.get("step_model") else [m["answer"] for m in doc["models"]]
    shown = ta._markdown(at)
    for line in lines:
        assert line in shown, line
        n.append(f"{rel}/fits.json answer: {line[:60]}")


def _runs(at: AppTest, n: list[str]) -> None:
    table = _frame(at, "path", "runs")
    for row in table.itertuples():
        manifest = json.loads((EXAMPLES / row.path / store.MANIFEST).read_text())
        assert row.kind == manifest["kind"] and row.status == manifest["status"], row
        if manifest.get("steps_completed") is not None and row.steps is not None:
            assert int(row.steps) == manifest["steps_completed"], (row.path, row.steps)
            n.append(f"{row.path}/manifest.json steps_completed")
        n.append(f"{row.path}/manifest.json kind, status")


def _steady(values: pd.Series) -> pd.Series:
    """The steps the medians use: the warm-up (first) step left out when there are >= 3 steps."""
    return values.iloc[1:] if len(values) >= 3 else values


def _step_time(at: AppTest, n: list[str]) -> None:
    pair = at.sidebar.selectbox(key="pair_choice").value
    assert pair == "tiny-dense: bf16 vs mxfp8", pair  # the examples' default pair: two runs
    metrics = {p: _read(f"run-tiny-dense-{p}", store.METRICS) for p in ("bf16", "mxfp8")}
    medians = [m.value for m in at.metric if str(m.label).startswith("median step")]
    for shown, prec in zip(medians, ("bf16", "mxfp8"), strict=True):
        assert _shown(shown, _steady(metrics[prec]["step_s"]).median()), (prec, shown)
        n.append(f"run-tiny-dense-{prec}/metrics.parquet step_s median")
    table = _frame(at, "phase", "step_time").set_index("phase")
    columns = {p: next(c for c in table.columns if c.startswith(f"{p} s")) for p in ("bf16", "mxfp8")}
    for phase, col in (("generate", "generate_s"), ("logprob", "logprob_s"), ("update", "update_s")):
        for prec in ("bf16", "mxfp8"):
            med, q1, q3 = _numbers(str(table.loc[phase, columns[prec]]))[:3]
            steady = _steady(metrics[prec][col])
            for text, q in ((med, 0.5), (q1, 0.25), (q3, 0.75)):
                assert _shown(text, steady.quantile(q)), (prec, phase, text, steady.quantile(q))
            n.append(f"run-tiny-dense-{prec}/metrics.parquet {col} median, q1, q3")


def _entry(at: AppTest, doc: dict[str, Any]) -> dict[str, Any]:
    label = str(at.selectbox(key="be_entry").value)
    return next(m for m in doc["models"] if label.startswith(f"{m['model']} / {m['phase']}"))


def _breakeven(at: AppTest, n: list[str]) -> None:
    rel = at.selectbox(key="be_fit").value
    doc = json.loads((EXAMPLES / rel / store.FITS).read_text())
    entry = _entry(at, doc)
    be = _frame(at, "basis", "breakeven").set_index("basis")
    for basis, key in (
        ("wall clock", "breakeven"),
        ("GPU busy (host overhead removed)", "breakeven_gpu_busy"),
    ):
        fact = entry.get(key)
        if not fact or fact.get("tokens") is None or basis not in be.index:
            continue
        assert _shown(be.loc[basis, "n* tokens"], fact["tokens"]), (basis, be.loc[basis, "n* tokens"])
        lo, hi = _numbers(str(be.loc[basis, "95 % CI"]).replace("95 % CI", ""))[:2]
        assert _shown(lo, fact["ci"][0]) and _shown(hi, fact["ci"][1]), (basis, lo, hi, fact["ci"])
        n.append(f"{rel}/fits.json {entry['phase']} {key}.tokens, ci")
    coef = _frame(at, "precision", "breakeven").set_index("precision")
    for prec, f in entry["fits"].items():
        for col, key, scale in (
            ("fixed ms [95 % CI]", "fixed", 1e3),
            ("per-token µs [95 % CI]", "per_token", 1e6),
        ):
            value, lo, hi = _numbers(str(coef.loc[prec, col]))[:3]
            assert _shown(value, f[f"{key}_s"] * scale), (prec, col, value)
            assert _shown(lo, f[f"{key}_ci"][0] * scale) and _shown(hi, f[f"{key}_ci"][1] * scale), (
                prec,
                col,
            )
            n.append(f"{rel}/fits.json {entry['phase']} fits.{prec}.{key}_s, {key}_ci")
        assert _shown(coef.loc[prec, "R²"], f["r2"]) and int(coef.loc[prec, "points"]) == f["n_points"]
    points = next((df.value for df in at.dataframe if "micro_batches" in df.value.columns), None)
    if points is not None and "ingest" in entry["sources"]["wall"]:
        files = re.findall(r"examples/runs/([\w.-]+)/microbatches\.parquet", entry["sources"]["wall"])
        mb = pd.concat([_read(r, store.MICROBATCHES) for r in files])
        mb = mb[mb["phase"] == entry["phase"]]
        want = mb.groupby(["precision", "tokens_per_microbatch"])["seconds"].agg(["mean", "size"])
        for row in points.itertuples():
            mean, size = want.loc[(row.precision, row.tokens_per_microbatch)]
            assert _shown(row.seconds, mean) and row.micro_batches == size, row
        n.append(f"{' + '.join(files)} microbatches.parquet: {len(points)} mean seconds per size")


def _host_stall(at: AppTest, n: list[str]) -> None:
    other = at.selectbox(key="hs_other")
    if other.value == "(none)":  # the examples' pair is two CPU runs: put a second trace beside the first
        other.set_value(other.options[1]).run()
        assert not at.exception, [e.value for e in at.exception]
    rels = [at.selectbox(key="hs_trace").value, at.selectbox(key="hs_other").value]
    tables = [
        df.value for df in at.dataframe if "span ms" in df.value.columns and "process" in df.value.columns
    ]
    assert len(tables) == len(rels), (rels, len(tables))
    for rel, table in zip(rels, tables, strict=True):
        dev = _read(rel, store.DEVICES).sort_values(["rank", "device"]).reset_index(drop=True)
        assert len(table) == len(dev), rel
        for i, want in enumerate(dev.itertuples()):
            shown = table.iloc[i]
            for col, ns in (
                ("span ms", want.span_ns),
                ("busy ms", want.busy_ns),
                ("host stall ms", want.host_stall_ns),
                ("other idle ms", want.other_idle_ns),
            ):
                assert _shown(shown[col], ns / 1e6), (rel, col, shown[col], ns / 1e6)
            assert int(shown["kernels"]) == want.num_kernels, rel
            assert _shown(shown["host stall %"], 100 * want.host_stall_ns / want.span_ns), rel
        n.append(f"{rel}/devices.parquet span, busy, host stall, other idle, kernels, stall % per GPU")


def _timeline(at: AppTest, n: list[str]) -> None:
    rel, rank = at.selectbox(key="tl_trace").value, at.selectbox(key="tl_rank").value
    events = pd.read_parquet(EXAMPLES / rel / rank, columns=["kind", "pid", "tid", "device", "stream"])
    cpu = events[events["kind"].isin(CPU_KINDS) & (events["device"] < 0)]
    gpu = events[events["kind"].isin(GPU_KINDS) & (events["device"] >= 0)]
    tracks = len(cpu.groupby(["pid", "tid"])) + len(gpu.groupby(["device", "stream"]))
    caption = next(str(c.value) for c in at.caption if "boxes drawn" in str(c.value))
    assert f"for {tracks} CPU-thread / GPU-stream tracks" in caption, (tracks, caption)
    assert f"({len(cpu) + len(gpu):,} ops in this rank" in caption, (len(cpu) + len(gpu), caption)
    n.append(f"{rel}/{rank}: ops and tracks")


def _kernels(at: AppTest, n: list[str]) -> None:
    rel = at.selectbox(key="kn_ingest").value
    kernels, devices = _read(rel, store.KERNELS), _read(rel, store.DEVICES)
    gpu = kernels[kernels["kind"].isin(GPU_KINDS)]
    metric = {str(m.label): m.value for m in at.metric}
    assert _shown(metric["GPU busy"], devices["busy_ns"].sum() / 1e6), metric["GPU busy"]
    assert _shown(metric["GPU ops"], gpu["count"].sum()), metric["GPU ops"]
    assert _shown(metric["GPU op time, summed"], gpu["total_ns"].sum() / 1e6), metric
    n.append(f"{rel}/devices.parquet busy_ns; kernels.parquet count, total_ns")
    classes = _frame(at, "class", "kernels").set_index("class")
    want = gpu.groupby("kernel_class").agg(count=("count", "sum"), total=("total_ns", "sum"))
    assert set(classes.index) == set(want.index), (set(classes.index), set(want.index))
    for cls, row in want.iterrows():
        assert int(classes.loc[cls, "count"]) == row["count"], cls
        assert _shown(classes.loc[cls, "total ms"], row["total"] / 1e6), cls
    n.append(f"{rel}/kernels.parquet: {len(want)} classes' count and total")


def _diff(at: AppTest, n: list[str]) -> None:
    rels = {"A": at.selectbox(key="df_a").value, "B": at.selectbox(key="df_b").value}
    table = _frame(at, "phase", "diff")
    assert "tokens" in table.columns, "the diff opens per micro-batch size"
    for side, rel in rels.items():
        mb = _read(rel, store.MICROBATCHES)
        mb = mb.assign(wall_ms=(mb["end_ns"] - mb["start_ns"]) / 1e6)
        want = mb.groupby(["phase", "tokens_per_microbatch"])["wall_ms"].agg(["mean", "size"])
        for row in table.itertuples(index=False):
            phase, tokens = row[0], row[1]
            mean, size = want.loc[(phase, tokens)]
            assert (
                table.loc[
                    (table["phase"] == phase) & (table["tokens"] == tokens), f"micro-batches {side}"
                ].item()
                == size
            )
            shown = table.loc[
                (table["phase"] == phase) & (table["tokens"] == tokens), f"{side} wall ms"
            ].item()
            assert _shown(shown, mean), (side, phase, tokens, shown, mean)
        n.append(f"{rel}/microbatches.parquet: {len(table)} sizes' count and mean wall")


def _consistency(at: AppTest, n: list[str]) -> None:
    logs = _frame(at, "metric", "consistency").set_index("metric")
    for col in logs.columns:
        rel = col.split("(")[1].rstrip(")")
        want = _read(rel, store.MISMATCH).groupby("metric")["value"].median()
        for metric, value in logs[col].dropna().items():
            assert _shown(f"{value}", want[metric]) or _shown(value, want[metric]), (rel, metric, value)
        n.append(f"{rel}/mismatch.parquet: {logs[col].notna().sum()} medians")
    table = next(
        df.value for df in at.dataframe if "kv_cache" in df.value.columns and "source" in df.value.columns
    )
    for rel, rows in table.groupby("source"):
        want = _read(rel, store.CONSISTENCY)
        cols = ["kl_k1", "kl_k3", "token_mult_prob_error"]
        got = rows.sort_values(["learner", "sampler", "grid_fraction"])[cols].to_numpy()
        exp = want.sort_values(["learner", "sampler", "grid_fraction"])[cols].to_numpy()
        assert got.shape == exp.shape and (abs(got - exp) <= 1e-12 * (1 + abs(exp))).all(), rel
        n.append(f"{rel}/consistency.parquet: {len(rows)} pairings' kl_k1, kl_k3, token_mult_prob_error")


def _weight_sync(at: AppTest, n: list[str]) -> None:
    table = _frame(at, "fault", "weight_sync").set_index("fault")
    rel = next(p.parent.name for p in EXAMPLES.glob(f"*/{store.FAULT_MATRIX}"))
    want = _read(rel, store.FAULT_MATRIX).set_index("fault")
    assert set(table.index) == set(want.index)
    for fault, row in want.iterrows():
        for col, key in (("KL k3 with fault", "kl_k3_fault"), ("KL k3 clean", "kl_k3_clean")):
            if pd.notna(row[key]):
                assert _shown(table.loc[fault, col], row[key]), (fault, col)
        caught = table.loc[fault, "caught by"]
        assert (caught or "") == (row["caught_by"] or "") or str(row["caught_by"]) in str(caught), fault
    n.append(f"{rel}/fault_matrix.parquet: {len(want)} faults' KL k3 (with fault, clean), caught by")


PAGES = {
    "overview": _overview,
    "runs": _runs,
    "step_time": _step_time,
    "breakeven": _breakeven,
    "host_stall": _host_stall,
    "timeline": _timeline,
    "kernels": _kernels,
    "diff": _diff,
    "consistency": _consistency,
    "weight_sync": _weight_sync,
}


def test_every_page_shows_the_numbers_of_its_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every page with numbers (Add a trace has none), opened as a user opens it on examples/runs."""
    import test_dashboard_apptest as tapp

    if not (EXAMPLES / "fit-verl-sim" / store.FITS).is_file():
        pytest.skip("examples/runs lacks its outputs")
    assert set(PAGES) | {"add_trace"} == set(tapp.PAGES)  # a new page must join the sweep
    checked: dict[str, list[str]] = {}
    for page, check in PAGES.items():
        at = _open(monkeypatch, page)
        check(at, checked.setdefault(page, []))
        assert checked[page], f"{page}: nothing checked"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "dashboard-numbers-checked.json").write_text(json.dumps(checked, indent=1) + "\n")
