"""servelab.triton.trace and servelab.bench.breakdown without a server: Triton's trace files
as 2.51 writes them (an entry per stamp, numbered files), the timeline's chain and the sum check. tests/triton/test_trace.py runs them against tritonserver."""

from __future__ import annotations

import json

import pytest

from servelab.bench import breakdown
from servelab.triton import trace

MS = 1_000_000


def _entries(tid: int, model: str, stamps: dict, request_id: str = "", parent: int | None = None) -> list[dict]:
    head = {"id": tid, "model_name": model, "model_version": 1}
    head.update({"request_id": request_id} if parent is None else {"parent_id": parent})
    return [head] + [{"id": tid, "timestamps": [{"name": k, "ns": v}]} for k, v in stamps.items()]


SINGLE = {"HTTP_RECV_START": 1 * MS, "HTTP_RECV_END": 2 * MS, "REQUEST_START": 4 * MS, "QUEUE_START": 4 * MS,
          "COMPUTE_START": 7 * MS, "COMPUTE_INPUT_END": 8 * MS, "COMPUTE_OUTPUT_START": 18 * MS,
          "INFER_RESPONSE_COMPLETE": 19 * MS, "COMPUTE_END": 21 * MS, "HTTP_SEND_START": 20 * MS,
          "HTTP_SEND_END": 20 * MS + MS // 2}


def test_the_numbered_files_are_read_and_a_child_keeps_its_own_files_parent(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text("[]")   # the configured file itself: not read (Triton writes numbered ones)
    (tmp_path / "trace.json.0").write_text(json.dumps(_entries(1, "m", SINGLE, "r-1")))
    # a later flush: trace ids are per server, so the same id in another file is another trace
    (tmp_path / "trace.json.1").write_text(json.dumps(_entries(1, "ens", SINGLE, "r-2")
                                                      + _entries(2, "step", SINGLE, parent=1)))
    traces = trace.read(path)
    assert traces[("trace.json.0", 1)]["request_id"] == "r-1"
    assert traces[("trace.json.0", 1)]["ns"]["COMPUTE_INPUT_END"] == 8 * MS
    assert traces[("trace.json.1", 2)]["parent"] == ("trace.json.1", 1)
    lines = trace.timelines(traces, {"r-1": (0, 21 * MS), "r-2": (0, 21 * MS)})
    assert {m for s, m, _ms in lines["r-2"] if s == "queue"} == {"step"}
    assert {m for s, m, _ms in lines["r-1"] if s == "queue"} == {"m"}
    (tmp_path / "trace.json.2").write_text(json.dumps(_entries(1, "m", SINGLE, "r-3"))[:-30])   # being written
    with pytest.raises(ValueError):
        trace.read(path)


def test_a_new_server_starts_with_no_old_trace_files(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "trace.json.0").write_text("[]")
    args = trace.server_args(tmp_path)
    assert args == [f"--trace-config=triton,file={tmp_path / 'traces' / 'trace.json'}", "--trace-config=level=OFF"]
    assert list((tmp_path / "traces").iterdir()) == []


def test_a_single_models_stages_add_up_to_the_clients_time():
    traces = {("f", 1): {"model": "m", "request_id": "r-1", "parent": None, "ns": SINGLE}}
    line = trace.timelines(traces, {"r-1": (0, 21 * MS), "r-2": (0, 5 * MS)})["r-1"]   # r-2 was not traced
    assert [(s, ms) for s, _m, ms in line] == [
        ("client to server", 1.0), ("receive", 1.0), ("parse", 2.0), ("queue", 3.0), ("compute input", 1.0),
        ("compute infer", 10.0), ("compute output", 1.0), ("send", 1.5), ("server to client", 0.5)]
    assert sum(ms for *_x, ms in line) == 21.0


def test_an_ensemble_has_a_queue_and_compute_per_step_and_no_negative_handoff():
    top = {"HTTP_RECV_START": 1 * MS, "HTTP_RECV_END": 2 * MS, "REQUEST_START": 3 * MS,
           "INFER_RESPONSE_COMPLETE": 30 * MS, "HTTP_SEND_END": 31 * MS}
    a = {"REQUEST_START": 4 * MS, "COMPUTE_START": 5 * MS, "COMPUTE_INPUT_END": 6 * MS,
         "COMPUTE_OUTPUT_START": 10 * MS, "COMPUTE_END": 13 * MS}        # ends after b started
    b = {"REQUEST_START": 12 * MS, "COMPUTE_START": 14 * MS, "COMPUTE_INPUT_END": 15 * MS,
         "COMPUTE_OUTPUT_START": 25 * MS, "COMPUTE_END": 27 * MS}
    traces = {("f", 1): {"model": "ens", "request_id": "r", "parent": None, "ns": top},
              ("f", 3): {"model": "b", "parent": ("f", 1), "ns": b}, ("f", 2): {"model": "a", "parent": ("f", 1), "ns": a}}
    line = trace.timelines(traces, {"r": (0, 32 * MS)})["r"]
    assert [(s, m) for s, m, _ms in line if s == "queue"] == [("queue", "a"), ("queue", "b")]
    assert all(ms >= 0 for *_x, ms in line), line
    assert dict(((s, m), ms) for s, m, ms in line)[("compute output", "a")] == 2.0   # to b's start
    assert sum(ms for *_x, ms in line) == 32.0
    s = breakdown.summary({"model": "ens", "concurrency": 1, "timelines": [line], "client_ms": [32.0]})
    assert s["steps_p50"] == {"a": {"queue": 1.0, "compute": 7.0}, "b": {"queue": 2.0, "compute": 13.0}}
    assert s["sum_ok"] and s["stages"]["handoff"]["p50"] == 1.0 + 3.0   # 3->4 and 27->30


def test_the_sum_check_names_the_skewed_stage_and_a_foreign_clock():
    lines = [[("queue", "m", q), ("compute infer", "m", 10.0)] for q in (0.0, 0.0, 30.0, 30.0, 30.0)]
    s = breakdown.summary({"model": "m", "concurrency": 8, "timelines": lines, "client_ms": [10, 10, 40, 40, 40]})
    assert s["sum_ok"]
    lines = [[("queue", "m", q), ("compute infer", "m", c)] for q, c in ((0, 30), (0, 30), (30, 0), (30, 0), (1, 1))]
    s = breakdown.summary({"model": "m", "concurrency": 8, "timelines": lines, "client_ms": [30, 30, 30, 30, 2]})
    assert not s["sum_ok"] and "skew" in s["missing"]
    lines = [[("client to server", "", -3.0), ("compute infer", "m", 13.0)]]
    s = breakdown.summary({"model": "m", "concurrency": 1, "timelines": lines, "client_ms": [10.0]})
    assert s["negative"] == 1 and "do not share a clock" in s["missing"]
    s = breakdown.summary({"model": "m", "concurrency": 1, "timelines": [], "client_ms": []})
    assert s["verdict"].startswith("inconclusive")


def test_with_id_keeps_the_binary_tensors_and_fixes_the_header_length():
    head = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 4}}]}).encode()
    body, headers = breakdown.with_id(head + b"\x00\x00\x80?", {"Inference-Header-Content-Length": str(len(head)),
                                                               "Content-Type": "application/octet-stream"}, "r-7")
    n = int(headers["Inference-Header-Content-Length"])
    assert json.loads(body[:n])["id"] == "r-7" and body[n:] == b"\x00\x00\x80?"
    body, headers = breakdown.with_id(b'{"inputs":[]}', {"Content-Type": "application/json"}, "r-8")
    assert json.loads(body) == {"inputs": [], "id": "r-8"} and "Inference-Header-Content-Length" not in headers


def test_a_fastapi_answers_stages_add_up_and_a_missing_stage_is_named():
    line = breakdown.fastapi_timeline("decode;dur=3.000, wait;dur=1.000, infer;dur=10.000, app;dur=15.500", 17.0)
    assert line == [("network", "", 1.5), ("parse + encode", "", 1.5), ("decode", "", 3.0), ("wait", "", 1.0),
                    ("infer", "", 10.0)]
    with pytest.raises(ValueError, match="infer"):
        breakdown.fastapi_timeline("decode;dur=3.000, app;dur=5.0", 6.0)
    s = breakdown.summary({"model": "FastAPI x", "concurrency": 1, "timelines": [line], "client_ms": [17.0],
                           "stage_names": breakdown.FASTAPI_STAGES})
    assert s["sum_ok"] and list(s["stages"]) == list(breakdown.FASTAPI_STAGES)
    assert "parse+enc" in breakdown.table([s]) and "network" in breakdown.table([s])
