"""dashboards.charts: every figure builds from small tables without Streamlit and shows what it claims."""

from __future__ import annotations

import dash_fixtures
import numpy as np
import pandas as pd

from dashboards import charts, charts_checks, charts_fit, charts_gpu, compare, summaries, timeline
from tracing.analysis import steps
from tracing.analysis.metrics import device_timelines


def _tables() -> dict[str, pd.DataFrame]:
    m = pd.DataFrame({"step": [0, 1], "step_s": [2.0, 2.0], "generate_s": [1.0, 1.0], "update_s": [0.5, 0.5]})
    return {"bf16": steps.step_phase_table(m), "mxfp8": steps.step_phase_table(m.assign(update_s=0.3))}


def test_median_bars_stack_one_trace_per_phase_with_the_step_iqr_on_top() -> None:
    t = _tables()
    stats = {k: compare.phase_stats(v) for k, v in t.items()}
    fig = charts.step_time_median_bars(stats, steps.STEP_PHASES)
    assert fig.layout.barmode == "stack"
    assert [tr.name for tr in fig.data] == [*steps.STEP_PHASES, "step: median and IQR"]
    update = next(tr for tr in fig.data if tr.name == "update")
    assert list(update.x) == ["bf16", "mxfp8"] and list(update.y) == [0.5, 0.3]
    assert "2 steps" in fig.layout.title.text  # the count behind the medians


def test_per_step_bars_have_one_panel_per_output_and_mark_the_warmup_step() -> None:
    fig = charts.step_time_per_step_bars(_tables(), steps.STEP_PHASES, {"bf16": 0, "mxfp8": None})
    assert [a.text for a in fig.layout.annotations][:2] == ["bf16", "mxfp8"]
    assert any("warm-up" in a.text for a in fig.layout.annotations)
    assert sum(bool(tr.showlegend) for tr in fig.data) == len(steps.STEP_PHASES)
    first = next(tr for tr in fig.data if tr.name == "update")
    assert list(first.marker.opacity) == [0.35, 1.0]  # step 0 of bf16 drawn faded


def test_rank_steps_draw_every_rank_and_the_max_line() -> None:
    totals = pd.DataFrame(
        {
            "process": ["rank 0", "rank 1", "rank 0", "rank 1"],
            "step": [1, 1, 2, 2],
            "seconds": [0.6, 0.75, 0.5, 0.45],
        }
    )
    fig = charts.rank_steps_figure(totals, "t")
    job = next(tr for tr in fig.data if tr.name.startswith("job step"))
    assert list(job.y) == [0.75, 0.5]


def test_breakeven_figure_draws_bands_lines_points_n_star_and_the_crossing() -> None:
    ns = np.linspace(0, 4000, 5)
    lines = {
        "bf16": (ns, 0.01 + 4e-5 * ns, 0.009 + 4e-5 * ns, 0.011 + 4e-5 * ns),
        "mxfp8": (ns, 0.03 + 3e-5 * ns, None, None),
        "mxfp8 (other-fit)": (ns, 0.02 + 3e-5 * ns, None, None),
    }
    points = pd.DataFrame(
        {
            "precision": ["bf16", "mxfp8", "mxfp8"],
            "num_tokens": [1000, 1000, 1500],
            "seconds": [0.05, 0.06, 0.07],
            "source": ["sweep", "sweep", "detected"],
        }
    )
    fig = charts_fit.breakeven_figure(
        points, lines, 2000.0, (1700.0, 2400.0), crossing=[1024, 2048], dashed=["mxfp8 (other-fit)"]
    )
    names = [tr.name for tr in fig.data]
    assert names == [
        "bf16 95 % band",
        "bf16 fit",
        "mxfp8 fit",
        "mxfp8 (other-fit) fit",
        "bf16 measured (sweep)",
        "mxfp8 measured (detected)",
        "mxfp8 measured (sweep)",
    ]
    assert fig.data[3].line.dash == "dash" and fig.data[2].line.dash == "solid"
    assert next(tr for tr in fig.data if tr.name.endswith("(detected)")).marker.symbol == "diamond"
    assert any(a.text == "n* = 2,000" for a in fig.layout.annotations)
    xs = [(sh.x0, sh.x1) for sh in fig.layout.shapes]
    assert (1024, 2048) in xs and (1700.0, 2400.0) in xs


def test_breakeven_figure_without_n_star_has_no_marker() -> None:
    ns = np.array([0.0, 1.0])
    fig = charts_fit.breakeven_figure(
        pd.DataFrame(columns=["precision", "num_tokens", "seconds"]), {"bf16": (ns, ns, None, None)}, None
    )
    assert not fig.layout.shapes and not fig.layout.annotations


def test_step_prediction_marks_extrapolation_and_n_in_data_coordinates() -> None:
    ns = np.geomspace(64, 8192, 20)
    fig = charts_fit.step_prediction_figure(ns, {"bf16": ns * 0 + 1.0}, 512, 8192, measured=(128, 1024))
    shaded = [tr for tr in fig.data if tr.name.startswith("extrapolated")]
    assert [(min(tr.x), max(tr.x)) for tr in shaded] == [(64, 128), (1024, 8192)]
    marker = next(tr for tr in fig.data if tr.name == "n = 512")
    assert list(marker.x) == [512, 512]
    assert fig.layout.xaxis.type == "log" and not fig.layout.shapes  # no shape to drag the log axis range


def test_timeline_puts_ranges_above_devices_and_idle_under_busy() -> None:
    (tl,) = device_timelines(dash_fixtures.gpu_events())
    bars = timeline.timeline_intervals([tl], int(tl.row["first_ns"]), int(tl.row["last_ns"]), rank=0)
    ranges = pd.DataFrame({"name": ["step"], "depth": [0], "start_ms": [0.0], "end_ms": [1.0]})
    fig = charts_gpu.timeline_figure(bars, ranges, "t")
    assert [tr.name for tr in fig.data] == ["idle, other (span)", "GPU busy", "host stall", "ranges"]
    assert list(fig.layout.yaxis.categoryarray) == ["range depth 0", "GPU 0 · rank 0"]


def test_stall_share_figure_shows_percent() -> None:
    share = pd.DataFrame(
        {"precision": ["bf16", "mxfp8"], "tokens_per_microbatch": [256, 256], "host stall %": [10.0, 40.0]}
    )
    fig = charts_gpu.stall_share_figure(share, "tokens_per_microbatch", "t")
    assert [list(tr.y) for tr in fig.data] == [[10.0], [40.0]]


def test_consistency_figure_has_a_panel_per_metric_and_a_line_per_pairing() -> None:
    long = summaries.consistency_long(
        {
            "bf16/bf16": pd.DataFrame(
                {
                    "step": [0, 1],
                    "kl_k1": [1e-4, 2e-4],
                    "kl_k3": [1e-4, 1e-4],
                    "token_mult_prob_error": [1.0, 1.0],
                }
            ),
            "mxfp8/bf16": pd.DataFrame(
                {
                    "step": [0, 1],
                    "kl_k1": [1e-3, 2e-3],
                    "kl_k3": [1e-3, 1e-3],
                    "token_mult_prob_error": [1.01, 1.02],
                }
            ),
        }
    )
    fig = charts_checks.consistency_figure(long, summaries.CONSISTENCY_METRICS)
    assert [a.text for a in fig.layout.annotations] == list(summaries.CONSISTENCY_METRICS)
    assert len(fig.data) == 6


def test_sync_heatmap_marks_failures_and_names_the_initial_sync() -> None:
    checks = pd.DataFrame(
        {"step": [-1, -1, 0, 0], "invariant": ["I1", "I2", "I1", "I2"], "passed": [True, True, False, True]}
    )
    fig = charts_checks.sync_heatmap(summaries.sync_matrix(checks), summaries.INVARIANTS)
    assert fig.data[0].text.tolist() == [["pass", "FAIL"], ["pass", "pass"]]
    assert list(fig.data[0].x) == ["initial", "0"]
    assert list(fig.data[0].y) == ["I1 grid identity", "I2 coverage"]


def test_fault_matrix_expands_caught_by_and_flags_a_missed_target() -> None:
    fm = pd.DataFrame(
        {
            "fault": ["flip", "drop"],
            "invariant": ["I1", "I2"],
            "caught": [True, False],
            "caught_by": ["I1,I4", ""],
        }
    )
    grid = summaries.fault_grid(fm)
    assert len(grid) == 14
    fig = charts_checks.fault_matrix_figure(grid)
    text = fig.data[0].text.tolist()
    assert text[0] == ["caught", "", "", "caught", "", "", ""]
    assert text[1] == ["", "MISSED", "", "", "", "", ""]


def test_pairings_with_the_same_learner_get_different_colours() -> None:
    colours = {
        charts.pairing_color(lbl, i) for i, lbl in enumerate(["bf16/bf16", "mxfp8/bf16", "mxfp8/mxfp8"])
    }
    assert len(colours) == 3
    assert charts.pairing_color("mxfp8/mxfp8") == charts.PRECISION_COLORS["mxfp8"]


def test_fixed_weights_figure_groups_pairings_by_learner_on_a_log_axis() -> None:
    table = pd.DataFrame(
        {
            "learner": ["bf16", "bf16", "mxfp8"],
            "sampler": ["bf16", "mxfp8", "mxfp8"],
            "kl_k3": [6e-6, 4.7e-4, 2.3e-4],
        }
    )
    fig = charts_checks.fixed_weights_figure(table)
    assert [tr.name for tr in fig.data] == ["learner bf16", "learner mxfp8"]
    assert list(fig.data[0].x) == ["bf16", "mxfp8"] and fig.layout.yaxis.type == "log"
    assert fig.layout.yaxis.dtick == 1 and fig.layout.yaxis.exponentformat == "e"  # 1e-4, never "5, 2, 100µ"
