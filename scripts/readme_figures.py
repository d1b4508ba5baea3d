"""README's deterministic figures, recomputed from the very commands README shows, compared or rewritten.

    .venv/bin/python scripts/readme_figures.py --check             # list what differs; exit 1 if anything does
    .venv/bin/python scripts/readme_figures.py --write             # rewrite those figures in README.md
    .venv/bin/python scripts/readme_figures.py --results           # a benchmarks/RESULTS.md section, on stdout
    .venv/bin/python scripts/readme_figures.py --only host-stall   # one group: host-stall | consistency | faults
    .venv/bin/python scripts/readme_figures.py --check --only consistency --model tiny-dense --row bf16
                                                   # some cells of the consistency table (seconds, not minutes)

torch's CPU kernels are pinned to AVX2 (ATen's ``ATEN_CPU_CAPABILITY`` and oneDNN's ``ONEDNN_MAX_CPU_ISA``, set
before torch is imported): the consistency figures are deterministic on one kernel set but not across them (on an
AVX-512 CPU, AVX-512 kernels move kl_k3 by up to 6 % and a ratio by 0.06), and every x86-64 CPU of the last decade
has AVX2. A process whose torch already runs other kernels is refused, not compared.

Groups and tolerances (what ``--check`` and the test accept):
- ``host-stall``: ``mxperf ingest`` of the two real traces: busy and host-stall shares are integer-ns
  arithmetic on fixed files, compared exactly as printed.
- ``consistency``: ``mxperf consistency --model M --seed 0`` on the AVX2 kernels: kl_k3 within 2 % relative and
  ratios within 0.02 (room for another BLAS build); exact on any x86-64 CPU with this repository's torch. With
  ``--model`` / ``--row``, only the pairings those cells need (``run_consistency`` with the command's settings).
- ``faults``: ``mxperf faults --model tiny-dense``: counts, exactly.
Timings (speed of the tools, the demo's seconds) are measurements, never recomputed here: they live in
benchmarks/RESULTS.md with their machine and date.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import platform
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
A100 = "tests/data/real/hta_a100_ddp_rank0_hostbound.json.gz"
H100_NSYS = "tests/data/real/nsysai_h100x2_mfu_before.sqlite"
MODELS = ("tiny-dense", "tiny-moe")
# README's consistency rows: first column -> (learner, sampler label of `mxperf consistency`, with ratio)
CONSISTENCY_ROWS: dict[str, tuple[str, str, bool]] = {
    "bf16": ("mxfp8", "bf16", True),
    "mxfp8, all linear layers on the learner's grid": ("mxfp8", "mxfp8", True),
    "mxfp8, half of them (`--grid-fraction 0.5`)": ("mxfp8", "mxfp8 grid-fraction 0.5", True),
    "mxfp8-floor (another MX grid)": ("mxfp8", "mxfp8-floor", True),
    "fp8-tensor (another FP8 grid)": ("mxfp8", "fp8-tensor", True),
    "BF16 learner + BF16 sampler": ("bf16", "bf16", False),
}
HOST_STALL_TEXT = re.compile(
    r"the A100 DDP trace is (?P<a100_busy>[\d.]+) % busy with\s+host stall (?P<a100_stall>[\d.]+) % of its "
    r"span \(HTA's per-stream rule on stream 7: (?P<a100_stream7>[\d.]+)(?P<hta> vs HTA 0\.5\.0's [\d.]+\); the 2 x "
    r"H100\s+Nsight export is )(?P<h100_dev0>[\d.]+) % / (?P<h100_dev1>[\d.]+) % busy"
)
FAULTS_TEXT = re.compile(
    r"\(`mxperf faults --model tiny-dense`\): (?P<caught>\d+) of (?P<injected>\d+) injected faults(?P<mid>.*?)"
    r"(?P<false_alarms>\d+) false\s+alarms",
    re.S,
)
REL_TOL = {"consistency": 0.02}
ABS_TOL_RATIO = 0.02
# torch's CPU kernel set README's figures were computed with (see the module docstring)
KERNEL_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


@dataclass(frozen=True)
class Figure:
    key: str  # group:name
    value: str  # as README prints it


def pin_kernels() -> None:
    """Select torch's AVX2 CPU kernels: before torch is imported, or refuse (it reads them once)."""
    if "torch" not in sys.modules:
        os.environ.update(KERNEL_ENV)
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    unpinned = {k: os.environ.get(k) for k, v in KERNEL_ENV.items() if os.environ.get(k) != v}
    if capability != "AVX2" or unpinned:
        raise SystemExit(
            f"torch runs {capability} CPU kernels here ({unpinned or 'environment pinned'}): README's figures "
            "were computed with the AVX2 ones; run scripts/readme_figures.py as its own process (it pins them), "
            "on an x86-64 CPU"
        )


def _mxperf_json(argv: list[str]) -> dict:
    """Run ``mxperf ARGV --json`` in this process; the JSON of its last stdout line."""
    from mxperf.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()) as err:
        rc = main([*argv, "--json"])
    if rc not in (0, 1):
        raise SystemExit(f"mxperf {' '.join(argv)} exited {rc}: {err.getvalue().strip()[-400:]}")
    return json.loads(out.getvalue().strip().splitlines()[-1])


def _e(value: float) -> str:
    """4.98e-4 (README's style: three digits, no exponent padding)."""
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def host_stall_figures() -> list[Figure]:
    from tracing.outputs import store

    with tempfile.TemporaryDirectory() as tmp:
        a100 = _mxperf_json(["ingest", str(ROOT / A100), "-o", f"{tmp}/a"])
        streams = store.read_table(Path(tmp, "a", store.STREAMS))
        h100 = _mxperf_json(["ingest", str(ROOT / H100_NSYS), "-o", f"{tmp}/h"])
    (dev,) = a100["traces"][0]["devices"]
    s7 = streams[streams["stream"] == 7]
    devs = sorted(h100["traces"][0]["devices"], key=lambda d: (d["device"], d["pid"] or 0))
    return [
        Figure("host-stall:a100_busy", f"{100 * dev['busy_ns'] / dev['span_ns']:.1f}"),
        Figure("host-stall:a100_stall", f"{100 * dev['host_stall_ns'] / dev['span_ns']:.0f}"),
        Figure("host-stall:a100_stream7", f"{float(s7['host_wait_share'].iloc[0]):.3f}"),
        Figure("host-stall:h100_dev0", f"{100 * devs[0]['busy_ns'] / devs[0]['span_ns']:.1f}"),
        Figure("host-stall:h100_dev1", f"{100 * devs[1]['busy_ns'] / devs[1]['span_ns']:.1f}"),
    ]


def _consistency_subset(model: str, pairs: set[tuple[str, str]]) -> list[dict]:
    """The rows of ``mxperf consistency --model M --seed 0`` for some (learner, sampler) pairs only: the
    command's settings (its defaults, one thread), each pairing on the same fixed batch as in the full table."""
    import torch

    from pipeline.experiments.consistency import SAMPLER_VARIANTS, ConsistencyConfig, run_consistency

    torch.set_num_threads(1)  # device_settings' default, as the command runs
    samplers = {s for _, s in pairs} | {"bf16"}  # the ratio's denominator
    variants = tuple(v for v in SAMPLER_VARIANTS if v.label in samplers)
    learners = tuple(sorted({lp for lp, _ in pairs}))
    cfg = ConsistencyConfig(model=model, seed=0, device="auto", gemm="auto", weight_cast="per-step")
    return run_consistency(cfg, variants=variants, learners=learners).to_dict(orient="records")


def consistency_figures(
    models: tuple[str, ...] = MODELS, labels: tuple[str, ...] | None = None
) -> list[Figure]:
    """README's consistency cells; all of them from the command itself, some (``labels``) from their pairings."""
    figures = []
    for model in models:
        if labels is None:
            rows = _mxperf_json(["consistency", "--model", model, "--seed", "0"])["rows"]
        else:
            rows = _consistency_subset(model, {CONSISTENCY_ROWS[x][:2] for x in labels})
        by_pair = {(r["learner"], r["sampler"]): r for r in rows}
        for label in labels or CONSISTENCY_ROWS:
            learner, sampler, with_ratio = CONSISTENCY_ROWS[label]
            r = by_pair[(learner, sampler)]
            cell = _e(r["kl_k3"]) + (f" ({r['kl_k3_vs_bf16_sampler']:.2f})" if with_ratio else "")
            figures.append(Figure(f"consistency:{label}|{model}", cell))
    return figures


def faults_figures() -> list[Figure]:
    doc = _mxperf_json(["faults", "--model", "tiny-dense"])
    caught = sum(bool(f.get("caught")) for f in doc["faults"])
    return [
        Figure("faults:caught", str(caught)),
        Figure("faults:injected", str(len(doc["faults"]))),
        Figure("faults:false_alarms", str(doc["clean_false_alarms"])),
    ]


GROUPS: dict[str, Callable[[], list[Figure]]] = {
    "host-stall": host_stall_figures,
    "consistency": consistency_figures,
    "faults": faults_figures,
}


def _table_span(text: str) -> tuple[int, int]:
    start = text.index("| sampler | tiny-dense | tiny-moe |")
    end = text.index("\n\n", start)
    return start, end


def readme_figures(text: str) -> dict[str, str]:
    """The figures README states now (the same keys the groups compute)."""
    found: dict[str, str] = {}
    m = HOST_STALL_TEXT.search(text)
    if m is None:
        raise SystemExit(
            "README.md: the host-stall sentence is not where this script looks; update HOST_STALL_TEXT"
        )
    for name in ("a100_busy", "a100_stall", "a100_stream7", "h100_dev0", "h100_dev1"):
        found[f"host-stall:{name}"] = m[name]
    m = FAULTS_TEXT.search(text)
    if m is None:
        raise SystemExit("README.md: the faults sentence is not where this script looks; update FAULTS_TEXT")
    found.update({f"faults:{k}": m[k] for k in ("caught", "injected", "false_alarms")})
    start, end = _table_span(text)
    for line in text[start:end].splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in CONSISTENCY_ROWS:
            for model, cell in zip(MODELS, cells[1:], strict=True):
                found[f"consistency:{cells[0]}|{model}"] = cell
    return found


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", cell)]


def differs(key: str, readme: str | None, computed: str) -> bool:
    """Whether README's figure is outside the group's tolerance of the computed one."""
    if readme is None:
        return True
    if not key.startswith("consistency:"):
        return readme != computed
    a, b = _numbers(readme), _numbers(computed)
    if len(a) != len(b):
        return True
    k3_ok = abs(a[0] - b[0]) <= REL_TOL["consistency"] * abs(b[0])
    ratio_ok = len(a) < 2 or abs(a[1] - b[1]) <= ABS_TOL_RATIO
    return not (k3_ok and ratio_ok)


def rewrite(text: str, figures: list[Figure]) -> str:
    """README with the computed figures in place of the stated ones."""
    values = {f.key: f.value for f in figures}

    def sub_groups(m: re.Match[str], group: str) -> str:
        out, last = [], m.start()
        for name, start, end in sorted(
            ((n, m.start(n), m.end(n)) for n in m.re.groupindex if f"{group}:{n}" in values),
            key=lambda x: x[1],
        ):
            out += [m.string[last:start], values[f"{group}:{name}"]]
            last = end
        return "".join(out) + m.string[last : m.end()]

    text = HOST_STALL_TEXT.sub(lambda m: sub_groups(m, "host-stall"), text)
    text = FAULTS_TEXT.sub(lambda m: sub_groups(m, "faults"), text)
    start, end = _table_span(text)
    lines = text[start:end].splitlines()
    for i, line in enumerate(lines[2:], start=2):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        keys = [f"consistency:{cells[0]}|{m}" for m in MODELS]
        if cells[0] in CONSISTENCY_ROWS and all(k in values for k in keys):
            lines[i] = "| " + " | ".join([cells[0], *(values[k] for k in keys)]) + " |"
    return text[:start] + "\n".join(lines) + text[end:]


def results_section(figures: list[Figure]) -> str:
    import torch

    from tracing.outputs.manifest import machine_info

    values = {f.key: f.value for f in figures}
    machine = machine_info()
    lines = [
        f"## README figures ({dt.date.today().isoformat()}, `scripts/readme_figures.py --results`)",
        "",
        f"Machine: {machine['cpu']} x{machine['cpu_count']}, Python {platform.python_version()}, torch "
        f"{torch.__version__}, CPU kernels pinned to AVX2 (the script sets ATEN_CPU_CAPABILITY and "
        "ONEDNN_MAX_CPU_ISA). Deterministic: rerunning the commands gives the same figures on any x86-64 CPU; "
        "`scripts/readme_figures.py --check` (or `make figures`) compares README with them.",
        "",
    ]
    if any(k.startswith("consistency:") for k in values):
        lines += [
            "`mxperf consistency --model M --seed 0`: kl_k3 with an MXFP8 learner (ratio to the BF16 sampler)",
            "",
        ]
        lines += ["| sampler | " + " | ".join(MODELS) + " |", "|---|" + "---|" * len(MODELS)]
        for label in CONSISTENCY_ROWS:
            cells = [values.get(f"consistency:{label}|{m}", "-") for m in MODELS]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    if any(k.startswith("host-stall:") for k in values):
        lines.append(
            f"`mxperf ingest {A100}`: busy {values['host-stall:a100_busy']} % of the span, host stall "
            f"{values['host-stall:a100_stall']} %, stream 7 host-wait share (HTA's rule) "
            f"{values['host-stall:a100_stream7']}; `mxperf ingest {H100_NSYS}`: busy "
            f"{values['host-stall:h100_dev0']} % / {values['host-stall:h100_dev1']} %."
        )
        lines.append("")
    if any(k.startswith("faults:") for k in values):
        lines.append(
            f"`mxperf faults --model tiny-dense`: {values['faults:caught']} of {values['faults:injected']} "
            f"faults caught, {values['faults:false_alarms']} false alarms in the clean runs."
        )
        lines.append("")
    return "\n".join(lines)


def compute(
    groups: list[str], models: tuple[str, ...] = MODELS, labels: tuple[str, ...] | None = None
) -> list[Figure]:
    """The groups' figures (``models`` / ``labels``: those cells of the consistency table only)."""
    if {"consistency", "faults"} & set(groups):  # the groups that run torch
        pin_kernels()
    figures: list[Figure] = []
    for g in groups:
        print(f"[readme_figures] {g} ...", file=sys.stderr, flush=True)
        figures += consistency_figures(models, labels) if g == "consistency" else GROUPS[g]()
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="list figures outside tolerance; exit 1 if any")
    mode.add_argument("--write", action="store_true", help="rewrite README.md's figures")
    mode.add_argument("--results", action="store_true", help="print a benchmarks/RESULTS.md section")
    p.add_argument("--only", choices=sorted(GROUPS), action="append", help="one group (repeatable)")
    p.add_argument(
        "--model", choices=MODELS, action="append", help="consistency: this column only (repeatable)"
    )
    p.add_argument(
        "--row",
        choices=list(CONSISTENCY_ROWS),
        action="append",
        help="consistency: this row only (repeatable)",
    )
    p.add_argument("--readme", type=Path, default=README, help="the README to check or rewrite")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    models = tuple(m for m in MODELS if m in (args.model or MODELS))
    labels = None if args.row is None else tuple(x for x in CONSISTENCY_ROWS if x in args.row)
    figures = compute(args.only or list(GROUPS), models, labels)
    text = args.readme.read_text()
    if args.results:
        print(results_section(figures))
        return 0
    if args.write:
        args.readme.write_text(rewrite(text, figures))
        print(f"rewrote {len(figures)} figures in {args.readme}", file=sys.stderr)
        return 0
    stated = readme_figures(text)
    bad = [f for f in figures if differs(f.key, stated.get(f.key), f.value)]
    for f in bad:
        print(f"{f.key}: README says {stated.get(f.key)!r}, the command gives {f.value!r}")
    print(f"{len(figures) - len(bad)} of {len(figures)} README figures reproduce", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
