"""servelab.triton.stats without a server: addresses, picking a model's entry
from a /stats answer, and a snapshot served by a tiny local HTTP server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servelab import triton
from servelab.triton import stats

DOC = {"model_stats": [
    {"name": "m", "version": "1", "inference_count": 10, "execution_count": 5},
    {"name": "m", "version": "2", "inference_count": 7, "execution_count": 7},
    {"name": "other", "version": "1", "inference_count": 1, "execution_count": 1},
]}


def test_base_url_accepts_both_address_forms():
    assert stats.base_url("127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert stats.base_url("http://127.0.0.1:8000/v2/models") == "http://127.0.0.1:8000"
    assert stats.stats_path("m") == "/v2/models/m/stats"
    assert stats.stats_path("m", 2) == "/v2/models/m/versions/2/stats"


def test_pick_by_name_and_version():
    assert stats.pick(DOC, "m")["version"] == "1"
    assert stats.pick(DOC, "m", 2)["inference_count"] == 7
    with pytest.raises(LookupError, match="no statistics for model 'absent'"):
        stats.pick(DOC, "absent")


@pytest.mark.integration   # a real Triton
def test_snapshot_reads_the_models_entry_over_http():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's method name
            seen.append(self.path)
            body = json.dumps(DOC).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        snap = triton.snapshot(f"127.0.0.1:{server.server_port}", "other")
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["/v2/models/other/stats"]
    assert snap["name"] == "other"
    d = triton.stats_delta({}, snap)
    assert (d["inferences"], d["executions"], d["avg_batch_size"]) == (1, 1, 1.0)


def _snap(success: int, executions: int, hits: int = 0) -> dict:
    return {"execution_count": executions, "inference_stats": {"success": {"count": success},
                                                               "cache_hit": {"count": hits}}}


def test_settled_waits_for_the_counts_to_stop_and_cover_what_was_sent(monkeypatch):
    # the response left before Triton counted it: success 15 while 16 were served, then the
    # execution counted after the success
    reads = iter([_snap(15, 15), _snap(16, 15), _snap(16, 16), _snap(16, 16), _snap(99, 99)])
    monkeypatch.setattr(stats, "snapshot", lambda url, model, version=None: next(reads))
    assert stats.settled("h:1", "m", at_least=16) == _snap(16, 16)
    # counts that stand still short of at_least: the last read when the time is up, not a hang
    monkeypatch.setattr(stats, "snapshot", lambda url, model, version=None: _snap(3, 3))
    assert stats.settled("h:1", "m", at_least=16, limit_s=0.2) == _snap(3, 3)
    # a cache hit counted late moves the counts too
    reads = iter([_snap(4, 3, 0), _snap(4, 3, 1), _snap(4, 3, 1)])
    monkeypatch.setattr(stats, "snapshot", lambda url, model, version=None: next(reads))
    assert stats.settled("h:1", "m", at_least=4) == _snap(4, 3, 1)


def test_wait_for_log_waits_for_a_line_written_late_and_says_what_it_saw(tmp_path):
    from types import SimpleNamespace

    from servelab.triton.server import TritonServer

    log = tmp_path / "triton.log"
    log.write_text("I loaded\n")
    server = SimpleNamespace(log_path=log)
    late = threading.Timer(0.3, lambda: log.write_text("I loaded\nI served a batch of 2 image(s)\n"))
    late.start()
    assert "served a batch of 2" in TritonServer.wait_for_log(server, r"served a batch of \d", timeout=5)
    late.join()
    with pytest.raises(TimeoutError, match="I served a batch"):   # twice: never; the error shows the log's end
        TritonServer.wait_for_log(server, "served a batch", count=2, timeout=0.3)
