"""Triton's trace API, and each traced request's timeline.

Every local tritonserver the kit starts writes traces to ``<workdir>/traces/trace.json``
(``--trace-config=triton,file=...``) with tracing OFF. Triton 2.51 refuses to move the
file over the network ("trace file location can not be updated through network
protocol"); the level, rate and count change through the trace API, which the kit keeps
behind the admin key (``servelab.triton.server.RESTRICTED_APIS``).

``Tracing(url, admin_key)`` turns TIMESTAMPS on for every request, with a ``log_frequency``
larger than any run: Triton holds the traces and writes them when tracing is turned OFF, to a
new numbered file beside the configured one (``trace.json.0``, ``.1``, ...), whole and closed.
(Checked on tritonserver 2.51. With ``log_frequency`` 0 it writes into ``trace.json`` itself
through a buffered stream that stays open until shutdown: after the update the file held
none, or part, of what was traced.) ``read(path)`` merges the numbered files' entries per
trace id; trace ids restart with each server, request ids do not (each run uses its own).

A request's timeline is a chain of instants, each later than the one before; the stages
are the differences, so they add up to the client's own time for that request:

    client send -> RECV_START        client to server (the request on the wire)
    RECV_START  -> RECV_END          receive (the body read off the socket)
    RECV_END    -> REQUEST_START     parse (the body into tensors)
    REQUEST_START -> COMPUTE_START   queue (the scheduler: waits for an instance, forms a batch)
    COMPUTE_START -> COMPUTE_INPUT_END        compute input (inputs to the backend)
    COMPUTE_INPUT_END -> COMPUTE_OUTPUT_START compute infer (the model)
    COMPUTE_OUTPUT_START -> response complete compute output
    response complete -> SEND_END    send
    SEND_END -> client receive       server to client (and the client reading the answer)

An ensemble's request has one child trace per step (``parent_id``): each step adds its own
queue and compute stages, and the time between steps is ``handoff``. Triton stamps with
the steady clock (CLOCK_MONOTONIC on Linux), the clock of Python's ``time.monotonic_ns``:
a client on the same machine (or in a container on the same kernel) lines up with them.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

from servelab.triton.install import HTTP_ADMIN_HEADER

TRACE_DIR = "traces"          # under a local server's workdir
TRACE_FILE = "trace.json"
HOLD_ALL = "1000000"          # log_frequency: more traces than any run sends (written at OFF)
STAGES = ("client to server", "receive", "parse", "queue", "compute input", "compute infer",
          "compute output", "handoff", "send", "server to client")


class TraceError(RuntimeError):
    pass


def server_args(workdir: Path) -> list[str]:
    """tritonserver flags: traces to ``<workdir>/traces/trace.json``, tracing off until asked. A
    new server numbers its files from 0 again: an earlier server's files there are removed."""
    (workdir / TRACE_DIR).mkdir(parents=True, exist_ok=True)
    for old in (workdir / TRACE_DIR).glob(TRACE_FILE + "*"):
        old.unlink(missing_ok=True)
    return [f"--trace-config=triton,file={workdir / TRACE_DIR / TRACE_FILE}", "--trace-config=level=OFF"]


def settings(url: str, admin_key: str | None, update: dict | None = None, timeout: float = 10.0) -> dict:
    """GET (or POST ``update`` to) the server-wide ``/v2/trace/setting`` with the admin key."""
    import requests

    path = "/v2/trace/setting"
    headers = {HTTP_ADMIN_HEADER: admin_key} if admin_key else {}
    base = url if url.startswith("http") else f"http://{url}"
    r = (requests.post(base + path, json=update, headers=headers, timeout=timeout) if update is not None
         else requests.get(base + path, headers=headers, timeout=timeout))
    if r.status_code != 200:
        raise TraceError(f"{'POST' if update is not None else 'GET'} {path}: HTTP {r.status_code} {r.text[:200]}")
    return r.json()


class Tracing:
    """``with Tracing(url, key) as t: ...`` traces every request in the block;
    ``t.collect(ids)`` afterwards reads them from the file (which must be on this machine)."""

    def __init__(self, url: str, admin_key: str | None):
        self.url, self.admin_key = url, admin_key

    def __enter__(self) -> Tracing:
        now = settings(self.url, self.admin_key)
        if now.get("trace_mode") != "triton" or not now.get("trace_file"):
            raise TraceError(f"this Triton does not trace to a file: {now}")
        self.path = Path(now["trace_file"])
        if not self.path.parent.is_dir():
            raise TraceError(f"{self.path}: not on this machine (read traces where Triton runs)")
        settings(self.url, self.admin_key, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                                            "trace_count": "-1", "log_frequency": HOLD_ALL})
        return self

    def __exit__(self, *exc) -> None:
        settings(self.url, self.admin_key, {"trace_level": ["OFF"]})   # Triton writes what it holds now

    def collect(self, request_ids: set[str], wait_s: float = 30.0) -> dict:
        """The traces of ``request_ids`` (and their children), once the file holds them all
        (or ``wait_s`` has passed: then what it holds)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                traces = read(self.path)
            except (OSError, ValueError):
                traces = {}
            mine = {key for key, t in traces.items() if t.get("request_id") in request_ids}
            found = {key: t for key, t in traces.items() if key in mine or t.get("parent") in mine}
            if len(mine) >= len(request_ids) or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def read(path: Path) -> dict[tuple[str, int], dict]:
    """{(file name, trace id): {"model", "version", "request_id", "parent", "ns": {stamp: ns}}} from
    every numbered file beside ``path`` (``trace.json.0``, ...: each a whole JSON array). A child
    trace's ``parent`` is its parent's key (Triton writes a request's traces into one file)."""
    path = Path(path)
    traces: dict[tuple[str, int], dict] = {}
    for f in sorted(path.parent.glob(path.name + ".*")):
        for e in json.loads(f.read_text()):
            t = traces.setdefault((f.name, e["id"]), {"ns": {}, "parent": None})
            if "model_name" in e:
                t.update(model=e["model_name"], version=e.get("model_version"), request_id=e.get("request_id", ""),
                         parent=(f.name, e["parent_id"]) if e.get("parent_id") is not None else None)
            for stamp in e.get("timestamps", ()):
                t["ns"][stamp["name"]] = stamp["ns"]
    return traces


def _protocol_stamps(ns: dict) -> tuple[str, str, str]:
    for proto in ("HTTP", "GRPC"):
        if f"{proto}_RECV_START" in ns:
            return f"{proto}_RECV_START", f"{proto}_RECV_END", f"{proto}_SEND_END"
    raise TraceError(f"a top-level trace without HTTP or GRPC stamps: {sorted(ns)}")


def _compute(model: str, ns: dict, end: str) -> list[tuple[str, str, int]]:
    return [("queue", model, ns["REQUEST_START"]), ("compute input", model, ns["COMPUTE_START"]),
            ("compute infer", model, ns["COMPUTE_INPUT_END"]), ("compute output", model, ns["COMPUTE_OUTPUT_START"]),
            (end, "", ns["COMPUTE_END"])]


def timeline(trace: dict, children: list[dict], sent_ns: int, received_ns: int) -> list[tuple[str, str, float]]:
    """The request's stages as (stage, model, ms) in order; they add up to received - sent.
    Each entry of the chain starts a stage that runs until the next entry's instant."""
    ns = trace["ns"]
    recv_start, recv_end, send_end = _protocol_stamps(ns)
    done = ns.get("INFER_RESPONSE_COMPLETE") or ns.get("COMPUTE_END") or ns["REQUEST_END"]
    chain = [("client to server", "", sent_ns), ("receive", "", ns[recv_start]), ("parse", "", ns[recv_end])]
    if children:   # an ensemble: its scheduler between the steps
        chain.append(("handoff", "", ns["REQUEST_START"]))
        for child in sorted(children, key=lambda c: c["ns"]["REQUEST_START"]):
            chain += _compute(child["model"], child["ns"], "handoff")
    else:
        chain += _compute(trace["model"], ns, "send")[:-1]
    chain += [("send", "", done), ("server to client", "", ns[send_end]), ("", "", received_ns)]
    # A step hands its outputs on when they are ready; its COMPUTE_END (cleanup) can come after the
    # next step has started: that step's handoff is then empty, its compute ends at the next start.
    for i in range(len(chain) - 2, 0, -1):
        if chain[i][0] == "handoff" and chain[i][2] > chain[i + 1][2]:
            chain[i] = (*chain[i][:2], chain[i + 1][2])
    return [(stage, model, (chain[i + 1][2] - t) / 1e6) for i, (stage, model, t) in enumerate(chain[:-1])]


def timelines(traces: dict, sent: dict[str, tuple[int, int]]) -> dict[str, list[tuple[str, str, float]]]:
    """Each client request's timeline, by request id: ``sent`` maps the id the client put in
    the request to its (send, receive) monotonic ns. Ids Triton did not trace are left out."""
    kids: dict = defaultdict(list)
    for t in traces.values():
        if t.get("parent") is not None:
            kids[t["parent"]].append(t)
    out = {}
    for key, t in traces.items():
        rid = t.get("request_id")
        if t.get("parent") is None and rid in sent:
            out[rid] = timeline(t, kids.get(key, []), *sent[rid])
    return out
