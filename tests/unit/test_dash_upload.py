"""dashboards.upload: an added trace lands under RUNS_DIR only, within the size limit, and is ingested by the
real ``mxperf ingest`` (its errors verbatim)."""

from __future__ import annotations

import io
from pathlib import Path

import dash_fixtures
import pytest

from dashboards import upload
from tracing.outputs import store
from tracing.outputs.errors import InputError, MxperfError


@pytest.mark.parametrize(
    ("name", "stored"),
    [
        ("rank-0.json.gz", "rank-0.json.gz"),
        ("../../etc/evil.json", "evil.json"),
        ("C:\\\\Users\\\\me\\\\trace.pt.trace.json", "trace.pt.trace.json"),
        ("my trace (1).sqlite", "my_trace_1_.sqlite"),
        (".hidden.json", "hidden.json"),
    ],
)
def test_upload_names_keep_only_a_safe_base_name(name: str, stored: str) -> None:
    assert upload.safe_upload_name(name) == stored


@pytest.mark.parametrize("name", ["notes.txt", "trace.parquet", "", "..", "archive.tar.gz"])
def test_files_that_are_not_traces_are_refused(name: str) -> None:
    with pytest.raises(InputError, match="not a trace file name"):
        upload.safe_upload_name(name)


def test_output_name_must_be_new_plain_and_inside(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "link").symlink_to(tmp_path.parent)
    assert upload.check_output_name(tmp_path, "ingest-new") == tmp_path.resolve() / "ingest-new"
    for bad in ("taken", "link", "../escape", "a/b", ".hidden", "", "x" * 101, "/abs", "uploads"):
        with pytest.raises(MxperfError):
            upload.check_output_name(tmp_path, bad)


def test_labels_are_validated_like_the_cli() -> None:
    assert upload.label_argument({"model": "", "precision": "", "tokens_per_microbatch": 0}) is None
    arg = upload.label_argument({"model": "qwen3-8b", "precision": "mxfp8", "tokens_per_microbatch": 4096})
    assert arg == "model=qwen3-8b,precision=mxfp8,tokens_per_microbatch=4096"
    with pytest.raises(InputError, match="not a precision id"):
        upload.label_argument({"precision": "fp4"})
    with pytest.raises(InputError, match="may not contain"):
        upload.label_argument({"model": "a,precision=bf16"})


def test_store_upload_writes_under_uploads_and_refuses_past_the_limit(tmp_path: Path) -> None:
    rels = upload.store_upload(tmp_path, [("rank-0.json.gz", io.BytesIO(b"x" * 10))], limit_bytes=100)
    assert (
        len(rels) == 1
        and rels[0].startswith(f"{upload.UPLOADS_DIR}/")
        and rels[0].endswith("/rank-0.json.gz")
    )
    assert (tmp_path / rels[0]).read_bytes() == b"x" * 10
    before = sorted(p.name for p in (tmp_path / upload.UPLOADS_DIR).iterdir())
    with pytest.raises(InputError, match="larger than the limit"):
        upload.store_upload(tmp_path, [("big.json", io.BytesIO(b"y" * 101))], limit_bytes=100)
    assert sorted(p.name for p in (tmp_path / upload.UPLOADS_DIR).iterdir()) == before  # nothing left behind
    with pytest.raises(InputError, match="same name"):
        upload.store_upload(tmp_path, [("a.json", io.BytesIO(b"")), ("a.json", io.BytesIO(b""))])


def test_limit_comes_from_mxperf_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(upload.MAX_UPLOAD_ENV, "3")
    assert upload.max_upload_bytes() == 3 << 20
    monkeypatch.setenv(upload.MAX_UPLOAD_ENV, "junk")
    assert upload.max_upload_bytes() == upload.DEFAULT_MAX_UPLOAD_MB << 20


def test_picked_traces_must_be_files_inside_runs_dir(tmp_path: Path) -> None:
    runs, outside = tmp_path / "runs", tmp_path / "outside"
    dash_fixtures.kineto_trace(runs / "traces" / "rank-0.json.gz", 0)
    dash_fixtures.kineto_trace(outside / "rank-1.json.gz", 1)
    (runs / "traces" / "rank-1.json.gz").symlink_to(outside / "rank-1.json.gz")
    store.write_json({"kind": "run", "status": "complete"}, runs / "run" / store.MANIFEST)
    assert upload.find_traces(runs) == ["traces/rank-0.json.gz"]  # no manifest, no link
    assert upload.check_inputs(runs, ["traces/rank-0.json.gz"]) == ["traces/rank-0.json.gz"]
    with pytest.raises(MxperfError, match="outside the runs directory"):
        upload.check_inputs(runs, ["traces/rank-1.json.gz"])
    with pytest.raises(InputError, match="not a file"):
        upload.check_inputs(runs, ["traces"])


def test_ingest_runs_the_real_command_and_reports_its_error_verbatim(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    good = upload.store_upload(
        runs,
        [("rank-0.json.gz", io.BytesIO(dash_fixtures.kineto_trace(tmp_path / "t.json.gz", 0).read_bytes()))],
    )
    lines: list[str] = []
    out = upload.run_ingest(runs, upload.ingest_command(good, "ingest-up", None), on_line=lines.append)
    assert out.ok, out.log
    assert (runs / "ingest-up" / store.DEVICES).is_file()
    assert out.result["traces"][0]["devices"][0]["rank"] == 0
    assert any("24 kernels" in ln for ln in lines)  # progress lines came through
    bad = upload.store_upload(runs, [("broken.json", io.BytesIO(b'{"traceEvents": [ {"ph": "X", '))])
    failed = upload.run_ingest(runs, upload.ingest_command(bad, "ingest-bad", None))
    assert not failed.ok
    assert failed.message.startswith("mxperf ingest: error: ") and "broken.json" in failed.message
    upload.discard_upload(runs, bad)
    assert not (runs / bad[0]).parent.exists() and (runs / good[0]).exists()


def test_the_same_trace_uploaded_twice_is_refused_not_taken_for_two_ranks(tmp_path: Path) -> None:
    trace = dash_fixtures.kineto_trace(tmp_path / "src" / "rank-0.json.gz", 0).read_bytes()
    other = dash_fixtures.kineto_trace(tmp_path / "src" / "rank-1.json.gz", 1).read_bytes()
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(InputError, match=r"rank-0_1_\.json\.gz is the same file as rank-0\.json\.gz"):
        upload.store_upload(
            runs, [("rank-0.json.gz", io.BytesIO(trace)), ("rank-0 (1).json.gz", io.BytesIO(trace))]
        )
    assert not (runs / upload.UPLOADS_DIR).exists() or not any((runs / upload.UPLOADS_DIR).iterdir())
    stored = upload.store_upload(
        runs, [("rank-0.json.gz", io.BytesIO(trace)), ("rank-1.json.gz", io.BytesIO(other))]
    )
    assert [(runs / s).read_bytes() for s in stored] == [trace, other]  # hashing left each file at its start


def test_the_same_trace_picked_twice_is_refused(tmp_path: Path) -> None:
    first = dash_fixtures.kineto_trace(tmp_path / "uploads" / "a" / "rank-0.json.gz", 0)
    (tmp_path / "uploads" / "b").mkdir()
    (tmp_path / "uploads" / "b" / "rank-0.json.gz").write_bytes(first.read_bytes())
    dash_fixtures.kineto_trace(tmp_path / "uploads" / "c" / "rank-1.json.gz", 1)
    picks = ["uploads/a/rank-0.json.gz", "uploads/b/rank-0.json.gz", "uploads/c/rank-1.json.gz"]
    assert upload.duplicate_picks(tmp_path, picks) == [(picks[0], picks[1])]
    with pytest.raises(InputError, match="identical content"):
        upload.check_inputs(tmp_path, picks)
    assert upload.check_inputs(tmp_path, [picks[0], picks[2]]) == [picks[0], picks[2]]


def test_only_files_of_equal_size_are_hashed() -> None:
    hashed = []

    def digest(name: str) -> object:
        return lambda: hashed.append(name) or "same"

    items = [("a", 10, digest("a")), ("b", 11, digest("b")), ("c", 10, digest("c"))]
    assert upload.same_content(items) == [("a", "c")] and sorted(hashed) == ["a", "c"]
