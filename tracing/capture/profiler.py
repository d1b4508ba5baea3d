"""Capture: torch.profiler around chosen training steps, one Kineto ``json.gz`` per rank, plus a manifest.

    with Capture(run_dir, CaptureConfig(wait=1, warmup=1, active=3)) as cap:
        for step in range(n):
            train_step()          # ranges from tracing.capture.ranges.RangeLog land in the trace as user_annotation
            cap.step()
    # -> run_dir/trace/rank-<r>.json.gz and run_dir/trace/capture-rank-<r>.json

Activities, the step schedule and the Nsight Systems bracket (``nsys=True``): docs/tracing.md, "Capture".
torch is imported only when a capture starts, so importing this module costs nothing.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import status_of

DEFAULT_ACTIVE_STEPS = 2


@dataclass(frozen=True)
class CaptureConfig:
    """Which steps to profile and what to record. Steps ``[wait + warmup, wait + warmup + active)`` are traced."""

    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = False
    cuda: bool | None = None  # None: when available
    # cudaProfilerStart/Stop around the active steps (nsys --capture-range=cudaProfilerApi)
    nsys: bool = False

    def __post_init__(self) -> None:
        if self.wait < 0 or self.warmup < 0 or self.active < 1 or self.repeat < 1:
            raise ValueError(
                f"capture schedule needs wait >= 0, warmup >= 0, active >= 1, repeat >= 1; got {self}"
            )
        if self.nsys and self.cuda:
            raise ValueError(
                "nsys=True leaves CUDA activity to Nsight Systems (CUPTI takes one subscriber: with both, "
                "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED); leave cuda=None"
            )

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    @classmethod
    def window(cls, steps: int, active: int = DEFAULT_ACTIVE_STEPS) -> CaptureConfig:
        """The default trace window over ``steps`` steps: ``active`` steps after one skipped start-up step and
        one profiler warm-up step, as far as ``steps`` allows (4 steps: skip 0, warm 1, trace 2 and 3)."""
        if steps < 1:
            raise ValueError(f"a trace window needs at least one step, got {steps}")
        active = max(1, min(active, steps))
        warmup = 1 if steps - active >= 1 else 0
        wait = 1 if steps - active - warmup >= 1 else 0
        return cls(wait=wait, warmup=warmup, active=active)

    def is_active(self, step: int) -> bool:
        """Whether 0-based step ``step`` is traced."""
        cycle, pos = divmod(step, self.cycle)
        return cycle < self.repeat and pos >= self.wait + self.warmup


def bracket_action(config: CaptureConfig, step: int, recording: bool) -> str | None:
    """What the brackets around the traced steps do before 0-based ``step`` begins (``step`` = steps so far).

    ``"start"`` entering an active step while not recording, ``"stop"`` entering an inactive one while
    recording, else None. Brackets: Nsight Systems' (cudaProfilerStart / Stop; a repeating schedule opens one
    capture range per cycle) and each companion profiler (e.g. vLLM's, in the sampler's process)::

        wait=1 warmup=1 active=2:   step 0    1    2    3    4
                                    wait  warm  [start rec  rec] stop
    """
    want = config.is_active(step)
    if want and not recording:
        return "start"
    if recording and not want:
        return "stop"
    return None


def current_rank() -> int:
    """torch.distributed rank when initialized, else $RANK, else 0."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    return int(os.environ.get("RANK", "0"))


class Companion(Protocol):
    """A profiler in another process, started and stopped with the traced steps (e.g. the vLLM sampler)."""

    def start_profile(self) -> None: ...

    def stop_profile(self) -> list[Path]: ...


class Capture:
    """Context manager around a torch.profiler session; call :meth:`step` once per training step.

    ``companions`` are started entering the active steps and stopped leaving them (:func:`bracket_action`);
    the trace files they report are listed in the capture manifest (``companion_files``).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        config: CaptureConfig | None = None,
        *,
        rank: int | None = None,
        companions: Sequence[Companion] = (),
        log: Callable[[str], None] | None = None,
    ):
        self.out_dir = Path(out_dir)
        self.log = log or (lambda msg: None)  # progress while a trace is written (seconds for a large one)
        self.config = config or CaptureConfig()
        self.rank = rank
        self.companions = list(companions)
        self.steps = 0
        self.files: list[str] = []
        self.companion_files: list[str] = []
        self._prof: Any = None
        self._cuda = False
        self._cupti = False
        self._recording = False

    def _trace_file(self) -> Path:
        path = store.trace_path(self.out_dir, self.rank if self.rank is not None else 0)
        if self.files:  # later cycles of a repeating schedule: rank-<r>.cycle<k>.json.gz
            path = path.with_name(path.name.replace(".json.gz", f".cycle{len(self.files)}.json.gz"))
        return path

    def _on_trace_ready(self, prof: Any) -> None:
        target = self._trace_file()
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_json = tempfile.mkstemp(prefix=".capture.", suffix=".json", dir=target.parent)
        os.close(fd)
        tmp_gz = tmp_json + ".gz"
        name = target.relative_to(self.out_dir)
        self.log(f"trace: writing {name} (profiler export, then gzip) ...")
        t0 = time.monotonic()
        try:
            with store.writing(target):
                prof.export_chrome_trace(tmp_json)
                with open(tmp_json, "rb") as src, gzip.open(tmp_gz, "wb", compresslevel=6) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(tmp_gz, target)
            mb = target.stat().st_size / 1e6
            self.log(f"trace: wrote {name} ({mb:.1f} MB compressed) in {time.monotonic() - t0:.1f} s")
        finally:
            Path(tmp_json).unlink(missing_ok=True)
            Path(tmp_gz).unlink(missing_ok=True)
        self.files.append(str(target))

    def __enter__(self) -> Capture:
        import torch

        cfg = self.config
        if self.rank is None:
            self.rank = current_rank()
        available = torch.cuda.is_available()
        if cfg.cuda and not available:
            raise InputError(
                "CaptureConfig(cuda=True) needs CUDA for CUPTI kernel activity, and this torch/machine has "
                "none; leave cuda=None to record CUDA activity only when it is there"
            )
        self._cuda = available if cfg.cuda is None else cfg.cuda
        if cfg.nsys and not self._cuda:
            warnings.warn(
                "nsys=True ignored: CUDA is not available, so there is no cudaProfilerApi to call",
                stacklevel=2,
            )
        # Under Nsight Systems, CUPTI belongs to nsys: torch.profiler records CPU activity (and the ranges) only.
        self._cupti = self._cuda and not cfg.nsys
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self._cupti:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with warnings.catch_warnings():  # warmup=0 is a choice here (e.g. a whole sweep), not a mistake
            warnings.filterwarnings("ignore", message=".*warmup.*")
            self._prof = torch.profiler.profile(
                activities=activities,
                schedule=torch.profiler.schedule(
                    wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat
                ),
                on_trace_ready=self._on_trace_ready,
                record_shapes=cfg.record_shapes,
                profile_memory=cfg.profile_memory,
                with_stack=cfg.with_stack,
            )
            self._prof.__enter__()
        self._edge()
        return self

    def _edge(self) -> None:
        """Start the brackets entering an active step, stop them leaving the last one."""
        action = bracket_action(self.config, self.steps, self._recording)
        if action == "start":
            self._start_brackets()
        elif action == "stop":
            self._stop_brackets()

    def _start_brackets(self) -> None:
        if self.config.nsys and self._cuda:
            import torch

            torch.cuda.profiler.start()
        for c in self.companions:
            c.start_profile()
        self._recording = True

    def _stop_brackets(self) -> None:
        if self.config.nsys and self._cuda:
            import torch

            torch.cuda.synchronize()  # the last active step's kernels belong inside the capture range
            torch.cuda.profiler.stop()
        for c in self.companions:
            self.companion_files += [os.path.relpath(f, self.out_dir) for f in c.stop_profile()]
        self._recording = False

    def step(self) -> None:
        """Mark the end of one training step."""
        if self._prof is None:
            raise RuntimeError("Capture.step() outside the `with Capture(...)` block")
        self._prof.step()
        self.steps += 1
        self._edge()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._recording:
            try:
                self._stop_brackets()
            except Exception:
                if exc_type is None:
                    raise  # else the block's own error is the one to report (a dead engine can't stop)
        if self._prof is not None:
            self._prof.__exit__(exc_type, exc, tb)
            self._prof = None
        store.write_json(
            {
                "kind": "capture",
                "rank": self.rank,
                "config": asdict(self.config),
                "cuda_activity": self._cupti,
                "nsys_bracket": bool(self.config.nsys and self._cuda),
                "steps": self.steps,
                "files": [os.path.relpath(f, self.out_dir) for f in self.files],
                "companion_files": self.companion_files,
                "status": status_of(exc_type),  # interrupted (Ctrl-C, SIGTERM) is not failed
            },
            self.out_dir / store.TRACE_DIR / f"capture-rank-{self.rank}.json",
        )
