"""Plain-text and Markdown tables of results."""

from __future__ import annotations

import math
from typing import Sequence

from servelab.bench.load import Result

COLUMNS = (("label", "run"), ("sent", "sent"), ("ok", "ok"), ("errors", "err"),
           ("throughput", "req/s"), ("mean_ms", "mean ms"), ("p50_ms", "p50 ms"),
           ("p95_ms", "p95 ms"), ("p99_ms", "p99 ms"))
SERVER_COLUMNS = (("server_queue_ms", "queue ms"), ("server_compute_infer_ms", "infer ms"),
                  ("avg_batch", "avg batch"))


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.1f}" if abs(v) >= 100 else f"{v:.2f}"
    return "-" if v in (None, "") else str(v)


def rows(results: Sequence[Result], server: bool | None = None) -> tuple[list[str], list[list[str]]]:
    cols = list(COLUMNS)
    if server is None:
        server = any(r.server for r in results)
    if server:
        cols += list(SERVER_COLUMNS)
    if any(r.late is not None for r in results):
        cols.append(("late", "late"))
    if any(r.dropped for r in results):
        cols.append(("dropped", "dropped"))
    if any(r.validity is not None for r in results):
        cols.append(("valid", "valid"))
    body = []
    for r in results:
        row = r.row()
        body.append([_fmt(row.get(k)) for k, _ in cols])
    return [h for _, h in cols], body


def text(results: Sequence[Result], server: bool | None = None) -> str:
    head, body = rows(results, server)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths)))]
    for b in body:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(b, widths))))
    return "\n".join(lines)


def markdown(results: Sequence[Result], server: bool | None = None) -> str:
    head, body = rows(results, server)
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    out += ["| " + " | ".join(b) + " |" for b in body]
    return "\n".join(out)
