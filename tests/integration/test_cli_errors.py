"""Every bad case the CLI meets, as a table: command, exit code, message, and what must survive.

Each row runs ``mxperf`` in-process from a scratch folder built by its ``setup``. The checks are the same
for every row: the exit code; for errors exactly one line on stderr, matching the pattern, never a
traceback; every file that was there before is still there, byte for byte ("nothing lost"); and the
paths in ``absent`` were not created (config validated before any file is made).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import DATA_DIR, REPO_ROOT

from mxperf.cli import main
from tracing.capture.ranges import RangeLog
from tracing.outputs import store
from tracing.outputs.manifest import OutputDir, read_manifest

SMALL_TRACE = DATA_DIR / "real" / "hta_sampled_2rank" / "rank-0.json.gz"
CSV = DATA_DIR / "perfmodel" / "sim_no_stall.csv"
BAD_CSV = DATA_DIR / "perfmodel" / "bad_one_precision.csv"
FIT = ["--bootstrap", "50"]


def _trace_and_notes(d: Path) -> None:
    shutil.copy(SMALL_TRACE, d / "t.json.gz")
    (d / "notes.txt").write_text("my notes")


def _foreign_folder(d: Path) -> None:
    (d / "out").mkdir()
    (d / "out" / "notes.txt").write_text("not mxperf's")


def _fit_output(d: Path, name: str = "fit") -> None:
    assert main(["fit", str(CSV), "-o", str(d / name), *FIT]) == 0


def _fit_output_with_notes(d: Path) -> None:
    _fit_output(d)
    (d / "fit" / "notes.txt").write_text("added by hand")


def _sweep_output(d: Path) -> None:
    with OutputDir(d / "sweep", kind="sweep", command=["t"]) as od:
        store.write_text("x", od.path / "placeholder.txt")


def _demo_output(d: Path) -> None:
    with OutputDir(d / "demo", kind="demo", command=["t"]) as od:
        _sweep_output(od.path)


def _run_dir(d: Path, status: str) -> None:
    log = RangeLog(emit_nvtx=False)
    with log.range("update/microbatch", step=0, microbatch=0, tokens=10, precision="bf16"):
        pass
    try:
        with OutputDir(d / "run", kind="run", command=["t"], config={"model": "tiny-dense"}) as od:
            store.write_table(log.to_frame(), od.path / store.RANGES)
            if status == "interrupted":
                raise KeyboardInterrupt
            if status == "failed":
                raise RuntimeError("died")
    except (KeyboardInterrupt, RuntimeError):
        pass
    assert read_manifest(d / "run")["status"] == status


def _write(name: str, data: bytes | str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())

    return setup


def _empty_ingest(d: Path) -> None:
    (d / "empty.json").write_text('{"traceEvents": []}')
    assert main(["ingest", str(d / "empty.json"), "-o", str(d / "ing")]) == 0


def _ingest_then_bad_trace(d: Path) -> None:
    shutil.copy(SMALL_TRACE, d / "t.json.gz")
    assert main(["ingest", "t.json.gz", "-o", "ing"]) == 0
    (d / "e.json").write_text(
        '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7}]}'
    )


def _annotate_target_dir(d: Path) -> None:
    shutil.copy(SMALL_TRACE, d / "t.json.gz")
    (d / "outdir").mkdir()


RANDOM = bytes((i * 7919 + 13) % 251 for i in range(5000))  # fixed "random" bytes, not gzip, not UTF-8


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    rc: int
    pattern: str  # regex, searched in the one stderr line (errors) or in stdout+stderr (rc 0)
    setup: Callable[[Path], None] | None = None
    absent: list[str] = field(default_factory=list)  # globs that must not exist afterwards


def _trace_with_rank(rank: int | None, name: str = "t.json") -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        doc = json.loads(gzip.decompress(SMALL_TRACE.read_bytes()))
        doc["distributedInfo"] = {**(doc.get("distributedInfo") or {}), "rank": rank}
        if rank is None:
            del doc["distributedInfo"]
        (d / name).write_text(json.dumps(doc))

    return setup


CASES = [
    # ranks no int64 holds: one line, never an overflow deep in Arrow
    Case(
        "rank-flag-too-large",
        ["ingest", "t.json.gz", "-o", "out", "--rank", str(10**20)],
        2,
        r"^mxperf ingest: error: --rank 100000000000000000000: must be between 0 and 2147483647$",
        _trace_and_notes,
        ["out"],
    ),
    Case(
        "distributed-info-rank-too-large",
        ["ingest", "t.json", "-o", "out"],
        2,
        r"^mxperf ingest: error: t\.json: distributedInfo\.rank is not a rank: 100000000000000000000$",
        _trace_with_rank(10**20),
        ["out"],
    ),
    Case(
        "rank-in-a-file-name-too-large-is-no-rank",
        ["ingest", "rank99999999999999999999.json", "-o", "out"],
        0,
        r"rank99999999999999999999\.json \[kineto, rank \?\]",
        _trace_with_rank(None, "rank99999999999999999999.json"),
    ),
    Case(
        "label-size-too-large",
        ["ingest", "t.json.gz", "-o", "out", "--label", f"tokens_per_microbatch={10**20},precision=bf16"],
        2,
        r"^mxperf ingest: error: --label: label tokens_per_microbatch=100000000000000000000 must be a positive "
        r"integer up to 2\^62$",
        _trace_and_notes,
        ["out"],
    ),
    # --force and outputs
    Case(
        "force-on-folder-holding-the-input",
        ["ingest", "t.json.gz", "-o", ".", "--force"],
        2,
        r"^mxperf ingest: error: \.: holds t\.json\.gz, an input of this command",
        _trace_and_notes,
    ),
    Case(
        "force-on-a-foreign-folder",
        ["fit", str(CSV), "-o", "out", "--force", *FIT],
        2,
        r"out: not empty and not an mxperf output .*--force replaces only mxperf outputs",
        _foreign_folder,
    ),
    Case(
        "no-force-on-a-foreign-folder",
        ["ingest", str(SMALL_TRACE), "-o", "out"],
        2,
        r"out: not empty and not an mxperf output",
        _foreign_folder,
    ),
    Case(
        "force-on-mxperf-output-with-a-users-file",
        ["fit", str(CSV), "-o", "fit", "--force", *FIT],
        2,
        r"fit: holds notes\.txt, which mxperf did not write",
        _fit_output_with_notes,
    ),
    Case(
        "force-on-another-kind",
        ["fit", str(CSV), "-o", "sweep", "--force", *FIT],
        2,
        r"sweep: holds an mxperf sweep output; --force replaces only a fit output",
        _sweep_output,
    ),
    Case(
        "output-is-the-input",
        ["fit", "sweep", "-o", "sweep", "--force", *FIT],
        2,
        r"sweep: is sweep, an input of this command",
        _sweep_output,
    ),
    Case(
        "rerun-without-force",
        ["fit", str(CSV), "-o", "fit", *FIT],
        2,
        r"fit: holds an mxperf fit output \(status complete\); pass --force",
        _fit_output,
    ),
    Case(
        "failed-rerun-with-force-keeps-the-old-output",
        ["fit", str(BAD_CSV), "-o", "fit", "--force", *FIT],
        2,
        r"only one precision",
        _fit_output,
        absent=["fit.failed-*"],
    ),
    Case(
        "failed-rerun-mid-ingest-keeps-the-old-output",
        ["ingest", "t.json.gz", "e.json", "-o", "ing", "--force"],
        2,
        r"e\.json: traceEvents\[0\]: 'ts' is missing",
        _ingest_then_bad_trace,
        absent=["ing.failed-*"],  # the attempt held nothing but its manifest
    ),
    Case(
        "unwritable-parent",
        ["fit", str(CSV), "-o", "/proc/mxperf-no/fit", *FIT],
        2,
        r"/proc/mxperf-no/fit: cannot create the output folder \(No such file or directory\)",
    ),
    Case(
        "path-through-a-file",
        ["ingest", str(SMALL_TRACE), "-o", "notes.txt/out"],
        2,
        r"notes\.txt/out: notes\.txt is a file, not a folder",
        _trace_and_notes,
    ),
    Case(
        "output-is-a-file",
        ["ingest", str(SMALL_TRACE), "-o", "notes.txt", "--force"],
        2,
        r"notes\.txt: exists and is not a directory",
        _trace_and_notes,
    ),
    Case(
        "annotate-into-a-folder",
        ["annotate", "t.json.gz", "-o", "outdir"],
        2,
        r"outdir: is a folder; give a file name",
        _annotate_target_dir,
    ),
    Case(
        "annotate-over-its-input",
        ["annotate", "t.json.gz", "-o", "t.json.gz", "--force"],
        2,
        r"t\.json\.gz: is the input trace",
        _trace_and_notes,
    ),
    # configs validated before any file exists
    Case("run-negative-lr", ["run", "--lr", "-1", "-o", "r"], 2, r"--lr", absent=["r"]),
    Case("run-zero-lr", ["run", "--lr", "0", "-o", "r"], 2, r"--lr", absent=["r"]),
    Case("run-zero-threads", ["run", "--threads", "0", "-o", "r"], 2, r"--threads", absent=["r"]),
    Case(
        "run-group-of-one",
        ["run", "--samples-per-prompt", "1", "-o", "r"],
        2,
        r"--samples-per-prompt",
        absent=["r"],
    ),
    Case(
        "sweep-empty-size",
        ["sweep", "--tokens-per-microbatch", "128,,256", "-o", "s"],
        2,
        r"--tokens-per-microbatch",
        absent=["s"],
    ),
    Case(
        "sweep-negative-size",
        ["sweep", "--tokens-per-microbatch", "-128,256", "-o", "s"],
        2,
        r"--tokens-per-microbatch",
        absent=["s"],
    ),
    Case(
        "unknown-model-lists-only-trainable-presets",
        ["run", "--model", "nope", "-o", "r"],
        2,
        r"unknown model 'nope'; runs and sweeps take [^(]*tiny-dense[^(]* \([^)]*qwen3-8b[,:][^)]*shape-only",
        absent=["r"],
    ),
    Case(
        "fit-negative-min-tokens",
        ["fit", str(CSV), "-o", "f", "--min-tokens", "-1"],
        2,
        r"--min-tokens -1: must be >= 0",
        absent=["f"],
    ),
    Case(
        "fit-negative-bootstrap",
        ["fit", str(CSV), "-o", "f", "--bootstrap", "-5"],
        2,
        r"--bootstrap -5: must be >= 0",
        absent=["f"],
    ),
    # what ingest reads
    Case(
        "ingest-interrupted-run",
        ["ingest", "run", "-o", "ing"],
        2,
        r"run: an mxperf run whose manifest says 'interrupted', not complete",
        lambda d: _run_dir(d, "interrupted"),
        absent=["ing"],
    ),
    Case(
        "ingest-failed-run",
        ["ingest", "run", "-o", "ing"],
        2,
        r"run: an mxperf run whose manifest says 'failed'",
        lambda d: _run_dir(d, "failed"),
        absent=["ing"],
    ),
    Case(
        "random-bytes-named-gz",
        ["ingest", "r.json.gz", "-o", "ing"],
        2,
        r"r\.json\.gz: named \.gz but not gzip-compressed, and not JSON text",
        _write("r.json.gz", RANDOM),
    ),
    Case(
        "gzip-of-random-bytes",
        ["ingest", "r.json.gz", "-o", "ing"],
        2,
        r"r\.json\.gz: gzip-compressed, but what it holds is binary data",
        _write("r.json.gz", gzip.compress(RANDOM)),
    ),
    Case(
        "json-list-of-non-events",
        ["ingest", "l.json", "-o", "ing"],
        2,
        r"l\.json: none of the 2 items in the event list is a trace event",
        _write("l.json", '[{"a": 1}, {"b": 2}]'),
    ),
    Case(
        "event-without-ts",
        ["ingest", "e.json", "-o", "ing"],
        2,
        r"e\.json: traceEvents\[0\]: 'ts' is missing",
        _write(
            "e.json",
            '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "dur": 2}]}',
        ),
    ),
    Case(
        "non-trace-json-object",
        ["ingest", "o.json", "-o", "ing"],
        2,
        r"o\.json: no traceEvents array",
        _write("o.json", json.dumps({"rocprof": [{"k": i} for i in range(1000)]})),
    ),
    Case(
        "ingest-of-an-ingest-output",
        ["ingest", "ing", "-o", "again"],
        2,
        r"ing: already an ingest output: read it with mxperf ranges ing or mxperf fit ing",
        _empty_ingest,
        absent=["again"],
    ),
    Case(
        "ingest-of-a-fit-output",
        ["ingest", "fit", "-o", "again"],
        2,
        r"fit: a fit output \(fits\.json, report\.md\): there is nothing to ingest",
        _fit_output,
        absent=["again"],
    ),
    Case(
        "fit-of-a-demo-folder",
        ["fit", "demo", "-o", "f"],
        2,
        r"demo: an mxperf demo folder; fit its sweep: mxperf fit demo/sweep",
        _demo_output,
        absent=["f"],
    ),
    # reading outputs
    Case(
        "ranges-of-a-file",
        ["ranges", "t.json.gz"],
        2,
        r"t\.json\.gz: a file; `mxperf ranges` reads the folder `mxperf ingest` writes",
        _trace_and_notes,
    ),
    Case("ranges-of-a-missing-folder", ["ranges", "nowhere"], 2, r"nowhere: no such folder"),
    Case(
        "ranges-by-phase-without-ranges", ["ranges", "ing", "--by", "phase"], 0, r"no ranges", _empty_ingest
    ),
]


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cli_case(case: Case, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT))  # the packages, whatever the working folder
    monkeypatch.chdir(tmp_path)
    if case.setup is not None:
        case.setup(tmp_path)
    capsys.readouterr()
    before = _snapshot(tmp_path)
    rc = main(case.argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert rc == case.rc, err
    if case.rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith(f"mxperf {case.argv[0]}: error: ")
        assert re.search(case.pattern, lines[0]), lines[0]
    else:
        assert re.search(case.pattern, out + err)
    after = _snapshot(tmp_path)
    lost = [name for name, data in before.items() if after.get(name) != data]
    assert not lost, f"changed or lost: {lost}"
    for pattern in case.absent:
        assert not list(tmp_path.glob(pattern)), f"{pattern} was created"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".mxperf-partial")]


def test_a_failed_rerun_sets_nothing_aside_when_it_made_nothing(tmp_path: Path, capsys) -> None:
    _fit_output(tmp_path)
    assert main(["fit", str(BAD_CSV), "-o", str(tmp_path / "fit"), "--force", *FIT]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit"]
    assert read_manifest(tmp_path / "fit")["status"] == "complete"


def test_help_shows_defaults(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--steps STEPS default: 20" in text and "--lr LR default: 3e-05" in text
    assert "--max-new-tokens MAX_NEW_TOKENS default: 5" in text


def test_force_replaces_an_mxperf_output_and_removes_nothing_else(tmp_path: Path, capsys) -> None:
    _fit_output(tmp_path)
    (tmp_path / "keep.txt").write_text("beside the output")
    first = read_manifest(tmp_path / "fit")["created"]
    os.utime(tmp_path / "fit" / store.MANIFEST, (0, 0))
    assert main(["fit", str(CSV), "-o", str(tmp_path / "fit"), "--force", *FIT]) == 0
    m = read_manifest(tmp_path / "fit")
    assert m["status"] == "complete" and m["created"] >= first
    assert (tmp_path / "fit" / store.MANIFEST).stat().st_mtime > 0  # a new manifest, not the old one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit", "keep.txt"]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["fit", "x", "-o", "o", "--global-batch", "abc"], "--global-batch"),
        (["ingest", "x.json", "-o", "o", "--workers", "two"], "--workers"),
        (["ingest", "x.json"], "-o/--out"),
        (["nosuch"], "COMMAND"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it_not_a_usage_block(capsys, argv, flag) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and "--help" in err[0], err
