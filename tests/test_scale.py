"""The scale-out lab (servelab.local.scale): configs validated by the real haproxy and promtool,
real Triton replicas behind the real HAProxy, the metric read from the real Prometheus and
checked against Triton's own statistics, and a replica killed under load."""

from __future__ import annotations

import http.client
import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from servelab.bench import targets
from servelab.core import procs, scaling
from servelab.local import scale
from servelab.triton.state import state_path


@pytest.fixture(autouse=True, scope="module")
def binaries():
    """The real HAProxy and Prometheus, never a skip: `make test` installs them (`make sysdeps`)."""
    missing = [b for b in (scale.HAPROXY, scale.PROMTOOL, scale.PROMETHEUS) if not Path(b).exists()]
    assert not missing, f"missing {missing}: `make sysdeps` installs Debian's haproxy and prometheus"


# --------------------------------------------------------------------------
# Configs: generated, and judged by the real binaries (whose exit codes mean something)
# --------------------------------------------------------------------------

def test_generated_configs_validate_and_broken_ones_do_not(tmp_path):
    hap = tmp_path / "haproxy.cfg"
    hap.write_text(scale.haproxy_config([("r0", "127.0.0.1:9000"), ("r1", "127.0.0.1:9001")],
                                        {"roundrobin": "127.0.0.1:9100", "leastconn": "127.0.0.1:9101"},
                                        stats="127.0.0.1:9102"))
    ok = scale.check_haproxy(hap)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    text = hap.read_text()
    assert "balance roundrobin" in text and "balance leastconn" in text
    assert "option httpchk GET /v2/health/ready" in text and "option redispatch" in text
    hap.write_text(text.replace("balance leastconn", "balance leastconnn"))
    assert scale.check_haproxy(hap).returncode != 0

    prom = tmp_path / "prometheus.yml"
    prom.write_text(scale.prometheus_config({"triton_replicas": [("r0", "127.0.0.1:9002")]}, "1s"))
    ok = scale.check_prometheus(prom)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    prom.write_text(prom.read_text().replace("scrape_interval: 1s", "scrape_interval: soon"))
    assert scale.check_prometheus(prom).returncode != 0


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="policy"):
        scale.haproxy_config([("r0", "127.0.0.1:1")], {"random-ish": "127.0.0.1:2"})


def test_core_shares_split_the_cores_equally():
    assert scale.core_shares(2, [0, 1]) == [[0], [1]]
    assert scale.core_shares(2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert scale.core_shares(3, [0, 1]) == [[0], [1], [0]]
    with pytest.raises(ValueError):
        scale.core_shares(0, [0])


def test_committed_node_configs_are_the_generated_ones_and_validate(tmp_path):
    for name, text in scale.node_configs().items():
        committed = scale.NODE_CONFIG_DIR / name
        assert committed.read_text() == text, f"docker/scale/{name} is stale: `python -m servelab scale configs`"
    # Compose's service names do not resolve here: haproxy -c resolves server addresses, so check a
    # copy with the names mapped to loopback (the structure is what is checked).
    text = (scale.NODE_CONFIG_DIR / "haproxy.cfg").read_text()
    for i in range(scale.NODE_REPLICAS):
        text = text.replace(f" triton_{i}:", " 127.0.0.1:")
    (tmp_path / "haproxy.cfg").write_text(text)
    res = scale.check_haproxy(tmp_path / "haproxy.cfg")
    assert res.returncode == 0, res.stdout + res.stderr
    res = scale.check_prometheus(scale.NODE_CONFIG_DIR / "prometheus.yml")
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.integration   # a real server on loopback
def test_haproxy_cuts_off_a_client_that_sends_its_headers_slowly(tmp_path):
    """The real HAProxy with the generated config: a client that sends one header line a second
    and never ends its headers. `timeout client` counts only silence, so without `timeout
    http-request` such a client kept its connection (one of maxconn) for good; now HAProxy answers
    408 and closes it after TIMEOUT_HTTP_REQUEST_S (10 s). Nothing is timed: the client sends lines
    for up to 40 s and the test asks whether HAProxy cut it off before it gave up."""
    import select
    import socket
    import subprocess

    front = procs.free_port()
    cfg = tmp_path / "haproxy.cfg"   # a replica that nothing serves: the request never gets that far
    cfg.write_text(scale.haproxy_config([("r0", f"127.0.0.1:{procs.free_port()}")],
                                        {"roundrobin": f"127.0.0.1:{front}"}))
    proxy = subprocess.Popen([scale.HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:   # until HAProxy listens
            try:
                sock = socket.create_connection(("127.0.0.1", front), timeout=5)
                break
            except OSError:
                assert proxy.poll() is None and time.monotonic() < deadline, "haproxy did not start"
                time.sleep(0.1)
        with sock:
            sock.sendall(b"POST /v2/models/x/infer HTTP/1.1\r\nHost: lab\r\n")
            answer, lines = b"", 0
            while lines < 40:
                if select.select([sock], [], [], 1.0)[0]:
                    answer = sock.recv(4096)
                    break
                try:
                    sock.sendall(f"X-Slow-{lines}: one line a second\r\n".encode())
                except OSError:   # closed without an answer
                    break
                lines += 1
        assert answer.startswith(b"HTTP/1.1 408"), (lines, answer[:100])
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)


# --------------------------------------------------------------------------
# The live lab: 2 replicas, HAProxy, Prometheus (no single Triton: not needed here)
# --------------------------------------------------------------------------

def _body() -> tuple[bytes, dict[str, str]]:
    from servelab.core import food11

    t = food11.preprocess(targets.default_images()[0])
    return targets.triton_infer_body([("input", "FP32", [1, *np.shape(t)], t[None])], ("output",))


def _infer(conn: http.client.HTTPConnection, body: bytes, headers: dict) -> int:
    conn.request("POST", f"/v2/models/{scale.MODEL}/infer", body=body, headers=headers)
    resp = conn.getresponse()
    resp.read()
    return resp.status


def _shm(prefixes: list[str]) -> list[str]:
    return [p.name for p in Path("/dev/shm").iterdir() if any(p.name.startswith(x) for x in prefixes)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("scale")
    state = workdir / "state.json"
    st = scale.start(2, single=False, workdir=workdir, scrape_interval="1s", state_file=state, log=None)
    try:
        yield st
    finally:
        scale.stop(st)


def _scraped_after(prometheus: str, match: str, after: float, timeout: float = 30.0) -> dict[str, float]:
    """Wait until Prometheus holds, for every replica, a sample of the success counter scraped after
    ``after`` (Unix seconds); return each replica's newest sample time. A busy machine delays scrapes:
    the test reads the times Prometheus has, rather than sleeping and hoping."""
    deadline = time.time() + timeout
    while True:
        got = scaling.query(prometheus, f"{scaling.SUCCESS_COUNTER}{{{match}}}[60s]")
        newest = {e["metric"]["replica"]: e["values"][-1][0] for e in got if e["values"]}
        if len(newest) == 2 and min(newest.values()) > after:
            return newest
        if time.time() > deadline:
            pytest.fail(f"Prometheus scraped no replica sample after {after:.1f} within {timeout:.0f} s: {newest}")
        time.sleep(0.25)


@pytest.mark.integration   # Triton replicas, HAProxy, Prometheus
def test_prometheus_metric_equals_tritons_own_statistics(lab):
    """servelab.core.scaling.promql(), evaluated by Prometheus over a window that holds a whole burst,
    gives the same queue time per request as Triton's /stats (both replicas summed)."""
    from servelab import triton

    body, headers = _body()
    match = f'job="{scale.REPLICA_JOB}"'
    prometheus = lab.urls["prometheus"]
    time.sleep(1.0)   # the earlier tests' last requests are done: the counters are still
    before = [triton.snapshot(u, scale.MODEL) for u in lab.replica_urls]
    start = min(_scraped_after(prometheus, match, time.time()).values())   # a still sample of each replica

    def client():
        conn = http.client.HTTPConnection(*lab.urls["leastconn"].split(":"), timeout=60)
        for _ in range(6):
            assert _infer(conn, body, headers) == 200
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(4)]   # 4 clients, 2 replicas: requests queue
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = max(_scraped_after(prometheus, match, time.time()).values()) + 0.05   # each replica scraped since
    deltas = [triton.stats_delta(b, triton.snapshot(u, scale.MODEL)) for b, u in zip(before, lab.replica_urls)]
    requests = sum(d["requests"] for d in deltas)
    assert requests == 24
    queue_us = sum(d["per_request_ms"].get("queue", 0.0) * d["requests"] for d in deltas) * 1000 / requests
    window = f"{math.ceil(end - start) + 1}s"   # from a still sample before the burst to one after it
    got = scaling.query(prometheus, scaling.promql(window, match=match), at=end)
    assert len(got) == 1
    assert queue_us > 0   # 4 clients on 2 single-instance replicas: some waited
    # Each replica's figure is exactly its Triton's: delta() extrapolates a series to the window's
    # edges, but a replica's two counters are scraped together, so its factor cancels in the ratio.
    per_replica = {e["metric"]["replica"]: e["value"] for e in scaling.query(
        prometheus, scaling.promql(window, by="replica", match=match), at=end)}
    assert set(per_replica) == {"replica0", "replica1"}
    for i, d in enumerate(deltas):
        if d["requests"]:
            assert per_replica[f"replica{i}"] == pytest.approx(d["per_request_ms"].get("queue", 0.0) * 1000,
                                                               rel=0.02, abs=1), (i, per_replica, deltas)
    # The sum weighs the replicas by their extrapolated request counts, which Prometheus gives too:
    # with those weights the whole is exactly the replicas' figures combined ...
    weights = {e["metric"]["replica"]: e["value"] for e in scaling.query(
        prometheus, f"sum by (replica)(delta({scaling.SUCCESS_COUNTER}{{{match}}}[{window}]))", at=end)}
    combined = sum(per_replica[r] * w for r, w in weights.items() if w) / sum(weights.values())
    assert got[0]["value"] == pytest.approx(combined, rel=0.02), (got, per_replica, weights)
    # ... and Triton's own whole within what extrapolation can shift (the replicas' factors differ
    # by at most one 1 s scrape interval over the window; 5 % seen).
    assert got[0]["value"] == pytest.approx(queue_us, rel=0.15), (got, queue_us, deltas)
    # the same expression over time (what notebook 6c plots): zero-request windows are NaN, the
    # burst's windows positive; a query Prometheus cannot parse is a clear error
    series = scaling.query_range(lab.urls["prometheus"], scaling.promql("2s", match=f'job="{scale.REPLICA_JOB}"'),
                                 start, end, 1)
    values = [v for _, v in series[0]["values"] if v == v]
    assert values and max(values) > 0
    with pytest.raises(RuntimeError, match="parse"):
        scaling.query(lab.urls["prometheus"], "sum(delta(")


@pytest.mark.integration   # Triton replicas, HAProxy, Prometheus
def test_grpc_goes_through_haproxy_too(lab):
    """HTTP/2 end to end: tritonclient.grpc through each gRPC frontend; round-robin alternates."""
    import tritonclient.grpc as grpcclient

    from servelab import triton

    x = np.zeros((1, 3, 224, 224), np.float32)
    for policy in scale.POLICIES:
        before = [triton.snapshot(u, scale.MODEL) for u in lab.replica_urls]
        client = grpcclient.InferenceServerClient(lab.urls[f"grpc_{policy}"])
        try:
            assert client.is_model_ready(scale.MODEL)
            inp = grpcclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            for _ in range(6):
                assert client.infer(scale.MODEL, [inp]).as_numpy("output").shape == (1, 11)
        finally:
            client.close()
        deadline = time.monotonic() + 5
        while True:   # Triton counts a request just after it answers it
            counts = [triton.stats_delta(b, triton.snapshot(u, scale.MODEL))["requests"]
                      for b, u in zip(before, lab.replica_urls)]
            if sum(counts) == 6 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert sum(counts) == 6, (policy, counts)
        if policy == "roundrobin":
            assert counts == [3, 3], counts


@pytest.mark.integration   # Triton replicas, HAProxy, Prometheus
def test_a_killed_replica_is_drained_and_nothing_fails_after_the_check_trips(lab):
    """Closed loop of 4 clients through the least-connections frontend; replica1's whole process
    group (wrapper, tritonserver, stubs) is SIGKILLed mid-run. Requests that fail do so before
    HAProxy marks it DOWN; after that every request succeeds on replica0."""
    body, headers = _body()
    results: list[tuple[float, float, int]] = []   # (sent, done, status or -1)
    lock = threading.Lock()
    stop_at = time.monotonic() + 9.0

    def client():
        host, port = lab.urls["leastconn"].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            try:
                status = _infer(conn, body, headers)
            except (OSError, http.client.HTTPException):
                status = -1
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
            with lock:
                results.append((t0, time.monotonic(), status))
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    victim = lab.replica_server(1)
    prefix = json.loads(state_path(lab.replicas[1]["http"]).read_text())["shm_prefix"]
    server_pid = json.loads(state_path(lab.replicas[1]["http"]).read_text())["pid"]
    killed = time.monotonic()
    # A crash, not a shutdown: tritonserver gets no chance to finish what it holds (a SIGTERM would
    # let it drain its requests first). Then its wrapper, before it could start it again.
    os.kill(server_pid, signal.SIGKILL)
    os.killpg(victim.pid, signal.SIGKILL)
    tripped = scale.wait_backends(lab, "DOWN", ["replica1"], timeout=10)
    for t in threads:
        t.join()
    failed_before = [r for r in results if r[2] != 200 and r[0] < tripped]
    failed_after = [r for r in results if r[2] != 200 and r[0] >= tripped]
    after = [r for r in results if r[0] >= tripped]
    print(f"\nkill -> DOWN in {tripped - killed:.2f} s (check inter {scale.CHECK_INTER_MS} ms, fall {scale.FALL}); "
          f"failed before: {len(failed_before)}, after: {len(failed_after)} of {len(after)} sent after; "
          f"{len(results)} requests in all")
    assert not failed_after, failed_after
    assert len(after) >= 4   # the run went on after the check tripped
    assert tripped - killed < (scale.FALL + 2) * scale.CHECK_INTER_MS / 1000 + 2.0
    scale._cleanup_triton(lab.replicas[1]["http"])
    assert not _shm([prefix]), "the killed replica's shared memory was not reaped"


@pytest.mark.integration   # Triton replicas, HAProxy, Prometheus
def test_cli_up_then_down_stops_everything_and_leaves_no_shared_memory(tmp_path):
    """`servelab scale up --replicas 1` returns with the lab running (its processes outlive the
    command, as after `servelab up`); `servelab down` stops every one of them."""
    import subprocess
    import sys

    env = {**os.environ, "SERVELAB_SCALE_DIR": str(tmp_path), "PYTHONPATH": str(scale.paths.REPO_ROOT)}
    up = subprocess.run([sys.executable, "-m", "servelab", "scale", "up", "--replicas", "1", "--no-single",
                         "--scrape-interval", "1s"], env=env, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "SCALE_LC_URL" in up.stdout and (tmp_path / "env.sh").exists()
    data = json.loads((tmp_path / "state.json").read_text())
    run = json.loads(state_path(data["replicas"][0]["http"]).read_text())
    pids = [p["pid"] for p in data["processes"].values()] + [run["pid"]]
    assert all(procs.pid_alive(p) for p in pids) and _shm([run["shm_prefix"]])
    again = subprocess.run([sys.executable, "-m", "servelab", "scale", "up"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 1 and "already up" in again.stderr
    down = subprocess.run([sys.executable, "-m", "servelab", "down"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "replica0: stopped" in down.stdout and "prometheus: stopped" in down.stdout
    assert not (tmp_path / "state.json").exists()
    assert not any(procs.pid_alive(p) for p in pids)
    assert not _shm([run["shm_prefix"], f"servelab-cores-{os.getuid()}-{run['pid']}-"])
