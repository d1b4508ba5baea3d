"""Which units are independent, which regressors the data identify, and the sums every fit reads."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfmodel.fitting.design import UNIT_REPEAT, UNIT_ROW, UNIT_STEP, build_design, restrict
from perfmodel.inputs.columns import conform_microbatches
from perfmodel.inputs.simulate import simulate_sweep


def _design(df: pd.DataFrame, prec: str = "bf16"):
    table = conform_microbatches(df, "t", "csv")
    return build_design(table[table["precision"] == prec])


def test_a_sweep_step_is_one_unit_and_steps_nest_in_sizes() -> None:
    d = _design(simulate_sweep(repeats=3, microbatches=4))
    assert d.unit_kind == UNIT_STEP and d.n_units == 7 * 3
    assert d.strata is not None and len(np.unique(d.strata)) == 7
    assert (d.unit_label >= 0).all()


def test_a_csv_with_repeat_but_no_step_takes_repeat_within_size() -> None:
    df = simulate_sweep(repeats=3).drop(columns=["step", "microbatch"])
    d = _design(df)
    assert d.unit_kind == UNIT_REPEAT and d.n_units == 7 * 3


def test_rows_are_the_units_when_nothing_groups_them() -> None:
    df = simulate_sweep(repeats=3).drop(columns=["step", "microbatch", "repeat"])
    d = _design(df)
    assert d.unit_kind == UNIT_ROW and d.n_units == len(df) // 2


def test_a_dynamic_batching_step_with_several_sizes_stays_one_unit() -> None:
    # one traced step holds micro-batches of different sizes (distinct micro-batch indices): one unit
    df = simulate_sweep(sizes=(1024, 4096), repeats=2, microbatches=2)
    df["step"] = df["repeat"]  # both sizes' micro-batches in the same step ...
    df["microbatch"] = df.groupby(["precision", "step"]).cumcount()  # ... with distinct indices
    d = _design(df)
    assert d.unit_kind == UNIT_STEP and d.n_units == 2
    assert (d.unit_label == -1).all() and d.strata is None  # units span sizes: resampled unstratified


def test_per_step_term_needs_first_and_later_micro_batches() -> None:
    assert "per_step" in _design(simulate_sweep()).names
    one_each = simulate_sweep(microbatches=1)
    d = _design(one_each)
    assert "per_step" not in d.names and "first of its step" in d.dropped["per_step"]


def test_two_global_batches_identify_a_per_step_cost_wherever_it_lands() -> None:
    d = _design(simulate_sweep(global_tokens=[16384, 65536], repeats=2))
    assert {"per_step", "per_step_spread"} <= set(d.names)
    d1 = _design(simulate_sweep(global_tokens=16384, repeats=2))
    assert "per_step_spread" not in d1.names and "2 global batch" in d1.dropped["per_step_spread"]


def test_attention_term_needs_varying_sequence_lengths() -> None:
    varying = _design(simulate_sweep(seq_len=256, seq_len_spread=0.5, repeats=2))
    assert "per_sq_token" in varying.names and 100 < varying.seq_len_ref < 600
    constant = _design(simulate_sweep(seq_len=256, repeats=2))
    assert "per_sq_token" not in constant.names
    assert "constant" in constant.dropped["per_sq_token"]
    assert "not known" in _design(simulate_sweep(repeats=2)).dropped["per_sq_token"]


def test_cells_add_up_to_the_rows_and_restrict_keeps_only_the_chosen_units() -> None:
    df = simulate_sweep(repeats=2)
    d = _design(df)
    rows = df[df["precision"] == "bf16"]
    r = d.responses["seconds"]
    assert r.pattern_count.sum() == len(rows)
    assert r.pattern_total.sum() == np.float64(rows["seconds"].sum()).round(12) or np.isclose(
        r.pattern_total.sum(), rows["seconds"].sum()
    )
    keep = d.unit_label >= 1024
    sub = restrict(d, keep)
    assert sub.responses["seconds"].pattern_count.sum() == (rows["tokens_per_microbatch"] >= 1024).sum()
    assert "gpu_side_seconds" in d.responses  # wall minus host stall, for the parts model
