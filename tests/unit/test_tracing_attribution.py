"""Per-range attribution invariants on the real traces, phase map, kernel classes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracing.analysis import attribution, kernel_classes, metrics
from tracing.analysis.phases import phase_of
from tracing.ingest.decoded import load_nsys_events
from tracing.ingest.kineto import load_kineto_events
from tracing.outputs import schema

REAL = Path(__file__).parent.parent / "data" / "real"
A100 = REAL / "hta_a100_ddp_rank0_hostbound.json.gz"
TRACES = {
    "a100": lambda: load_kineto_events(A100),
    "rank0": lambda: load_kineto_events(REAL / "hta_sampled_2rank" / "rank-0.json.gz"),
    "nsys": lambda: load_nsys_events(REAL / "nsysai_h100x2_mfu_before.sqlite"),
}


@pytest.fixture(scope="module", params=list(TRACES))
def ranges(request):
    return attribution.attribute_ranges(TRACES[request.param]())


@pytest.fixture(scope="module")
def a100_ranges():
    return attribution.attribute_ranges(load_kineto_events(A100))


def test_range_table_follows_the_schema(ranges):
    assert list(ranges.columns) == [c for c in schema.RANGE_COLUMNS if c not in ("trace", "rank")]


def test_busy_and_stall_never_exceed_the_window(ranges):
    """One time basis: every GPU column of a range fits in its window (start -> later of end, GPU end)."""
    assert (ranges["time_ns"] >= ranges["wall_ns"]).all()
    for col in ("host_stall_ns", "busy_in_window_ns", "window_busy_ns", "thread_busy_ns"):
        assert (ranges[col] <= ranges["time_ns"]).all(), col
    assert (ranges["busy_in_window_ns"] + ranges["host_stall_ns"] <= ranges["time_ns"]).all()


def test_window_ends_at_the_last_gpu_op_a_range_launched(ranges):
    launched = ranges["window_ops"] > 0
    assert ranges.loc[~launched, "gpu_end_ns"].isna().all()
    end = ranges["end_ns"].where(~launched, ranges[["end_ns", "gpu_end_ns"]].max(axis=1))
    assert (ranges["start_ns"] + ranges["time_ns"] == end).all()


def test_children_wall_times_add_up_to_at_most_the_parent(ranges):
    kids = ranges[ranges["parent_id"] >= 0].groupby("parent_id")["wall_ns"].sum()
    parent_wall = ranges.set_index("range_id").loc[kids.index, "wall_ns"]
    assert (kids <= parent_wall).all()


def test_window_attribution_includes_same_thread_work(ranges):
    assert (ranges["window_ops"] >= ranges["thread_ops"]).all()
    assert (ranges["window_busy_ns"] >= ranges["thread_busy_ns"]).all()
    assert (ranges["window_busy_ns"] <= ranges["window_span_ns"]).all()


def test_backward_kernels_come_from_the_autograd_thread(a100_ranges):
    bwd = a100_ranges[a100_ranges["name"] == "## backward ##"]
    assert len(bwd) == 3
    assert (bwd["thread_ops"] == 6).all()  # what gpu_user_annotation sees
    assert (bwd["window_ops"] > 700).all()


def test_profiler_steps_partition_most_of_the_device_stall(a100_ranges):
    steps = a100_ranges[a100_ranges["name"].str.startswith("ProfilerStep#")]
    dev = metrics.device_metrics(load_kineto_events(A100).events).iloc[0]
    assert steps["host_stall_ns"].sum() <= dev.host_stall_ns
    assert steps["host_stall_ns"].sum() > 0.95 * dev.host_stall_ns


def test_encoded_range_attributes_are_decoded():
    assert attribution.split_encoded_name("update/microbatch[step=3,microbatch=1,precision=mxfp8]") == (
        "update/microbatch",
        {"step": 3, "microbatch": 1, "precision": "mxfp8"},
    )
    assert attribution.split_encoded_name("aten::index[]") == ("aten::index[]", {})


@pytest.mark.parametrize(
    ("name", "phase"),
    [
        ("update/microbatch", "update"),
        ("update_actor", "update"),
        ("actor_update", "update"),
        ("policy_training", "update"),
        ("update_weights", "sync"),
        ("refit", "sync"),
        ("gen", "generate"),
        ("rollout_generate", "generate"),
        ("generation", "generate"),
        ("old_log_prob", "logprob"),
        ("policy_and_reference_logprobs", "logprob"),
        ("ref", "logprob"),
        ("reward", "reward"),
        ("reward_calculation", "reward"),
        ("ProfilerStep#4", "other"),
        ("## recmetrics_update ##", "other"),
        ("## all2all_data:recat_permute_gen ##", "other"),
        ("## all2all_data:recat_values ##", "other"),
        ("actor/update", "update"),
        ("compute_log_prob", "logprob"),
        ("aten::mm", "other"),
        ("execute_context_2(5)_generation_0(0)", "generate"),  # vLLM engine steps (its torch profiler)
        ("execute_context_1(3sq3sk3sqsq9sqsk9)_generation_0(sq0sk0sqsq0sqsk0)", "generate"),
        ("dynamo_data: compile_id=0/0", "other"),
    ],
)
def test_phase_map_covers_mxperf_verl_and_nemo_names(name, phase):
    assert phase_of(name) == phase


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4>>", "attention"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "gemm"),
        ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128", "gemm"),
        ("transformer_engine::cast_transpose_kernel<...>", "quantize"),
        ("void mxfp8_quantize_kernel<__nv_bfloat16>", "quantize"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "elementwise"),
        ("void cudnn::ops::nhwcToNchwKernel<float>", "other"),
    ],
)
def test_kernel_classes_by_name(name, cls):
    assert kernel_classes.DEFAULT.classify(name) == cls


def test_kernel_classes_are_extensible():
    c = kernel_classes.with_rules([("attention", r"my_custom_attn")])
    assert c.classify("my_custom_attn_v2") == "attention"
    assert c.classify("nvjet_gemm") == "gemm"


def test_kernel_table_totals_equal_op_durations():
    ev = load_kineto_events(A100).events
    ops = metrics.gpu_ops(ev)
    k = kernel_classes.kernel_table(ops)
    assert k["total_ns"].sum() == ops["dur_ns"].sum()
    assert k["count"].sum() == len(ops)
    totals = kernel_classes.class_totals(k)
    assert totals["share"].sum() == pytest.approx(1.0)
    assert set(totals["kernel_class"]) >= {"communication", "gemm", "memcpy", "memset"}


def test_notebook_api_is_exported_lazily_without_torch():
    import subprocess
    import sys

    code = (
        "import sys, tracing\n"
        "from tracing import load_kineto_events, load_nsys_events, device_metrics, attribute_ranges, stream_breakdown\n"
        "assert 'torch' not in sys.modules\n"
        "missing = [n for n in tracing.__all__ if getattr(tracing, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert 'torch' not in sys.modules\n"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0
