"""Build a large synthetic Kineto trace by repeating a real one's steps, for the ingest scaling benchmark.

    .venv/bin/python benchmarks/make_synthetic_trace.py --gb 1.0 -o /tmp/mxperf_synth_1gb.json.gz

Each repetition k copies every event of the source trace (default: the A100 trace in tests/data/real) with
its time shifted by k x (the source's time extent + 1 ms) and its ids (``correlation``, flow ``id``,
``External id``) renumbered by k x (the largest id + 1), so correlations stay unique and kernels still join
their launches. Timestamps keep the source's exact 3-decimal text form (written from integer ns, never
through a float). The output is gzip-compressed (level 1); its uncompressed size is about ``--gb`` GB.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from decimal import Decimal
from pathlib import Path

SRC = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "data"
    / "real"
    / "hta_a100_ddp_rank0_hostbound.json.gz"
)
HOLE = "\x00HOLE\x00"
_HOLE_JSON = json.dumps(HOLE)
ID_ARGS = ("correlation", "External id")


def _ns(us: Decimal | int) -> int:
    return int(Decimal(us) * 1000)


def _us_text(ns: int) -> str:
    q, r = divmod(ns, 1000)
    return f"{q}.{r:03d}"


def _plain(obj: object) -> object:
    """Decimals that are not times become floats (their exact value does not matter here)."""
    if isinstance(obj, Decimal):
        return float(obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def templates(events: list[dict]) -> tuple[list[tuple[list[str], list[tuple[str, int]]]], int, int]:
    """Each event -> (text parts around the holes, [(field, base value)]); plus time extent and id span."""
    out = []
    t_min = min(_ns(e["ts"]) for e in events if "ts" in e)
    t_max = max(_ns(e["ts"]) + _ns(e.get("dur", 0)) for e in events if "ts" in e)
    id_max = 0
    for e in events:
        e = _plain({k: v for k, v in e.items() if k not in ("ts",)})  # type: ignore[assignment]
        holes: list[tuple[str, int]] = []
        for key in ("id",):
            if isinstance(e.get(key), int):
                holes.append(("id", e[key]))
                id_max = max(id_max, e[key])
                e[key] = HOLE
        args = e.get("args")
        if isinstance(args, dict):
            for key in ID_ARGS:
                if isinstance(args.get(key), int) and args[key] >= 0:
                    holes.append(("id", args[key]))
                    id_max = max(id_max, args[key])
                    args[key] = HOLE
        out.append((e, holes))
    return [(_split(e), holes) for e, holes in out], t_min, t_max, id_max  # type: ignore[return-value]


def _split(e: dict) -> list[str]:
    return json.dumps(e).split(_HOLE_JSON)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=1.0, help="uncompressed size to reach (GB, 1e9 bytes)")
    p.add_argument("--source", type=Path, default=SRC)
    p.add_argument("-o", "--out", type=Path, required=True)
    args = p.parse_args()
    doc = json.loads(gzip.decompress(args.source.read_bytes()), parse_float=Decimal)
    base = doc.get("baseTimeNanoseconds")
    events = doc["traceEvents"]
    timed = [e for e in events if "ts" in e and isinstance(e.get("pid"), int)]
    parts, t_min, t_max, id_max = templates(timed)
    ts_ns = [_ns(e["ts"]) for e in timed]
    period = t_max - t_min + 1_000_000
    id_step = id_max + 1
    one_rep = sum(len("".join(pt)) + 40 for pt, _ in parts)
    reps = max(1, math.ceil(args.gb * 1e9 / one_rep))
    header = {k: v for k, v in doc.items() if k not in ("traceEvents", "baseTimeNanoseconds")}
    written = 0
    with gzip.open(args.out, "wt", compresslevel=1) as fh:
        head = json.dumps(_plain(header))[:-1]
        fh.write(head + ', "traceEvents": [\n')
        first = True
        for k in range(reps):
            shift, id_shift = k * period, k * id_step
            chunk = []
            for (pt, holes), t in zip(parts, ts_ns, strict=True):
                text = pt[0]
                for piece, (_, value) in zip(pt[1:], holes, strict=True):
                    text += str(value + id_shift) + piece
                # "ts" was removed from the template: put it back first, as exact decimal text
                text = '{"ts": ' + _us_text(t + shift) + ", " + text[1:]
                chunk.append(text)
            block = ",\n".join(chunk)
            fh.write(block if first else ",\n" + block)
            written += len(block) + 2
            first = False
        fh.write("\n]")
        if base is not None:
            fh.write(f', "baseTimeNanoseconds": {int(base)}')
        fh.write("}\n")
    print(
        json.dumps(
            {
                "out": str(args.out),
                "repetitions": reps,
                "uncompressed_bytes": written,
                "events": reps * len(parts),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
