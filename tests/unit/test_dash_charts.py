"""dashboards.charts: every figure builds from small tables without Streamlit and shows what it claims."""

from __future__ import annotations

import dash_fixtures
import numpy as np
import pandas as pd

from dashboards import charts, compare, summaries
from tracing.analysis import steps
from tracing.analysis.metrics import device_timelines


def _tables() -> dict[str, pd.DataFrame]:
    m = pd.DataFrame({"step": [0, 1], "step_s": [2.0, 2.0], "generate_s": [1.0, 1.0], "update_s": [0.5, 0.5]})
    return {"bf16": steps.step_phase_table(m), "mxfp8": steps.step_phase_table(m.assign(update_s=0.3))}


def test_step_time_mean_bars_stack_one_trace_per_phase() -> None:
    t = _tables()
    fig = charts.step_time_mean_bars({k: compare.phase_medians(v) for k, v in t.items()}, steps.STEP_PHASES)
    assert fig.layout.barmode == "stack"
    assert [tr.name for tr in fig.data] == list(steps.STEP_PHASES)
    update = next(tr for tr in fig.data if tr.name == "update")
    assert list(update.x) == ["bf16", "mxfp8"] and list(update.y) == [0.5, 0.3]


def test_per_step_bars_have_one_panel_per_precision_and_one_legend_entry_per_phase() -> None:
    fig = charts.step_time_per_step_bars(_tables(), steps.STEP_PHASES)
    assert [a.text for a in fig.layout.annotations] == ["bf16", "mxfp8"]
    assert sum(bool(tr.showlegend) for tr in fig.data) == len(steps.STEP_PHASES)


def test_breakeven_figure_draws_bands_lines_points_and_n_star() -> None:
    ns = np.linspace(0, 4000, 5)
    lines = {
        "bf16": (ns, 0.01 + 4e-5 * ns, 0.009 + 4e-5 * ns, 0.011 + 4e-5 * ns),
        "mxfp8": (ns, 0.03 + 3e-5 * ns, None, None),
    }
    points = pd.DataFrame(
        {"precision": ["bf16", "mxfp8"], "num_tokens": [1000, 1000], "seconds": [0.05, 0.06]}
    )
    fig = charts.breakeven_figure(points, lines, 2000.0, (1700.0, 2400.0))
    names = [tr.name for tr in fig.data]
    assert names == ["bf16 95 % band", "bf16 fit", "mxfp8 fit", "bf16 measured", "mxfp8 measured"]
    assert any(a.text == "n* = 2,000" for a in fig.layout.annotations)
    assert fig.layout.shapes[0].x0 == 1700.0 and fig.layout.shapes[0].x1 == 2400.0


def test_breakeven_figure_without_n_star_has_no_marker() -> None:
    ns = np.array([0.0, 1.0])
    fig = charts.breakeven_figure(
        pd.DataFrame(columns=["precision", "num_tokens", "seconds"]), {"bf16": (ns, ns, None, None)}, None
    )
    assert not fig.layout.shapes and not fig.layout.annotations


def test_timeline_puts_ranges_above_devices_and_idle_under_busy() -> None:
    (tl,) = device_timelines(dash_fixtures.gpu_events())
    bars = summaries.timeline_intervals([tl], int(tl.row["first_ns"]), int(tl.row["last_ns"]), rank=0)
    ranges = pd.DataFrame({"name": ["step"], "depth": [0], "start_ms": [0.0], "end_ms": [1.0]})
    fig = charts.timeline_figure(bars, ranges, "t")
    assert [tr.name for tr in fig.data] == ["idle, other (span)", "GPU busy", "host stall", "ranges"]
    assert list(fig.layout.yaxis.categoryarray) == ["range depth 0", "GPU 0 · rank 0"]


def test_stall_share_figure_shows_percent() -> None:
    share = pd.DataFrame(
        {"precision": ["bf16", "mxfp8"], "tokens_per_microbatch": [256, 256], "host_stall_share": [0.1, 0.4]}
    )
    fig = charts.stall_share_figure(share, "tokens_per_microbatch", "t")
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
    fig = charts.consistency_figure(long, summaries.CONSISTENCY_METRICS)
    assert [a.text for a in fig.layout.annotations] == list(summaries.CONSISTENCY_METRICS)
    assert len(fig.data) == 6


def test_sync_heatmap_marks_failures_and_names_the_initial_sync() -> None:
    checks = pd.DataFrame(
        {"step": [-1, -1, 0, 0], "invariant": ["I1", "I2", "I1", "I2"], "passed": [True, True, False, True]}
    )
    fig = charts.sync_heatmap(summaries.sync_matrix(checks), summaries.INVARIANTS)
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
    fig = charts.fault_matrix_figure(grid)
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
    fig = charts.fixed_weights_figure(table)
    assert [tr.name for tr in fig.data] == ["learner bf16", "learner mxfp8"]
    assert list(fig.data[0].x) == ["bf16", "mxfp8"] and fig.layout.yaxis.type == "log"
