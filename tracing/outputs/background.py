"""A table written by a forked process while this one goes on (a streamed file's event Parquet beside its
analysis, when ``--workers`` gives a file more than one core).

:class:`BackgroundWrite` runs ``store.write_table_parts(make_parts(), path, meta)`` in a child forked now (it
reads what this process holds, copy-on-write: spill files, lookups, names); :meth:`~BackgroundWrite.wait`
returns when the file is in place. The file is the one this process would write (same code, same inputs).
A write error (read-only or full disk) is raised here as the same :class:`OutputWriteError`; anything else
that stops the child -- killed, a bug -- and this process writes the table itself, so the outcome is the
serial one. :meth:`~BackgroundWrite.cancel` (this process failed or was interrupted) stops the child and
removes its temp file. Only where ``fork`` exists (Linux); elsewhere callers write in-process.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from tracing.outputs import store
from tracing.outputs.children import FORK, die_with_parent
from tracing.outputs.errors import OutputWriteError

AVAILABLE = FORK


class BackgroundWrite:
    """``store.write_table_parts(make_parts(), path, meta)`` in a forked child (see the module docstring)."""

    def __init__(
        self,
        make_parts: Callable[[], Iterable[Any]],
        path: str | os.PathLike[str],
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.make_parts, self.path, self.meta = make_parts, Path(path), meta
        ctx = multiprocessing.get_context("fork")
        self._proc, self._recv = start_with_pipe(ctx, _write, (make_parts, self.path, meta), "mxperf-write")

    @classmethod
    def start(
        cls,
        make_parts: Callable[[], Iterable[Any]],
        path: str | os.PathLike[str],
        meta: Mapping[str, Any] | None = None,
    ) -> BackgroundWrite | None:
        """A started writer, or None where no process can be forked now (no fork here, or the system is out
        of processes or memory): the caller writes the table itself, as without a spare core."""
        if not AVAILABLE:
            return None
        try:
            return cls(make_parts, path, meta)
        except OSError:
            return None

    def wait(self) -> Path:
        """The written file's path once it is in place; the child's write error, or this process's own
        attempt when the child stopped for any other reason."""
        try:
            said = pickle.loads(self._recv.recv_bytes())
        except (EOFError, OSError, pickle.UnpicklingError):
            said = ("gone", "")
        except BaseException:  # interrupted while waiting: stop the child now, not when its write ends
            self.cancel()
            raise
        finally:
            self._recv.close()
            self._proc.join()
        if said[0] == "done" and self._proc.exitcode == 0 and self.path.is_file():
            return self.path
        if said[0] == "write":
            raise OutputWriteError(said[1])
        _remove_temp_files(self.path)
        return store.write_table_parts(self.make_parts(), self.path, self.meta)[0]

    def cancel(self) -> None:
        """Stop the child (this process is failing or was interrupted) and remove its temp file."""
        self._recv.close()
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join()
        _remove_temp_files(self.path)


def start_with_pipe(
    ctx: Any, target: Callable[..., None], args: tuple[Any, ...], name: str
) -> tuple[Any, Any]:
    """A daemon process of ``ctx`` running ``target(send, *args)``, started, and the read end of its pipe
    (EOF there when it dies). Python >= 3.12's warning about forking beside threads (pyarrow's) is not
    shown: the children use neither those threads nor their locks. The child dies with this process
    (:func:`die_with_parent`)."""
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(target, os.getpid(), send, *args), name=name, daemon=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            proc.start()
    except BaseException:
        recv.close()
        raise
    finally:
        send.close()
    return proc, recv


def _child(target: Callable[..., None], parent: int, *args: Any) -> None:
    die_with_parent(parent)
    target(*args)


def _write(
    send: Any, make_parts: Callable[[], Iterable[Any]], path: Path, meta: Mapping[str, Any] | None
) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it cancels this write
    try:
        try:
            store.write_table_parts(make_parts(), path, meta)
            said: tuple[str, str] = ("done", "")
        except OutputWriteError as exc:
            said = ("write", str(exc))
        except Exception as exc:  # the parent writes the table itself (the serial outcome, error included)
            said = ("other", f"{type(exc).__name__}: {exc}")
        send.send_bytes(pickle.dumps(said))
    except OSError:  # the parent is gone or stopped listening
        pass
    finally:
        send.close()


def _remove_temp_files(path: Path) -> None:
    """A killed child's temp file (``store.atomic_target``'s ``.NAME.*.tmp`` beside ``path``)."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        tmp.unlink(missing_ok=True)
