"""`mxperf ingest` / `mxperf ranges` end to end: output files, --json contract, labels, run dirs, bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mxperf.cli import main
from tracing.capture.ranges import RangeLog
from tracing.outputs import schema, store
from tracing.outputs.manifest import OutputDir, read_manifest

DATA = Path(__file__).parent.parent / "data"
REAL = DATA / "real"
A100 = REAL / "hta_a100_ddp_rank0_hostbound.json.gz"
QUIRKS = DATA / "quirks"
RANKS = REAL / "hta_sampled_2rank"
NSYS = REAL / "nsysai_h100x2_mfu_before.sqlite"
NO_GPU = DATA / "quirks" / "no_gpu_ops" / "trace.json"


def _json_line(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_ingest_writes_spec_files_and_json(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["ingest", str(A100), str(NSYS), "-o", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    doc = _json_line(captured.out)
    assert doc["schema_version"] == 1
    assert [t["format"] for t in doc["traces"]] == ["kineto", "nsys"]
    a100 = doc["traces"][0]["devices"]
    assert a100 == [
        {
            "rank": 0,
            "pid": 2910249,
            "device": 0,
            "span_ns": 660551005,
            "busy_ns": 157500014,
            "idle_ns": 503050991,
            "host_stall_ns": a100[0]["host_stall_ns"],
            "num_kernels": 2700,
            "host_stall_measured": True,
        }
    ]
    nsys = doc["traces"][1]["devices"]
    assert [(d["rank"], d["pid"], d["device"]) for d in nsys] == [(None, 144, 0), (None, 145, 1)]
    for d in a100 + nsys:
        assert set(d) == {
            "rank",
            "pid",
            "device",
            "span_ns",
            "busy_ns",
            "idle_ns",
            "host_stall_ns",
            "num_kernels",
            "host_stall_measured",
        }
        assert all(isinstance(d[k], int) for k in ("span_ns", "busy_ns", "idle_ns", "host_stall_ns"))
    assert "span 660.6 ms" in captured.err
    m = read_manifest(out)
    assert (m["kind"], m["status"]) == ("ingest", "complete")
    assert sorted(p.name for p in (out / "events").iterdir()) == [
        "rank-0.parquet",
        "rank-nsysai_h100x2_mfu_before.parquet",
    ]
    for name, cols in (
        (store.DEVICES, schema.DEVICE_COLUMNS),
        (store.RANGES, schema.RANGE_COLUMNS),
        (store.KERNELS, schema.KERNEL_COLUMNS),
        (store.STREAMS, schema.STREAM_COLUMNS),
    ):
        assert list(store.read_table(out / name).columns) == list(cols)
    events = store.read_table(out / "events" / "rank-0.parquet")
    assert list(events.columns) == list(schema.EVENT_COLUMNS) and len(events) == 26932
    assert not (out / store.MICROBATCHES).exists()  # no shapes, no labels: nothing invented
    assert [t["microbatches"] for t in doc["traces"]] == [0, 0]
    assert "sizes could not be read" in captured.err  # the A100 trace: 3 micro-batches found, no shapes
    assert not list(out.glob(".*"))  # staging removed


def test_labelled_ingest_writes_the_microbatch_contract(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(
        [
            "ingest",
            str(A100),
            "-o",
            str(out),
            "--label",
            "model=resnet50,precision=bf16,tokens_per_microbatch=2048",
        ]
    )
    assert rc == 0
    mb = store.read_table(out / store.MICROBATCHES)
    assert list(mb.columns[: len(schema.MICROBATCH_COLUMNS)]) == list(schema.MICROBATCH_COLUMNS)  # contract
    assert list(mb.columns)[-1] == "trace" and set(mb["trace"]) == {str(A100)}  # then whose trace
    # one forward/backward per ProfilerStep, found from the trace's structure, not taken as the step
    assert len(mb) == 3 and set(mb["precision"]) == {"bf16"} and set(mb["source"]) == {"detected"}
    assert mb["step"].tolist() == [4, 5, 6] and mb["repeat"].tolist() == [0, 1, 2]
    assert (mb["host_stall_seconds"] > 0).all()
    # the label says bf16, the kernels are FP32 / TF32 (s1688gemm): said, the label kept
    assert "label precision=bf16 but the GEMM kernels look fp32" in capsys.readouterr().err


def test_sidecar_toml_labels_a_trace_and_cli_overrides(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    shutil.copy(A100, d / "trace.json.gz")
    (d / "mxperf.toml").write_text(
        '[labels]\nmodel = "cnn"\nprecision = "bf16"\ntokens_per_microbatch = 512\n'
    )
    assert main(["ingest", str(d / "trace.json.gz"), "-o", str(tmp_path / "o1")]) == 0
    assert set(store.read_table(tmp_path / "o1" / store.MICROBATCHES)["model"]) == {"cnn"}
    assert (
        main(["ingest", str(d / "trace.json.gz"), "-o", str(tmp_path / "o2"), "--label", "precision=mxfp8"])
        == 0
    )
    mb = store.read_table(tmp_path / "o2" / store.MICROBATCHES)
    assert set(mb["precision"]) == {"mxfp8"} and set(mb["tokens_per_microbatch"]) == {512}


def test_microbatch_range_pattern_selects_ranges(tmp_path):
    out = tmp_path / "o"
    labels = "model=m,precision=bf16,tokens_per_microbatch=64"
    assert (
        main(["ingest", str(A100), "-o", str(out), "--label", labels, "--microbatch-range", "## backward ##"])
        == 0
    )
    assert len(store.read_table(out / store.MICROBATCHES)) == 3


def _make_run_dir(path: Path) -> None:
    log = RangeLog(emit_nvtx=False, emit_profiler=False)
    for step in range(2):
        with log.range("step", step=step):
            for mb in range(3):
                with log.range(
                    "update/microbatch", step=step, microbatch=mb, tokens=100 + mb, precision="mxfp8"
                ):
                    sum(range(1000))
    with OutputDir(path, kind="run", config={"model": "tiny-qwen3", "tokens_per_microbatch": 128}) as od:
        store.write_table(log.to_frame(), od.path / store.RANGES)


def test_run_dir_range_log_ingests_with_null_gpu_metrics(tmp_path, capsys):
    run = tmp_path / "run"
    _make_run_dir(run)
    out = tmp_path / "out"
    assert main(["ingest", str(run), "-o", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    doc = _json_line(captured.out)
    (entry,) = doc["traces"]
    assert {k: entry[k] for k in ("path", "format", "devices", "microbatches")} == {
        "path": str(run),
        "format": "rangelog",
        "devices": [],
        "microbatches": 6,
    }
    assert set(entry["phases"]) == {"update"}
    assert "no GPU devices" in captured.err
    ranges = store.read_table(out / store.RANGES)
    assert len(ranges) == 8 and ranges["host_stall_ns"].isna().all()
    assert set(ranges["gpu_reason"]) == {"mxperf range log: host clock only, no GPU activity recorded"}
    mb = store.read_table(out / store.MICROBATCHES)
    assert len(mb) == 6
    assert mb["num_tokens"].tolist() == [100, 101, 102, 100, 101, 102]
    assert set(mb["model"]) == {"tiny-qwen3"} and set(mb["precision"]) == {"mxfp8"}
    assert set(mb["tokens_per_microbatch"]) == {128}
    assert mb["gpu_busy_seconds"].isna().all() and (mb["seconds"] > 0).all()
    assert mb[["step", "microbatch"]].values.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    assert set(mb["source"]) == {"range"} and mb["repeat"].tolist() == [0, 0, 0, 1, 1, 1]


def test_cpu_only_trace_has_no_devices(tmp_path, capsys):
    assert main(["ingest", str(NO_GPU), "-o", str(tmp_path / "o"), "--json"]) == 0
    captured = capsys.readouterr()
    assert _json_line(captured.out)["traces"][0]["devices"] == []
    assert "trace has no GPU ops" in captured.err
    assert len(store.read_table(tmp_path / "o" / store.DEVICES)) == 0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: (d / "cut.json.gz").write_bytes(A100.read_bytes()[:300_000]), "truncated or corrupt gzip"),
        (lambda d: (d / "x.json").write_text('{"nope": 1}'), "no traceEvents array"),
        (lambda d: (d / "r.nsys-rep").write_bytes(b"\0rep"), "nsys export --type sqlite"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_parquet(tmp_path, capsys, make, message):
    src = tmp_path / "in"
    src.mkdir()
    make(src)
    bad = next(src.iterdir())
    out = tmp_path / "out"
    assert main(["ingest", str(A100), str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and str(bad) in err[0]
    assert not out.exists()  # nothing left behind: not even a manifest of the failed attempt


def test_a_trace_given_twice_or_copied_is_refused_not_taken_as_two_ranks(tmp_path, capsys):
    copy = tmp_path / "copy.json.gz"
    shutil.copy(A100, copy)
    for args, said in (
        ([str(A100), str(copy)], "the same bytes as"),
        ([str(A100), str(A100)], "given twice"),
        ([str(RANKS / "rank-0.json.gz"), str(RANKS)], "given twice"),  # a file and the folder it is in
    ):
        out = tmp_path / f"out{len(said)}{len(args[1])}"
        assert main(["ingest", *args, "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0] and "pass each trace once" in err[0]
        assert not out.exists() or list(out.rglob("*.parquet")) == []


def test_missing_file_and_bad_label_exit_2(tmp_path, capsys):
    assert main(["ingest", str(tmp_path / "missing.json"), "-o", str(tmp_path / "o")]) == 2
    assert "missing.json: no such file" in capsys.readouterr().err
    assert main(["ingest", str(A100), "-o", str(tmp_path / "o2"), "--label", "precision=fp7"]) == 2
    assert "not a precision id" in capsys.readouterr().err
    # a partial label is fine: the trace cannot give sizes, so nothing is written and the note says why
    assert main(["ingest", str(A100), "-o", str(tmp_path / "o3"), "--label", "model=m"]) == 0
    err = capsys.readouterr().err
    assert "3 micro-batches found (detected), 0 kept" in err and "3 left out: sizes could not be read" in err
    assert "record_shapes=True" in err
    assert not (tmp_path / "o3" / store.MICROBATCHES).exists()


def test_existing_output_is_never_overwritten(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["ingest", str(A100), "-o", str(out)]) == 2
    assert (out / "keep.txt").read_text() == "mine"


def test_local_process_pool_matches_serial_ingest(tmp_path, capsys):
    assert main(["ingest", str(RANKS), "-o", str(tmp_path / "serial"), "--json"]) == 0
    serial = _json_line(capsys.readouterr().out)
    assert main(["ingest", str(RANKS), "-o", str(tmp_path / "pool"), "--json", "--workers", "2"]) == 0
    pooled = _json_line(capsys.readouterr().out)
    assert pooled == serial
    assert [d["rank"] for t in serial["traces"] for d in t["devices"]] == [0, 1]
    assert sorted(p.name for p in (tmp_path / "pool" / "events").iterdir()) == [
        "rank-0.parquet",
        "rank-1.parquet",
    ]
    pd.testing.assert_frame_equal(
        store.read_table(tmp_path / "serial" / store.RANGES).drop(columns="trace"),
        store.read_table(tmp_path / "pool" / store.RANGES).drop(columns="trace"),
    )


def test_ranges_group_per_op_ids_of_nsys_nvtx_names(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["ingest", str(NSYS), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["ranges", str(out), "--match", "^aten::copy_", "--json"]) == 0
    rows = {r["name"]: r for r in _json_line(capsys.readouterr().out)["ranges"]}
    assert rows["aten::copy_, op_id = *"]["count"] > 1000  # one row, not one per op id
    assert main(["ranges", str(out), "--top", "-1"]) == 2
    assert "--top -1: must be >= 0" in capsys.readouterr().err


def test_ranges_command_lists_heaviest_ranges(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["ingest", str(A100), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["ranges", str(out), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[1].startswith("ProfilerStep#*") and len(text.splitlines()) == 4
    assert main(["ranges", str(out), "--match", "backward", "--json"]) == 0
    rows = _json_line(capsys.readouterr().out)["ranges"]
    assert [r["name"] for r in rows] == ["## backward ##"] and rows[0]["count"] == 3


def test_a_bad_file_in_a_process_pool_is_one_line_and_exit_2(tmp_path):
    # the worker's TraceFormatError crosses the process boundary whole (pickled as (path, problem))
    src = tmp_path / "in"
    src.mkdir()
    for f in sorted(RANKS.iterdir()):
        shutil.copy(f, src / f.name)
    (src / "rank-2.json").write_text('{"traceEvents": [{"ph": "X"')
    out = tmp_path / "o"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mxperf",
            "ingest",
            str(src),
            "-o",
            str(out),
            "--workers",
            "2",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 1 and "rank-2.json" in lines[0], proc.stderr
    assert not out.exists()


def test_negative_durations_are_said_not_refused(tmp_path, capsys):
    kernel = '{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":%s,"dur":%s,"args":{"stream":7}}'
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [' + ", ".join([kernel % (1, -1), kernel % (5, 2)]) + "]}")
    assert main(["ingest", str(trace), "-o", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "1 events have a negative duration" in err and "busy time may be short" in err
    assert store.read_table(tmp_path / "o" / store.DEVICES)["busy_ns"].tolist() == [2000]


def test_nsys_ops_that_end_before_they_start_are_said_too(tmp_path, capsys):
    import sqlite3

    db = tmp_path / "report.sqlite"
    shutil.copy(next((QUIRKS / "nsys_non_utf8_text").glob("*.sqlite")), db)
    with sqlite3.connect(db) as con:
        con.execute(
            'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 5 '
            "WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"
        )
    assert main(["ingest", str(db), "-o", str(tmp_path / "o")]) == 0
    assert "1 events have a negative duration" in capsys.readouterr().err


def test_negative_rank_is_refused(tmp_path, capsys):
    assert main(["ingest", str(A100), "-o", str(tmp_path / "o"), "--rank", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--rank -1" in err[0]
    assert not (tmp_path / "o").exists()


def test_cli_subprocess_prints_no_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    proc = subprocess.run(
        [sys.executable, "-m", "mxperf", "ingest", str(bad), "-o", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_traced_run_dir_ingests_range_log_and_its_kineto_trace(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from tracing.capture.profiler import Capture, CaptureConfig

    run = tmp_path / "run"
    log = RangeLog(emit_nvtx=False)
    layer = torch.nn.Linear(8, 8)
    with OutputDir(run, kind="run", config={"model": "tiny", "tokens_per_microbatch": 64}) as od:
        with Capture(od.path, CaptureConfig(wait=0, warmup=1, active=2), rank=0) as cap:
            for step in range(3):
                with log.range("update/microbatch", step=step, microbatch=0, tokens=60, precision="bf16"):
                    layer(torch.randn(2, 8)).sum().backward()
                cap.step()
        store.write_table(log.to_frame(), od.path / store.RANGES)
    out = tmp_path / "out"
    assert main(["ingest", str(run), "-o", str(out), "--json"]) == 0
    doc = _json_line(capsys.readouterr().out)
    assert [t["format"] for t in doc["traces"]] == ["rangelog", "kineto"]
    assert sorted(p.name for p in (out / "events").iterdir()) == ["rank-0.parquet", "rank-rangelog.parquet"]
    mb = store.read_table(out / store.MICROBATCHES)
    assert len(mb) == 3  # every step from the range log, not only the 2 profiled ones
    ranges = store.read_table(out / store.RANGES)
    traced = ranges[(ranges["source"] == "user_annotation") & (ranges["name"] == "update/microbatch")]
    assert len(traced) == 2
    # `mxperf ranges` counts each range once (from the range log, every step), says so; --trace picks the trace
    assert main(["ranges", str(out), "--match", "^update/microbatch$", "--json"]) == 0
    captured = capsys.readouterr()
    assert "counted once, from the range log" in captured.err and "rank-0.json.gz" in captured.err
    assert _json_line(captured.out)["ranges"][0]["count"] == 3  # not 3 logged + 2 traced
    assert main(["ranges", str(out), "--match", "^update/microbatch$", "--trace", "rank-0", "--json"]) == 0
    captured = capsys.readouterr()
    assert "sources" not in captured.err and _json_line(captured.out)["ranges"][0]["count"] == 2


def test_python_functions_are_kept_only_when_asked(tmp_path):
    trace = tmp_path / "stack.json"
    events = [
        {
            "ph": "X",
            "cat": "python_function",
            "name": "train.py(12): step",
            "pid": 1,
            "tid": 1,
            "ts": 1,
            "dur": 9,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 2, "dur": 3},
    ]
    trace.write_text(json.dumps({"traceEvents": events}))
    kinds = {}
    for flag in ([], ["--python-functions"]):
        out = tmp_path / f"out{len(flag)}"
        assert main(["ingest", str(trace), "-o", str(out), *flag]) == 0
        (events_file,) = (out / "events").glob("*.parquet")
        kinds[bool(flag)] = sorted(store.read_table(events_file)["kind"].astype(str))
        assert read_manifest(out)["config"]["python_functions"] is bool(flag)
    assert kinds == {False: ["cpu_op"], True: ["cpu_op", "python"]}


def test_user_mistakes_get_one_line_naming_the_problem(tmp_path, capsys):
    labels = "model=m,precision=bf16,tokens_per_microbatch=64"
    args = ["ingest", str(A100), "--microbatch-range", "([", "--label", labels, "-o", str(tmp_path / "re")]
    assert main(args) == 2
    assert "--microbatch-range '([': not a regular expression" in capsys.readouterr().err
    assert not (tmp_path / "re").exists()
    fake = tmp_path / "export.sqlite"
    fake.write_text("not sqlite at all")
    assert main(["ingest", str(fake), "-o", str(tmp_path / "fk")]) == 2
    assert "export.sqlite: not an SQLite file" in capsys.readouterr().err


def test_a_bad_sidecar_value_is_named_and_the_command_line_wins(tmp_path, capsys):
    d = tmp_path / "t"
    d.mkdir()
    shutil.copy(A100, d / "trace.json.gz")
    (d / "mxperf.toml").write_text('model = "cnn"\nprecision = "BF16"\ntokens_per_microbatch = 512\n')
    assert main(["ingest", str(d / "trace.json.gz"), "-o", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err
    assert "mxperf.toml: label precision='BF16' is not a precision id" in err
    assert (
        main(["ingest", str(d / "trace.json.gz"), "-o", str(tmp_path / "o2"), "--label", "precision=bf16"])
        == 0
    )
    assert set(store.read_table(tmp_path / "o2" / store.MICROBATCHES)["precision"]) == {"bf16"}


def test_labelled_ingest_without_microbatch_ranges_is_explained_by_fit(tmp_path, capsys):
    out = tmp_path / "o"
    labels = "model=m,precision=bf16,tokens_per_microbatch=64"
    assert (
        main(["ingest", str(A100), "--microbatch-range", "no_such_range", "--label", labels, "-o", str(out)])
        == 0
    )
    capsys.readouterr()
    assert main(["fit", str(out), "-o", str(tmp_path / "fit")]) == 2
    err = capsys.readouterr().err
    assert "is labelled (model=m" in err and "no micro-batches were found" in err
    assert "no range matches --microbatch-range 'no_such_range'" in err  # the ingest's own note


def test_annotated_trace_is_readable_like_every_other_output(tmp_path):
    out = tmp_path / "a.json.gz"
    assert main(["annotate", str(A100), "-o", str(out)]) == 0
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask


def test_host_stall_not_measured_is_said(tmp_path, capsys):
    """An export without its CUDA runtime calls (no launch records) has no measurable host stall: the summary
    says "unknown" and why, never "0.0 %"; the real export's lines are unchanged."""
    import sqlite3

    stripped = tmp_path / "no_runtime.sqlite"
    shutil.copy(NSYS, stripped)
    with sqlite3.connect(stripped) as db:
        db.execute("drop table CUPTI_ACTIVITY_KIND_RUNTIME")
    assert main(["ingest", str(stripped), "-o", str(tmp_path / "a"), "--no-progress", "--json"]) == 0
    got = capsys.readouterr()
    err = got.err
    assert "pid 144 device 0: span 299.8 ms, busy 273.8 ms (91.3 %), host stall unknown, 1993 kernels" in err
    # the machine-readable line and the table say it too: not a measured 0
    device = json.loads(got.out.strip().splitlines()[-1])["traces"][0]["devices"][0]
    assert (device["host_stall_ns"], device["host_stall_measured"]) == (0, False)
    assert store.read_table(tmp_path / "a" / store.DEVICES)["host_stall_fraction"].isna().all()
    assert "26.0 ms of its 26.0 ms idle ends at a GPU op whose launch call is not in the trace" in err
    assert "host stall 0.0 ms" not in err
    # `mxperf ranges` shows '-' for what the ranges launched, and says why
    assert main(["ranges", str(tmp_path / "a"), "--top", "2"]) == 0
    err = capsys.readouterr().err
    assert (
        "range(s) without GPU figures ('-'): no launch call in the trace ties GPU work to this process" in err
    )
    assert main(["ingest", str(NSYS), "-o", str(tmp_path / "b"), "--no-progress", "--json"]) == 0
    got = capsys.readouterr()
    err = got.err
    assert "pid 144 device 0: span 299.8 ms, busy 273.8 ms (91.3 %), host stall 19.9 ms (6.7 %)" in err
    assert all(
        d["host_stall_measured"] for d in json.loads(got.out.strip().splitlines()[-1])["traces"][0]["devices"]
    )
    assert "launch call is not in the trace" not in err
    assert main(["ranges", str(tmp_path / "b"), "--top", "2"]) == 0
    assert "without GPU figures" not in capsys.readouterr().err
