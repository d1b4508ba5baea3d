"""Decode one Kineto file in a forked child while this process is still importing pandas (``mxperf ingest``).

A whole-process ingest of a small trace spends about half its time importing pandas and pyarrow, which the
event decoding (:mod:`tracing.ingest.kineto_decode`, numpy and msgspec only) does not need. :func:`start`
forks a child that decodes the file and sends the columns back through a pipe; :func:`claim`, called by
:func:`tracing.ingest.kineto.load_kineto_events`, takes them when the same file (same inode, size and
mtime) is asked for with the same options. The child's columns are the ones the in-process decoder would
give (it is the same code). Anything odd -- the child fails, the file changed, nobody claims it -- and the
caller decodes in-process as before (so errors are the same too); an unclaimed child is killed at exit.

Only where there is an import to overlap: a fork is made only on Linux, when pandas is not yet imported and
``MXPERF_PREFETCH`` is not ``0``.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import pickle
import signal
import sys
from array import array
from typing import TYPE_CHECKING, Any, BinaryIO

from tracing.outputs.children import FORK, die_with_parent, spare_core

if TYPE_CHECKING:
    from tracing.ingest.kineto_rows import Columns

ENV = "MXPERF_PREFETCH"
_Key = tuple[str, int, int, int, int, bool]
_PENDING: dict[_Key, tuple[int, int]] = {}  # key -> (child pid, read end of its pipe)
_AT_EXIT: Any = None  # :func:`discard`, once registered to run at exit


def enabled() -> bool:
    """Whether forking a decoder now can overlap an import (and is allowed)."""
    # one usable core: the import and the decoding would only take turns on it (a fork for nothing)
    return FORK and spare_core() and "pandas" not in sys.modules and os.environ.get(ENV, "1") != "0"


def _key(path: str | os.PathLike[str], include_python: bool) -> _Key | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, include_python)


def start(path: str | os.PathLike[str], include_python: bool) -> bool:
    """Fork a child decoding ``path`` (see the module docstring); False when none was started."""
    key = _key(path, include_python)
    if key is None or key in _PENDING or not enabled():
        return False
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return False
    gc.freeze()  # what exists now is never collected: neither process's collections touch (copy) its pages
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:  # no process to spare: the ingest decodes in-process as usual
        os.close(read_end)
        os.close(write_end)
        return False
    if pid == 0:  # the child: decode, send, leave without running the parent's exit handlers
        try:
            die_with_parent(parent)  # killed with SIGKILL, the ingest takes its decoder with it
            gc.disable()  # it makes no cycles worth collecting and exits right after
            os.close(read_end)
            quiet = os.open(os.devnull, os.O_RDWR)  # never hold the caller's stdout / stderr pipes open
            for fd in (0, 1, 2):
                os.dup2(quiet, fd)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:  # imported here, not before the fork: numpy's import runs beside the parent's pandas import
                from tracing.ingest import kineto_decode

                dec = kineto_decode.KinetoDecoder(path, include_python)
                for _ in dec.run():
                    pass
            except Exception:  # the parent decodes again and raises the exact error (nothing is sent)
                dec = None
            with os.fdopen(write_end, "wb") as out:
                if dec is not None:
                    _send(out, dec.reader.meta, dec.columns, dec.skipped)
        finally:
            os._exit(0)
    os.close(write_end)
    global _AT_EXIT
    if not _AT_EXIT:
        _AT_EXIT = atexit.register(discard)
    _PENDING[key] = (pid, read_end)
    return True


def claim(path: str | os.PathLike[str], include_python: bool) -> tuple[dict[str, Any], Any, int] | None:
    """(meta, :class:`~tracing.ingest.kineto_rows.Columns`, skipped events) a child decoded for this file, or
    None (no child for it, the file changed since, or the child failed: decode in-process)."""
    if not _PENDING:
        return None
    entry = _PENDING.pop(_key(path, include_python), None)  # type: ignore[arg-type]
    if entry is None:
        return None
    pid, read_end = entry
    try:
        with os.fdopen(read_end, "rb") as src:
            try:
                got = _receive(src)
            except Exception:  # nothing sent (the child failed) or cut short: decode in-process
                got = None
        _, status = os.waitpid(pid, 0)
    except BaseException:  # interrupted while waiting for it: the child must not outlive this process
        _stop(pid)
        raise
    return got if status == 0 else None


def _send(out: BinaryIO, meta: dict[str, Any], c: Columns, skipped: int) -> None:
    """The columns without their arrays (pickled: interned names and shapes, meta), then each array's
    bytes as they are (no pickling of 5 MB: about 15 ms less CPU for a 17 MB trace)."""
    arrays = [*c.cols.values(), c.name, c.kind, c.shape]
    c.cols = dict.fromkeys(c.cols)  # type: ignore[arg-type]  # keys (in order) only; the arrays follow
    c.name = c.kind = c.shape = None  # type: ignore[assignment]
    head = pickle.dumps((meta, c, skipped, [(a.typecode, len(a)) for a in arrays]), pickle.HIGHEST_PROTOCOL)
    out.write(len(head).to_bytes(8, "little"))
    out.write(head)
    for a in arrays:
        out.write(memoryview(a).cast("B"))


def _receive(src: BinaryIO) -> tuple[dict[str, Any], Columns, int]:
    """What :func:`_send` wrote; EOFError when it is short (or nothing: the child failed)."""
    meta, c, skipped, layout = pickle.loads(_exactly(src, int.from_bytes(_exactly(src, 8), "little")))
    arrays = []
    for typecode, n in layout:
        a = array(typecode)
        a.frombytes(_exactly(src, n * a.itemsize))
        arrays.append(a)
    if src.read(1):
        raise EOFError("more bytes than announced")
    c.cols = dict(zip(c.cols, arrays[:-3], strict=True))
    c.name, c.kind, c.shape = arrays[-3:]
    return meta, c, skipped


def _exactly(src: BinaryIO, n: int) -> bytes:
    data = src.read(n)
    if len(data) != n:
        raise EOFError(f"{len(data)} of {n} bytes")
    return data


def discard() -> None:
    """Stop and reap every unclaimed child (at exit, or by a caller that will not claim)."""
    while _PENDING:
        _, (pid, read_end) = _PENDING.popitem()
        with contextlib.suppress(OSError):
            os.close(read_end)
        _stop(pid)


def _stop(pid: int) -> None:
    """Kill and reap a child (gone already, or reaped by someone else: nothing to do)."""
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
