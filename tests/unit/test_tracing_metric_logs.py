"""verl / NeMo RL metric logs -> per-step phase seconds (steps.parquet shape), mismatch metrics and token counts.

Fixtures in tests/data/metric_logs/ use the keys the frameworks' sources log (README there says which file
and commit); their timers are built so every phase and "other" has a known value.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from mxperf.cli import main
from tracing.analysis.logged_steps import METRIC_LOG_PID, logged_step_tables
from tracing.analysis.phases import default_phase_map, load_phase_map
from tracing.ingest.detect import detect_format, expand_inputs, load_trace
from tracing.ingest.metric_logs import METRIC_LOG, StepTokens, load_metric_log, step_tokens
from tracing.outputs import schema, store
from tracing.outputs.errors import InputError

LOGS = Path(__file__).parents[1] / "data" / "metric_logs"
VERL_BF16 = LOGS / "verl_grpo_bf16.jsonl"
VERL_MXFP8 = LOGS / "verl_grpo_mxfp8.jsonl"
NEMO = LOGS / "nemo_rl_grpo_metrics.json"


def _wide(path: Path, phase_map=None) -> pd.DataFrame:
    got = logged_step_tables(load_metric_log(path), phase_map or default_phase_map())
    return got.steps.pivot(index="step", columns="phase", values="seconds")


def test_verl_file_logger_log_gives_phase_seconds_per_step():
    log = load_metric_log(VERL_BF16)
    assert (log.framework, log.layout) == ("verl", "verl_file_logger")
    got = logged_step_tables(log, default_phase_map())
    assert got.phase_keys == {
        "generate": ["timing_s/gen"],  # not + generate_sequences / agent_loop/*: those run inside gen
        "logprob": ["timing_s/old_log_prob", "timing_s/ref"],
        "update": ["timing_s/update_actor"],
        "sync": ["timing_s/update_weights"],
    }
    wide = got.steps.pivot(index="step", columns="phase", values="seconds")
    assert list(wide.index) == [1, 2, 3]  # step 0 logged only validation: no row
    assert wide["generate"].tolist() == [11.0, 12.0, 13.0]
    assert wide["logprob"].tolist() == pytest.approx([3.5] * 3)
    assert wide["update"].tolist() == [5.0] * 3 and wide["sync"].tolist() == [0.8] * 3
    # other = timing_s/step - phases: reward 1.0 + adv 0.2 + 0.5 host time; step 3 adds testing and a checkpoint
    assert wide["other"].tolist() == pytest.approx([1.7, 1.7, 6.7])
    assert (got.steps["pid"] == METRIC_LOG_PID).all() and got.steps["rank"].isna().all()
    assert list(got.steps.columns) == list(schema.STEP_COLUMNS)


def test_verl_mismatch_metrics_take_mxperf_names_where_the_formula_is_the_same():
    mm = logged_step_tables(load_metric_log(VERL_BF16), default_phase_map(), "bf16").mismatch
    assert list(mm.columns) == list(schema.MISMATCH_COLUMNS)
    by = mm.set_index(["step", "metric"])["value"]
    assert by[(2, "kl_k1")] == pytest.approx(2e-4)  # rollout_corr/kl = mean(lp_rollout - lp_old)
    assert by[(2, "kl_k3")] == pytest.approx(1e-4)  # rollout_corr/k3_kl
    assert by[(1, "prob_abs_diff_mean")] == 0.002 and by[(1, "prob_abs_diff_max")] == 0.21
    assert by[(3, "rollout_is_mean")] == pytest.approx(1 - 5e-5)  # other rollout_corr/* keep their names
    assert math.isnan(by[(1, "rollout_actor_probs_pearson_corr")])  # logged null (NaN via orjson)
    keys = set(mm["key"])
    assert "training/rollout_probs_diff_valid" not in keys and "actor/ppo_kl" not in keys
    assert set(mm["precision"]) == {"bf16"} and set(mm["framework"]) == {"verl"}


def test_nemo_rl_metrics_json_skips_nested_timers_and_rates():
    log = load_metric_log(NEMO)
    assert (log.framework, log.layout) == ("nemo_rl", "nemo_rl_json")
    got = logged_step_tables(log, default_phase_map())
    assert got.phase_keys["sync"] == [
        "timing/train/logprob_inference_prep",
        "timing/train/prepare_for_generation/total",  # not its part transfer_and_update_weights
        "timing/train/training_prep",
    ]
    assert got.phase_keys["logprob"] == ["timing/train/policy_and_reference_logprobs"]
    assert got.phase_keys["update"] == ["timing/train/policy_training"]
    wide = got.steps.pivot(index="step", columns="phase", values="seconds")
    assert list(wide.index) == [1, 2, 3]  # timing/setup at step 0 is not a training step
    assert wide["generate"].tolist() == [16.0, 17.0, 18.0]
    assert wide["sync"].tolist() == pytest.approx([2.7] * 3)
    assert wide["other"].tolist() == pytest.approx([1.8, 1.8, 2.8])
    mm = got.mismatch.set_index(["step", "metric"])["value"]
    assert mm[(3, "token_mult_prob_error")] == pytest.approx(1.013)
    assert mm[(2, "gen_kl_error")] == pytest.approx(0.004)
    assert "train/loss" not in set(got.mismatch["key"])


def test_flat_json_lines_with_wandb_step_read_like_the_metrics_json(tmp_path):
    doc = json.loads(NEMO.read_text())
    steps: dict[int, dict[str, float]] = {}
    for tag, series in doc.items():
        for step, value in series.items():
            steps.setdefault(int(step), {})[tag] = value
    p = tmp_path / "history.jsonl"
    p.write_text("".join(json.dumps({"_step": s, **v}) + "\n" for s, v in sorted(steps.items())))
    assert detect_format(p) == METRIC_LOG
    assert load_metric_log(p).layout == "json_lines"
    pd.testing.assert_frame_equal(_wide(p), _wide(NEMO))


def test_bf16_and_mxfp8_logs_compare_like_runs():
    bf16, mx = _wide(VERL_BF16).mean(), _wide(VERL_MXFP8).mean()
    assert mx["update"] / bf16["update"] == pytest.approx(0.8)
    assert mx["sync"] - bf16["sync"] == pytest.approx(0.4)  # the MXFP8 run pays more per weight sync
    assert mx["generate"] < bf16["generate"]


def test_what_the_log_cannot_say_is_nan_with_a_note(tmp_path):
    p = tmp_path / "partial.jsonl"
    rows = [
        {"step": 1, "data": {"timing_s/gen": 3.0, "timing_s/update_actor": 2.0}},  # no step total
        {"step": 2, "data": {"timing_s/gen": 3.0, "timing_s/update_actor": 2.0, "timing_s/step": 6.0}},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = logged_step_tables(load_metric_log(p), default_phase_map())
    wide = got.steps.pivot(index="step", columns="phase", values="seconds")
    assert wide["logprob"].isna().all() and wide["sync"].isna().all()  # no timer of these phases
    assert math.isnan(wide.loc[1, "other"]) and wide.loc[2, "other"] == pytest.approx(1.0)
    assert any("no timer of phase logprob, sync: NaN, not 0" in n for n in got.notes)


def test_overlapping_timers_are_said_and_other_is_clipped(tmp_path):
    p = tmp_path / "async.jsonl"  # one-step-off-policy: generation of the next batch overlaps the update
    p.write_text(
        json.dumps(
            {"step": 5, "data": {"timing_s/gen": 8.0, "timing_s/update_actor": 6.0, "timing_s/step": 10.0}}
        )
        + "\n"
    )
    got = logged_step_tables(load_metric_log(p), default_phase_map())
    assert got.steps.set_index("phase").loc["other", "seconds"] == 0.0
    assert any("step(s) 5: the phases add up to more than the step total" in n for n in got.notes)


def test_user_phase_map_decides_the_timers_too(tmp_path):
    m = tmp_path / "map.toml"
    m.write_text("[[rule]]\npattern = '^(gen|reward)$'\nphase = 'generate'\n")
    wide = _wide(VERL_BF16, load_phase_map(m))
    assert wide["generate"].tolist() == [12.0, 13.0, 14.0]  # gen + reward
    assert wide["update"].isna().all()  # this map names no update timer


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"step": 1, "data": {"timing_s/gen": 1.0}}\n{"step": 2, "data": {"timing_s/ge',
            r"line 2: not JSON .*truncated",
        ),
        (
            '{"step": 1, "data": {"timing_s/gen": 1.0}}\n{"data": {"timing_s/gen": 1.0}}\n',
            r"line 2: no 'step'",
        ),
        ('{"step": "one", "data": {"timing_s/gen": 1.0}}\n', r"line 1: step 'one' is not a whole number"),
        (
            '{"step": 1e20, "data": {"timing_s/gen": 1.0}}\n',
            r"line 1: step 1e\+20 is not a whole number from 0",
        ),
        (
            '{"step": 100000000000000000000, "data": {}}\n',
            r"line 1: step 100000000000000000000 is not a whole",
        ),
        (
            '{"step": 1, "data": {"loss": 1.0, "lr": 0.1}}\n',
            r"line 1: no verl .* key in any step \(keys seen: loss, lr\)",
        ),
        ('{"step": 1, "data": {"timing_s/gen": "fast"}}\n', r"line 1: timing_s/gen = 'fast' is not a number"),
        (
            '{"step": 1, "data": {"timing_s/gen": -2.0}}\n',
            r"line 1: timing_s/gen = -2.0 s is a negative duration",
        ),
        ('{"step": 1, "data": [1, 2]}\n', r"line 1: 'data' is not an object"),
        (
            '{"step": 1, "data": {"timing_s/gen": 1.0, "perf/total_num_tokens": "lots"}}\n',
            r"line 1: perf/total_num_tokens = 'lots' is not a number",
        ),
        (
            '{"step": 1, "data": {"timing_s/gen": 1.0, "response_length/mean": -3.0}}\n',
            r"line 1: response_length/mean = -3.0 is a negative token or sequence count",
        ),
        ("[1, 2]\n", r"line 1: a JSON list, not an object"),
        ("\n\n", r"empty metric log"),
        (
            '{"step": 1, "rollout_corr/kl": 0.1, "timing/train/generation": 2.0}\n',
            r"as many verl as NeMo RL keys",
        ),
    ],
)
def test_bad_json_lines_log_is_one_line_naming_file_and_line(tmp_path, text, message):
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    with pytest.raises(InputError, match=rf"bad\.jsonl: {message}"):
        load_metric_log(p)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"train/gen_kl_error": {"1": 0.1, "x": 0.2}}',
            r"tag 'train/gen_kl_error': step 'x' is not a whole number",
        ),
        ('{"train/gen_kl_error": {"1": 0.1}, "timing/train/generation": {"1": ', r"line 1: not JSON"),
        ('{"train/loss": {"1": 0.1}}', r"its first tag: no verl .* key in any step"),
        (
            '{"timing/train/generation": {"1": 2.0}, "train/mean_gen_tokens_per_sample": {"1": [400]}}',
            r"tag 'train/mean_gen_tokens_per_sample' step 1: train/mean_gen_tokens_per_sample = \[400\] is not a "
            "number",
        ),
    ],
)
def test_bad_nemo_rl_metrics_json_names_file_and_tag(tmp_path, text, message):
    p = tmp_path / "metrics.json"
    p.write_text(text)
    assert detect_format(p) == METRIC_LOG
    with pytest.raises(InputError, match=rf"metrics\.json: {message}"):
        load_metric_log(p)


def test_detection_keeps_kineto_json_and_skips_per_sample_dumps_in_a_directory(tmp_path):
    kineto = tmp_path / "trace.json"
    kineto.write_text('{"schemaVersion": 1, "traceEvents": []}')
    assert detect_format(kineto) == "kineto"
    (tmp_path / "run.jsonl").write_text(VERL_BF16.read_text())
    (tmp_path / "train_data_step1.jsonl").write_text('{"content": ["hi"], "rewards": [1.0], "idx": 0}\n')
    (tmp_path / "wandb.jsonl").write_text('{"_runtime": 9.5, "_step": 1, "timing/train/generation": 2.0}\n')
    assert [(p.name, f) for p, f in expand_inputs([tmp_path])] == [
        ("trace.json", "kineto"),
        ("run.jsonl", METRIC_LOG),
        ("wandb.jsonl", METRIC_LOG),  # the step need not be the first key
    ]
    with pytest.raises(InputError, match=r"run\.jsonl: a metric log .*not a trace"):
        load_trace(tmp_path / "run.jsonl")


def test_ingest_writes_steps_and_mismatch_with_labels(tmp_path, capsys):
    (tmp_path / "bf16").mkdir()
    log = tmp_path / "bf16" / "verl_grpo_bf16.jsonl"
    log.write_text(VERL_BF16.read_text())
    (tmp_path / "bf16" / "mxperf.toml").write_text('[labels]\nprecision = "bf16"\n')
    out = tmp_path / "out"
    assert (
        main(["ingest", str(log), str(NEMO), "-o", str(out), "--label", "precision=fp8-delayed", "--json"])
        == 0
    )
    cap = capsys.readouterr()
    doc = json.loads(cap.out.strip().splitlines()[-1])
    assert [(t["format"], t["devices"]) for t in doc["traces"]] == [(METRIC_LOG, []), (METRIC_LOG, [])]
    assert doc["traces"][0]["microbatches"] == 0
    assert doc["traces"][0]["phases"] == pytest.approx(
        {"generate": 36.0, "logprob": 10.5, "update": 15.0, "sync": 2.4}
    )
    steps = store.read_table(out / store.STEPS)
    assert len(steps) == 2 * 3 * 5 and set(steps["trace"]) == {str(log), str(NEMO)}
    mm = store.read_table(out / store.MISMATCH)
    assert set(mm["precision"]) == {"fp8-delayed"}  # --label wins over the sidecar
    manifest = json.loads((out / store.MANIFEST).read_text())
    entry = manifest["traces"][1]
    assert entry["framework"] == "nemo_rl" and entry["labels"] == {"precision": "fp8-delayed"}
    assert "nemo_rl metric log (fp8-delayed): 3 steps with timers" in cap.err


def test_ingest_of_a_truncated_log_is_one_line_and_writes_nothing(tmp_path, capsys):
    p = tmp_path / "cut.jsonl"
    p.write_text(VERL_BF16.read_text()[:-40])
    out = tmp_path / "out"
    assert main(["ingest", str(p), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cut.jsonl: line 5: not JSON" in err[0]
    assert not (out / store.STEPS).exists() and not (out / store.MISMATCH).exists()


def _tokens(path: Path) -> dict[int, tuple[int | None, int | None, int | None]]:
    t = logged_step_tables(load_metric_log(path)).tokens
    assert list(t.columns) == list(schema.STEP_TOKEN_COLUMNS)
    return {
        int(r.step): tuple(
            None if pd.isna(v) else int(v) for v in (r.prompt_tokens, r.generated_tokens, r.sequences)
        )
        for r in t.itertuples()
    }


def test_verl_token_counts_are_its_own_totals():
    # 64 sequences, prompt_length/mean 120.5, response_length/mean 311, 312, 313 (README)
    assert _tokens(VERL_BF16) == {
        1: (7712, 19904, 64),
        2: (7712, 19968, 64),
        3: (7712, 20032, 64),
    }
    log = load_metric_log(VERL_MXFP8)
    counts, notes = step_tokens(log)
    assert counts[1] == StepTokens(prompt_tokens=7712, generated_tokens=19552, sequences=64) and not notes
    for step, c in counts.items():  # generated = the tokens timing_per_token_ms/gen divided timing_s/gen by
        v = log.steps[step]
        assert c.generated_tokens == pytest.approx(v["timing_s/gen"] * 1000 / v["timing_per_token_ms/gen"])
        assert c.prompt_tokens + c.generated_tokens == v["perf/total_num_tokens"]


def test_nemo_rl_token_counts_agree_with_its_total_num_tokens():
    # 32 samples (total_turns / avg_turns_per_sample), mean_prompt_length 95.5, mean_gen_tokens 402.25 ...
    assert _tokens(NEMO) == {1: (3056, 12872, 32), 2: (3056, 13136, 32), 3: (3056, 12736, 32)}
    log = load_metric_log(NEMO)
    counts, _ = step_tokens(log)
    for step, c in counts.items():  # single turn: no environment tokens in train/total_num_tokens
        assert c.prompt_tokens + c.generated_tokens == log.steps[step]["train/total_num_tokens"]


def _write_lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps({"step": i + 1, "data": r}) + "\n" for i, r in enumerate(rows)))
    return path


def test_verl_without_perf_total_takes_it_from_update_actor_per_token(tmp_path):
    row = {"timing_s/gen": 8.0, "timing_per_token_ms/gen": 8000 / 1000, "timing_s/update_actor": 3.0}
    row |= {
        "timing_per_token_ms/update_actor": 3000 / 1300,
        "prompt_length/mean": 37.5,
        "response_length/mean": 125.0,
    }
    p = _write_lines(tmp_path / "old.jsonl", [row])
    assert _tokens(p) == {1: (300, 1000, 8)}  # (300 + 1000) / (37.5 + 125) = 8 sequences


def test_what_the_log_does_not_count_is_null_never_invented(tmp_path):
    timers = {"timing_s/gen": 3.0, "timing_s/update_actor": 2.0, "timing_s/step": 6.0}
    none = _write_lines(tmp_path / "timers.jsonl", [timers, timers])
    got = logged_step_tables(load_metric_log(none))
    assert got.tokens.empty and list(got.tokens.columns) == list(schema.STEP_TOKEN_COLUMNS)
    assert not any("token" in n for n in got.notes)
    # generated tokens only (no total, no per-token time of a prompt + response timer): the rest null
    gen_only = _write_lines(tmp_path / "gen.jsonl", [{**timers, "timing_per_token_ms/gen": 3.0}])
    assert _tokens(gen_only) == {1: (None, 1000, None)}
    # NeMo RL without its rollout metrics: no counts
    doc = {k: v for k, v in json.loads(NEMO.read_text()).items() if not k.startswith("train/")}
    (tmp_path / "metrics.json").write_text(json.dumps(doc))
    assert _tokens(tmp_path / "metrics.json") == {}


def test_a_derived_count_that_is_not_whole_is_left_unknown_with_a_note(tmp_path):
    row = {"timing_s/gen": 11.0, "timing_per_token_ms/gen": 0.031, "perf/total_num_tokens": 400100}
    row |= {"prompt_length/mean": 120.5, "response_length/mean": 311.0}
    p = _write_lines(tmp_path / "odd.jsonl", [row])
    got = logged_step_tables(load_metric_log(p))
    assert _tokens(p) == {}  # 354838.7 generated tokens: neither they nor total - them are counts
    assert [n for n in got.notes if "whole" in n] == [
        "step(s) 1: prompt tokens from the logged keys is not a whole number >= 0 (45261.3 at step 1): left unknown",
        "step(s) 1: generated tokens from the logged keys is not a whole number >= 0 (354839 at step 1): left "
        "unknown",
        "step(s) 1: sequences from the logged keys is not a whole number >= 0 (927.231 at step 1): left unknown",
    ]


def test_ingest_writes_step_tokens_only_for_logs_that_give_them(tmp_path, capsys):
    timers = _write_lines(tmp_path / "timers.jsonl", [{"timing_s/gen": 3.0, "timing_s/step": 4.0}])
    out = tmp_path / "out"
    assert main(["ingest", str(VERL_BF16), str(timers), "-o", str(out), "--label", "precision=bf16"]) == 0
    err = capsys.readouterr().err
    tokens = store.read_table(out / store.STEP_TOKENS)
    assert set(tokens["trace"]) == {str(VERL_BF16)} and tokens["generated_tokens"].tolist() == [
        19904,
        19968,
        20032,
    ]
    assert "steps with token counts: prompt tokens 3, generated tokens 3, sequences 3" in err
    assert f"{timers}: verl metric log (bf16): 1 steps with timers" in err and "; no token counts" in err
    out2 = tmp_path / "out2"
    assert main(["ingest", str(timers), "-o", str(out2)]) == 0
    assert not (out2 / store.STEP_TOKENS).exists()


def test_ingest_of_a_malformed_token_count_is_one_line_exit_2(tmp_path, capsys):
    p = tmp_path / "bad.jsonl"
    lines = VERL_BF16.read_text().splitlines()
    lines[2] = lines[2].replace('"perf/total_num_tokens":27680', '"perf/total_num_tokens":"27,680"')
    p.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert main(["ingest", str(p), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mxperf ingest: error: {p}: line 3: perf/total_num_tokens = '27,680' is not a number"]
    assert not (out / store.STEP_TOKENS).exists()


def _console_line(step: int, data: dict[str, str]) -> str:
    # verl/utils/logger/aggregate_logger.py concat_dict_to_str: "step:N - key:pformat(value) - ..."
    return " - ".join([f"step:{step}", *(f"{k}:{v}" for k, v in data.items())])


def test_verl_console_lines_read_among_other_driver_output(tmp_path):
    p = tmp_path / "driver.log"
    steps = [
        {"timing_s/gen": "11.0", "timing_s/update_actor": "np.float64(5.0)", "timing_s/step": "18.0"},
        {
            "timing_s/gen": "12.0",
            "timing_s/update_actor": "5.0",
            "timing_s/step": "19.0",
            "actor/lr": "1e-06",
        },
    ]
    p.write_text(
        "Creating file logger ...\n"
        "\x1b[36m(TaskRunner pid=4242)\x1b[0m " + _console_line(1, steps[0]) + "\n"
        "(TaskRunner pid=4242) some other output - with: colons\n" + _console_line(2, steps[1]) + "\n"
    )
    assert detect_format(p) == METRIC_LOG
    log = load_metric_log(p)
    assert (log.framework, log.layout) == ("verl", "verl_console")
    wide = _wide(p)
    assert wide["generate"].tolist() == [11.0, 12.0] and wide["update"].tolist() == [5.0, 5.0]
    assert wide["other"].tolist() == pytest.approx([2.0, 2.0])
    assert log.steps[2]["actor/lr"] == pytest.approx(1e-6)


def test_a_plain_text_file_without_step_lines_is_not_a_metric_log(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("step: not a metric line\n")
    assert detect_format(p) != METRIC_LOG


def test_a_phase_missing_or_unknown_at_one_step_is_nan_there_and_so_is_other(tmp_path):
    p = tmp_path / "gappy.jsonl"
    base = {"timing_s/gen": 3.0, "timing_s/update_actor": 2.0, "timing_s/step": 6.0}
    rows = [
        {"step": 1, "data": base},
        {"step": 2, "data": {k: v for k, v in base.items() if k != "timing_s/gen"}},  # gen not logged
        {"step": 3, "data": {**base, "timing_s/update_actor": None}},  # logged as null (NaN)
        {"step": 4, "data": base},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = logged_step_tables(load_metric_log(p), default_phase_map())
    wide = got.steps.pivot(index="step", columns="phase", values="seconds")
    assert math.isnan(wide.loc[2, "generate"]) and math.isnan(wide.loc[3, "update"])
    assert math.isnan(wide.loc[2, "other"]) and math.isnan(wide.loc[3, "other"])  # never the missing time
    assert wide.loc[1, "other"] == wide.loc[4, "other"] == pytest.approx(1.0)
    assert any("step(s) 2: generate not logged" in n for n in got.notes)
    assert any("step(s) 3: update not logged, or logged as null / NaN / inf" in n for n in got.notes)


def test_a_timer_logged_in_few_steps_is_0_where_it_is_missing(tmp_path):
    p = tmp_path / "sync_every_4.jsonl"  # verl marks update_weights only at the steps that sync
    rows = [
        {
            "step": s,
            "data": {
                "timing_s/gen": 3.0,
                "timing_s/step": 4.0,
                **({"timing_s/update_weights": 0.5} if s == 4 else {}),
            },
        }
        for s in range(1, 5)
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    wide = _wide(p)
    assert wide["sync"].tolist() == [0.0, 0.0, 0.0, 0.5]
    assert wide["other"].tolist() == pytest.approx([1.0, 1.0, 1.0, 0.5])


def test_infinite_values_are_unknown_and_ingest_writes_its_manifest(tmp_path, capsys):
    p = tmp_path / "inf.jsonl"
    p.write_text(
        '{"step": 1, "data": {"timing_s/gen": Infinity, "timing_s/update_actor": 2.0, "timing_s/step": 6.0}}\n'
        '{"step": 2, "data": {"timing_s/gen": 3.0, "timing_s/update_actor": 2.0, "timing_s/step": 6.0}}\n'
    )
    assert math.isnan(load_metric_log(p).steps[1]["timing_s/gen"])
    assert main(["ingest", str(p), "-o", str(tmp_path / "o")]) == 0
    assert store.read_json(tmp_path / "o" / store.MANIFEST)["status"] == "complete"


def test_a_resumed_run_keeps_the_later_lines_and_says_so(tmp_path):
    p = tmp_path / "resumed.jsonl"
    first = [{"step": s, "data": {"timing_s/gen": 9.0, "timing_s/step": 10.0}} for s in (1, 2, 3)]
    again = [{"step": s, "data": {"timing_s/gen": 4.0, "timing_s/step": 5.0}} for s in (2, 3, 4)]
    p.write_text("# a header line\n" + "".join(json.dumps(r) + "\n" for r in first + again))
    log = load_metric_log(p)
    assert [log.steps[s]["timing_s/gen"] for s in (1, 2, 3, 4)] == [9.0, 4.0, 4.0, 4.0]
    assert log.notes == (
        "step(s) 2, 3 logged twice with other values (a resumed run?): the later lines kept",
    )
    assert log.notes[0] in logged_step_tables(log, default_phase_map()).notes
