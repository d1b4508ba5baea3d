"""An nsys export's event rows read into int64 columns: mxperf's reader (ADBC's SQLite driver, Arrow batches)
against the standard library's ``sqlite3`` ``fetchall`` on the same queries.

    .venv/bin/python benchmarks/bench_nsys_reader.py [--copies 64] [--repeats 3]

The input is the real export of tests/data/real repeated ``--copies`` times (``bench_scale.nsys_copies``). Each
repeat reads every event table once with each reader in turn (same queries: ``nsys._int`` expressions, rowid
order) and checks the two give the same values. Wall seconds from ``time.perf_counter``, CPU seconds from
``time.process_time``, one process. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import bench_scale  # this folder: run as a script
import numpy as np

from tracing.ingest import nsys

QUERIES = [  # (table, integer columns with their NULL default, where)
    (
        "CUPTI_ACTIVITY_KIND_KERNEL",
        [("start", None), ('"end"', None), ("deviceId", -1), ("correlationId", -1)],
        "",
    ),
    (
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        [("start", None), ('"end"', None), ("globalTid", -1), ("nameId", -1)],
        "",
    ),
    ("NVTX_EVENTS", [("start", None), ('"end"', None), ("globalTid", -1)], 'n."end" IS NOT NULL'),
]


def _sql(table: str, cols: list[tuple[str, int | None]], where: str) -> tuple[list[str], str]:
    exprs = [nsys._int(c, d) for c, d in cols]
    return (
        exprs,
        f"SELECT {', '.join(exprs)} FROM {table} AS n {'WHERE ' + where if where else ''} ORDER BY n.rowid",
    )


def read_adbc(path: Path) -> list[np.ndarray]:
    rows = nsys.open_rows(path)
    try:
        out = []
        for table, cols, where in QUERIES:
            exprs, _ = _sql(table, cols, where)
            out.append(np.concatenate([m for m, _ in nsys._rows(path, rows, table, exprs, where=where)]))
        return out
    finally:
        rows.close()


def read_sqlite3(path: Path) -> list[np.ndarray]:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        out = []
        for table, cols, where in QUERIES:
            _, sql = _sql(table, cols, where)
            got = con.execute(sql).fetchall()
            out.append(
                np.fromiter((v for r in got for v in r), np.int64, len(got) * len(cols)).reshape(
                    -1, len(cols)
                )
            )
        return out
    finally:
        con.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / f"nsys_x{args.copies}.sqlite"
        rows = bench_scale.nsys_copies(db, args.copies)
        readers = {"adbc (mxperf)": read_adbc, "sqlite3 fetchall": read_sqlite3}
        wall: dict[str, list[float]] = {k: [] for k in readers}
        cpu: dict[str, list[float]] = {k: [] for k in readers}
        ratios = []
        for _ in range(args.repeats):
            got = {}
            for name, read in readers.items():
                w, c = time.perf_counter(), time.process_time()
                got[name] = read(db)
                wall[name].append(time.perf_counter() - w)
                cpu[name].append(time.process_time() - c)
            a, b = got.values()
            if not all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)):
                raise SystemExit("the two readers gave different values")
            ratios.append(wall["sqlite3 fetchall"][-1] / wall["adbc (mxperf)"][-1])
    load = os.getloadavg()[0]
    print(f"{rows:,} event rows in the export; {args.repeats} repeats; 1-minute load {load:.1f}")
    print(f"{'reader':<18} {'wall s (median)':>16} {'cpu s (median)':>15}")
    for name in readers:
        print(f"{name:<18} {statistics.median(wall[name]):>16.2f} {statistics.median(cpu[name]):>15.2f}")
    print(f"sqlite3 / adbc wall, median of pairs: {statistics.median(ratios):.2f}x")
    print(
        json.dumps(
            {
                "bench": "nsys_reader",
                "event_rows": rows,
                "repeats": args.repeats,
                "load": round(load, 2),
                **{f"{k.split()[0]}_wall_s": round(statistics.median(v), 3) for k, v in wall.items()},
                "sqlite3_over_adbc": round(statistics.median(ratios), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
