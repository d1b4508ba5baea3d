"""The manifest's ``git_sha`` read from a checkout's files equals what ``git rev-parse HEAD`` says: a branch
(loose ref), packed refs, a detached HEAD; a worktree is left to git."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tracing.outputs.manifest import _sha_from_files, git_sha

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")


def _git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip()


def test_the_sha_from_files_is_gits_own(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg" / "sub").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "pkg" / "a.txt").write_text("a")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    inside = repo / "pkg" / "sub"
    assert _sha_from_files(inside) == _git(repo, "rev-parse", "HEAD")  # loose ref
    _git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert _sha_from_files(inside) == _git(repo, "rev-parse", "HEAD")  # packed
    (repo / "pkg" / "a.txt").write_text("b")
    _git(repo, "commit", "-q", "-am", "two")
    first = _git(repo, "rev-parse", "HEAD~1")
    _git(repo, "checkout", "-q", first)
    assert _sha_from_files(inside) == first  # detached
    worktree = tmp_path / "wt"
    _git(repo, "worktree", "add", "-q", "--detach", str(worktree), "main")
    assert _sha_from_files(worktree) is None  # a .git file: git resolves it


def test_this_checkouts_sha_is_reported_as_git_says():
    here = Path(__file__).resolve().parent
    proc = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("not running from a git checkout")
    assert git_sha() == proc.stdout.strip()
