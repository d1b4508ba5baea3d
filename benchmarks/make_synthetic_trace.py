"""Build a large synthetic Kineto trace by repeating a real one's steps, or a many-rank set from real ranks.

    .venv/bin/python benchmarks/make_synthetic_trace.py --gb 1.0 -o /tmp/mxperf_synth_1gb.json.gz
    .venv/bin/python benchmarks/make_synthetic_trace.py --ranks 256 -o /tmp/ranks256/   # rank-0 .. rank-255

With ``--ranks N`` the sources default to the two real ranks of tests/data/real/hta_sampled_2rank; rank r is a
copy of source ``r % len(sources)`` with ``distributedInfo.rank = r``, its times shifted by r ms and stretched
by ``(1000 + s_r) / 1000`` with ``s_r = (37 r) % m``, ``m`` = ``--stretch-permille`` or, with more ranks than
that, the smallest ``m >= N`` that 37 does not divide (0 = no stretch): every rank's stretch differs, so step
times differ across ranks and the slowest rank of every step is known, with no ties.

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
RANK_SOURCES = tuple(sorted((SRC.parent / "hta_sampled_2rank").glob("rank-*.json.gz")))
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
        e = _plain({k: v for k, v in e.items() if k not in ("ts", "dur")})  # type: ignore[assignment]
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


class Source:
    """One real trace as event templates: the text around its id holes, and its (ts, dur) in ns."""

    def __init__(self, path: Path) -> None:
        doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
        self.base = doc.get("baseTimeNanoseconds")
        timed = [e for e in doc["traceEvents"] if "ts" in e and isinstance(e.get("pid"), int)]
        self.parts, self.t_min, self.t_max, self.id_max = templates(timed)
        self.ts_ns = [_ns(e["ts"]) for e in timed]
        self.dur_ns = [_ns(e["dur"]) if "dur" in e else None for e in timed]
        self.header = {k: v for k, v in doc.items() if k not in ("traceEvents", "baseTimeNanoseconds")}

    def events(self, shift_ns: int, id_shift: int, stretch_permille: int = 0) -> list[str]:
        """One copy of every event: times shifted (and stretched about the first event), ids renumbered."""
        f = 1000 + stretch_permille
        out = []
        for (pt, holes), t, d in zip(self.parts, self.ts_ns, self.dur_ns, strict=True):
            text = pt[0]
            for piece, (_, value) in zip(pt[1:], holes, strict=True):
                text += str(value + id_shift) + piece
            start = self.t_min + (t - self.t_min) * f // 1000
            # "ts" / "dur" were removed from the template: put them back first, as exact decimal text
            head = '{"ts": ' + _us_text(start + shift_ns)
            if d is not None:
                end = self.t_min + (t + d - self.t_min) * f // 1000
                head += ', "dur": ' + _us_text(end - start)
            out.append(head + ", " + text[1:])
        return out

    def write(self, out: Path, blocks: list[list[str]] | object, header: dict) -> int:
        """Write a trace of these event blocks; returns the uncompressed bytes of the event list."""
        written = 0
        with gzip.open(out, "wt", compresslevel=1) as fh:
            fh.write(json.dumps(_plain(header))[:-1] + ', "traceEvents": [\n')
            first = True
            for chunk in blocks:  # type: ignore[attr-defined]
                block = ",\n".join(chunk)
                fh.write(block if first else ",\n" + block)
                written += len(block) + 2
                first = False
            fh.write("\n]")
            if self.base is not None:
                fh.write(f', "baseTimeNanoseconds": {int(self.base)}')
            fh.write("}\n")
        return written


def repeated(src: Source, out: Path, gb: float, reps: int | None = None) -> dict:
    """One trace of about ``gb`` GB (or of exactly ``reps`` copies): the source's events repeated, each copy
    after the previous one."""
    period = src.t_max - src.t_min + 1_000_000
    one_rep = sum(len("".join(pt)) + 60 for pt, _ in src.parts)
    reps = reps or max(1, math.ceil(gb * 1e9 / one_rep))
    blocks = (src.events(k * period, k * (src.id_max + 1)) for k in range(reps))
    written = src.write(out, blocks, src.header)
    return {
        "out": str(out),
        "repetitions": reps,
        "uncompressed_bytes": written,
        "events": reps * len(src.parts),
    }


def stretch_modulus(ranks: int, stretch_permille: int) -> int:
    """The modulus of ``s_r = (37 r) % m``: ``stretch_permille``, raised to the smallest m >= ranks that 37
    does not divide, so every rank's stretch differs (no tie for the slowest rank of a step)."""
    if not stretch_permille:
        return 0
    m = max(stretch_permille, ranks)
    return m + 1 if m % 37 == 0 else m


def rank_set(sources: list[Source], out: Path, ranks: int, stretch_permille: int) -> dict:
    """``out/rank-<r>.json.gz`` for r < ranks (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    m = stretch_modulus(ranks, stretch_permille)
    stretch = [(37 * r) % m if m else 0 for r in range(ranks)]
    written = 0
    for r in range(ranks):
        src = sources[r % len(sources)]
        header = dict(src.header)
        dist = dict(header.get("distributedInfo") or {})
        header["distributedInfo"] = {**dist, "rank": r, "world_size": ranks}
        written += src.write(out / f"rank-{r}.json.gz", [src.events(r * 1_000_000, 0, stretch[r])], header)
    return {"out": str(out), "ranks": ranks, "uncompressed_bytes": written, "stretch_permille": stretch}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=1.0, help="uncompressed size to reach (GB, 1e9 bytes)")
    p.add_argument("--ranks", type=int, default=0, help="write a set of this many rank files into --out")
    p.add_argument("--stretch-permille", type=int, default=50, help="--ranks: largest per-rank time stretch")
    p.add_argument("--source", type=Path, action="append", help="source trace(s) (default: see above)")
    p.add_argument("-o", "--out", type=Path, required=True)
    args = p.parse_args()
    if args.ranks:
        sources = [Source(s) for s in (args.source or RANK_SOURCES)]
        info = rank_set(sources, args.out, args.ranks, args.stretch_permille)
    else:
        info = repeated(Source((args.source or [SRC])[0]), args.out, args.gb)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
