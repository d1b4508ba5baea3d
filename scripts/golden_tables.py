"""Golden references of ``mxperf ingest`` (tests/data/golden/): freeze today's outputs, or check against them.

    .venv/bin/python scripts/golden_tables.py --check                 # every case, --stream off and on; exit 1 on a difference
    .venv/bin/python scripts/golden_tables.py --check --case quirk_ns_resolution
    .venv/bin/python scripts/golden_tables.py --write                 # re-freeze every case (an intended output change only)

Each case is ingested in-process as ``mxperf ingest INPUT -o OUT --json --stream MODE`` in a temporary
folder (cases and the comparison: ``tests/golden.py``). ``--write`` freezes the ``--stream off`` output and
then checks ``--stream on`` against it: a difference between the two modes that is not listed in
``golden.STREAM_DIFFERENCES`` fails the write. Prints one row per (case, mode), then a JSON summary line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import golden  # noqa: E402


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.exists() else 0


def _allowed(name: str, stream: str, diffs: list[str]) -> list[str]:
    """The differences left once the recorded --stream on / off differences of this case are set aside."""
    if stream == "off":
        return diffs
    known = {t for c, t in golden.STREAM_DIFFERENCES if c == name}
    return [d for d in diffs if not any(d.startswith(t) for t in known)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="(re)freeze the cases into tests/data/golden/")
    mode.add_argument("--check", action="store_true", help="compare today's outputs with the golden ones")
    ap.add_argument("--case", action="append", choices=golden.CASE_NAMES, help="only this case (repeatable)")
    ap.add_argument("--show", type=int, default=20, help="differences printed per case and mode (default 20)")
    args = ap.parse_args(argv)
    names = args.case or list(golden.CASE_NAMES)

    rows, failed, total = [], [], 0
    print(
        f"{'case':40s} {'stream':6s} {'tables':>6s} {'rows':>7s} {'events':>7s} {'KiB':>6s} {'s':>5s}  result"
    )
    with tempfile.TemporaryDirectory(prefix="mxperf-golden-") as tmp:
        for name in names:
            c, target = golden.case(name), golden.golden_dir(name)
            for stream in golden.STREAM_MODES:
                t0 = time.perf_counter()
                got = golden.ingest(c, Path(tmp) / name / stream, stream)
                seconds = time.perf_counter() - t0
                if args.write and stream == "off":
                    golden.freeze(got.out, target, got.json_line, got.facts)
                diffs = _allowed(name, stream, golden.compare(got.out, target, got.json_line, got.facts))
                tables = golden.result_tables(got.out)
                nrows = sum(len(golden._read(got.out / t)) for t in tables)
                events = sum(len(golden._read(p)) for p in golden.event_tables(got.out))
                result = "written" if args.write and stream == "off" and not diffs else "ok"
                if diffs:
                    result = f"{len(diffs)} difference(s)"
                    failed.append(f"{name} --stream {stream}")
                    total += len(diffs)
                kib = _size(target) / 1024
                print(
                    f"{name:40s} {stream:6s} {len(tables):6d} {nrows:7d} {events:7d} {kib:6.0f} {seconds:5.2f}  {result}",
                    flush=True,
                )
                for d in diffs[: args.show]:
                    print(f"    {d}", flush=True)
                if len(diffs) > args.show:
                    print(f"    ... {len(diffs) - args.show} more", flush=True)
                rows.append(
                    {"case": name, "stream": stream, "differences": len(diffs), "seconds": round(seconds, 3)}
                )
                shutil.rmtree(got.out.parent, ignore_errors=True)
    stale = []
    if args.write and not args.case:  # a case no longer listed leaves no folder behind
        for folder in sorted(p for p in golden.GOLDEN.iterdir() if p.is_dir()):
            if folder.name not in golden.CASE_NAMES:
                shutil.rmtree(folder)
                stale.append(folder.name)
    doc = {
        "mode": "write" if args.write else "check",
        "cases": len(names),
        "runs": len(rows),
        "failed": failed,
        "differences": total,
        "removed": stale,
        "golden_bytes": _size(golden.GOLDEN),
        "seconds": round(sum(r["seconds"] for r in rows), 2),
    }
    print(json.dumps(doc, separators=(",", ":")))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
