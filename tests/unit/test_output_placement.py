"""Outputs are built beside their folder and swapped in only when complete; --force replaces only an mxperf
output of the same kind that holds nothing else and no input; failed or interrupted reruns keep the old one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracing.outputs import placement, store
from tracing.outputs.errors import OutputExistsError, OutputWriteError
from tracing.outputs.manifest import OutputDir, read_manifest, status_of


def _write(od: OutputDir, name: str, text: str) -> None:
    store.write_text(text, od.path / name)


def _make(target: Path, text: str = "v1", *, kind: str = "fit", force: bool = False) -> None:
    with OutputDir(target, kind=kind, command=["t"], force=force) as od:
        _write(od, store.REPORT, text)


def test_the_block_writes_in_a_hidden_sibling_and_the_result_appears_complete(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with OutputDir(target, kind="fit", command=["t"]) as od:
        assert od.path.parent == tmp_path and od.path.name.startswith(".out.")
        assert not target.exists()  # nothing half-written under the real name
        assert json.loads((od.path / store.MANIFEST).read_text())["status"] == "running"
        _write(od, store.REPORT, "v1")
    assert od.path == target
    m = read_manifest(target)
    assert m["status"] == "complete" and m["files"] == [store.REPORT]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp folder left


def test_a_failed_rerun_with_force_keeps_the_old_output_and_sets_the_attempt_aside(tmp_path: Path) -> None:
    target = tmp_path / "out"
    _make(target, "v1")
    with pytest.raises(RuntimeError), OutputDir(target, kind="fit", command=["t"], force=True) as od:
        _write(od, store.REPORT, "v2 (partial)")
        raise RuntimeError("boom")
    assert (target / store.REPORT).read_text() == "v1"
    assert read_manifest(target)["status"] == "complete"
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("out.failed-")]
    assert len(aside) == 1 and read_manifest(aside[0])["error"] == "RuntimeError: boom"


def test_an_interrupted_rerun_keeps_the_old_output_and_an_empty_attempt_leaves_nothing(
    tmp_path: Path,
) -> None:
    target = tmp_path / "out"
    _make(target, "v1")
    with pytest.raises(KeyboardInterrupt), OutputDir(target, kind="fit", command=["t"], force=True):
        raise KeyboardInterrupt
    assert (target / store.REPORT).read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_fresh_output_that_fails_is_left_with_its_status(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt), OutputDir(target, kind="run", command=["t"]) as od:
        _write(od, "tokenizer.json", "{}")
        raise KeyboardInterrupt
    assert read_manifest(target)["status"] == "interrupted"


def test_force_replaces_an_mxperf_output_of_the_same_kind(tmp_path: Path) -> None:
    target = tmp_path / "out"
    _make(target, "v1")
    with pytest.raises(OutputExistsError, match="pass --force"):
        _make(target, "v2")
    _make(target, "v2", force=True)
    assert (target / store.REPORT).read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the old output is gone, nothing else


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: (d / "notes.txt").write_text("mine"), "not an mxperf output"),
        (lambda d: (d / store.MANIFEST).write_text('{"kind": "fit"}'), "not an mxperf output"),
        (lambda d: (d / store.MANIFEST).write_text("{not json"), "not an mxperf output"),
    ],
)
def test_force_never_replaces_a_folder_that_is_not_an_mxperf_output(tmp_path: Path, setup, message) -> None:
    target = tmp_path / "out"
    target.mkdir()
    setup(target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    with pytest.raises(OutputExistsError, match=message):
        _make(target, force=True)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_force_refuses_an_mxperf_output_holding_a_file_mxperf_did_not_write(tmp_path: Path) -> None:
    target = tmp_path / "out"
    _make(target)
    (target / "trace").mkdir()
    (target / "trace" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match=r"holds trace/notes.txt, which mxperf did not write"):
        _make(target, force=True)
    assert (target / "trace" / "notes.txt").read_text() == "mine"


def test_force_refuses_another_kind_and_a_folder_holding_an_input(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    _make(sweep, kind="sweep")
    with pytest.raises(OutputExistsError, match="replaces only a fit output"):
        _make(sweep, kind="fit", force=True)
    with pytest.raises(OutputExistsError, match="an input of this command"):
        OutputDir(sweep, kind="sweep", force=True, inputs=[str(sweep)])
    with pytest.raises(OutputExistsError, match=r"holds .*report\.md, an input"):
        OutputDir(tmp_path, kind="fit", force=True, inputs=[str(sweep / store.REPORT)])
    assert (sweep / store.REPORT).exists()


def test_a_file_in_the_way_and_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputExistsError, match="not a directory"):
        _make(tmp_path / "f", force=True)
    (tmp_path / "empty").mkdir()
    _make(tmp_path / "empty")
    assert read_manifest(tmp_path / "empty")["status"] == "complete"


def test_an_output_written_before_manifests_listed_files_is_judged_by_its_names(tmp_path: Path) -> None:
    target = tmp_path / "old"
    target.mkdir()
    (target / store.MANIFEST).write_text(
        json.dumps({"kind": "fit", "status": "complete", "mxperf_version": "0.1.0"})
    )
    (target / store.FITS).write_text("{}")
    (target / "time_vs_tokens_x.png").write_bytes(b"png")
    _make(target, "new", force=True)
    assert (target / store.REPORT).read_text() == "new"
    (target / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match=r"notes\.txt"):
        _make(target, force=True)


def test_an_output_folder_that_cannot_be_made_is_one_error_naming_it() -> None:
    # /proc takes no new folders, for root too (a chmod'ed folder would not stop root)
    with pytest.raises(OutputWriteError, match=r"^/proc/mxperf-nowhere/out: cannot create the output folder"):
        _make(Path("/proc/mxperf-nowhere/out"))


def test_a_table_write_that_fails_names_the_table_not_a_temp_file(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(OutputWriteError, match=r"/d: cannot write \(is a directory"):
        store.write_text("x", tmp_path / "d")
    with pytest.raises(OutputWriteError, match=r"x/y.md: cannot write") as info:
        (tmp_path / "x").write_text("a file where a folder should be")
        store.write_text("x", tmp_path / "x" / "y.md")
    assert ".tmp" not in str(info.value)


def test_swap_falls_back_to_two_renames_where_exchange_is_missing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(placement, "_exchange", lambda a, b: False)
    target = tmp_path / "out"
    _make(target, "v1")
    _make(target, "v2", force=True)
    assert (target / store.REPORT).read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_status_of_names_interrupts() -> None:
    assert status_of(None) == "complete"
    assert status_of(KeyboardInterrupt) == "interrupted"
    assert status_of(ValueError) == "failed"


def test_through_a_symlink_the_linked_folder_is_replaced_and_the_link_stays(tmp_path: Path) -> None:
    real = tmp_path / "real"
    _make(real, "v1")
    link = tmp_path / "link"
    link.symlink_to(real)
    _make(link, "v2", force=True)
    assert link.is_symlink() and (real / store.REPORT).read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_the_folder_mxperf_runs_in_is_never_replaced_but_an_empty_one_is_filled(
    tmp_path: Path, monkeypatch
) -> None:
    out = tmp_path / "out"
    _make(out, "v1")
    monkeypatch.chdir(out)
    with pytest.raises(OutputExistsError, match="mxperf runs inside it"):
        _make(Path("."), force=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    inode = empty.stat().st_ino
    monkeypatch.chdir(empty)
    _make(Path("."), "here")
    assert empty.stat().st_ino == inode and (empty / store.REPORT).read_text() == "here"


def test_an_output_that_appears_meanwhile_is_not_overwritten_and_the_new_one_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with (
        pytest.raises(OutputExistsError, match="this new output was kept as"),
        OutputDir(target, kind="fit", command=["t"]) as od,
    ):
        _write(od, store.REPORT, "mine")
        _make(target, "theirs")  # another process finished first
    assert (target / store.REPORT).read_text() == "theirs"
    (kept,) = tmp_path.glob("out.new-*")
    assert (kept / store.REPORT).read_text() == "mine" and read_manifest(kept)["status"] == "complete"
