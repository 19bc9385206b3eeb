"""Notebook 6d on the node: the autoscaler's target from the node's own Triton, and the decisions
the lesson computes beside `kubectl get hpa -w`.

    python3 -m servelab.node.kube target           # S(1) from Triton's statistics -> the HPA's target (patched)
    python3 -m servelab.node.kube watch --minutes 8  # every 15 s: metric, replicas, servelab.core.scaling's decision
    python3 -m servelab.node.kube tls              # prometheus-adapter's serving certificate, and its CA in the APIService

Standard library only (the node's own ``python3``); it reads the cluster with the node's ``kubectl``
(k3s installs it) and the metric from the in-cluster Prometheus, by Service address.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from servelab.core import scaling

NAMESPACE = "servelab"
TRITON = "triton-server"          # k8s/triton/: Deployment, Service and HPA share the name
PROMETHEUS = "prometheus"
MODEL = "food_classifier_onnx"
SYNC_S = 15                       # the HPA controller's default sync period (--horizontal-pod-autoscaler-sync-period)
# prometheus-adapter's serving certificate (k8s/monitoring/adapter.yaml mounts the Secret) and the APIService
# whose caBundle lets the API server verify it. The API server checks the name <service>.<namespace>.svc
# (kube-aggregator, pkg/apiserver/handler_proxy.go: ServerName = Service.Name + "." + Service.Namespace + ".svc").
ADAPTER = "prometheus-adapter"
ADAPTER_TLS_SECRET = "prometheus-adapter-tls"
ADAPTER_HOST = f"{ADAPTER}.{NAMESPACE}.svc"
APISERVICE = "v1beta1.custom.metrics.k8s.io"
TLS_DAYS = 30                     # longer than any lease; the CA's key is deleted once the certificate is signed


def kubectl(*args: str) -> str:
    out = subprocess.run(["kubectl", "-n", NAMESPACE, *args], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


def service_ip(name: str) -> str:
    return kubectl("get", "svc", name, "-o", "jsonpath={.spec.clusterIP}")


def service_time_us(stats: dict) -> float:
    """S(1): Triton's compute time per request (input + infer + output), from /v2/models/<m>/stats."""
    inf = stats["model_stats"][0]["inference_stats"]
    count = inf["compute_infer"]["count"]
    if not count:
        raise ValueError("no request served yet: send a few first (the notebook's warm-up)")
    ns = sum(inf[k]["ns"] for k in ("compute_input", "compute_infer", "compute_output"))
    return ns / count / 1000.0


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def _cmd_target(args) -> int:
    stats = _get_json(f"http://{service_ip(TRITON)}:8000/v2/models/{args.model}/stats")
    s1 = service_time_us(stats)
    target = round(scaling.queue_target_us(s1))
    print(f"S(1) = {s1:.0f} us ({args.model}, Triton's compute time per request); "
          f"held utilization {scaling.held_utilization():.3f} for p99 <= {scaling.BUDGET_FACTOR:g} x S(1); "
          f"target {target} us of queue per request")
    patch = {"spec": {"metrics": [{"type": "Object", "object": {
        "describedObject": {"apiVersion": "v1", "kind": "Service", "name": TRITON},
        "metric": {"name": scaling.METRIC}, "target": {"type": "Value", "value": str(target)}}}]}}
    kubectl("patch", "hpa", TRITON, "--type=merge", "-p", json.dumps(patch))
    print(f"hpa/{TRITON} patched")
    return 0


def _cmd_watch(args) -> int:
    prom = f"http://{service_ip(PROMETHEUS)}:9090/api/v1/query?" + urllib.parse.urlencode({"query": scaling.METRIC})
    target = float(kubectl("get", "hpa", TRITON, "-o", "jsonpath={.spec.metrics[0].object.target.value}"))
    print(f"{'time':8} {scaling.METRIC:>30} {'target':>7} {'replicas':>8} {'computed':>8}")
    end = time.time() + args.minutes * 60
    while time.time() < end:
        result = _get_json(prom)["data"]["result"]
        current = int(kubectl("get", "deploy", TRITON, "-o", "jsonpath={.spec.replicas}") or 1)
        value = float(result[0]["value"][1]) if result else float("nan")
        want = scaling.desired_replicas(current, value, target) if value == value else current  # NaN: idle
        print(f"{time.strftime('%H:%M:%S')} {value:30.0f} {target:7.0f} {current:8d} {want:8d}", flush=True)
        time.sleep(SYNC_S)
    return 0


_OPENSSL_CNF = f"""[req]
distinguished_name = dn
prompt = no
[dn]
CN = servelab-adapter-ca
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:{ADAPTER_HOST}
"""


def _openssl(*args: str, cwd: str) -> None:
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"openssl {args[0]}: {out.stderr.strip()}")


def adapter_tls(folder: str) -> dict:
    """A one-off CA and the adapter's serving certificate (for ADAPTER_HOST), signed by it, in ``folder``.
    Returns the paths of ca.crt, tls.crt and tls.key; ca.key is removed once it has signed: nothing
    else can be signed by this CA afterwards."""
    with open(f"{folder}/openssl.cnf", "w") as f:
        f.write(_OPENSSL_CNF)
    days = str(TLS_DAYS)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", days, "-config", "openssl.cnf",
             "-extensions", "ca", "-keyout", "ca.key", "-out", "ca.crt", cwd=folder)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-sha256", "-config", "openssl.cnf",
             "-subj", f"/CN={ADAPTER_HOST}", "-keyout", "tls.key", "-out", "tls.csr", cwd=folder)
    _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-sha256",
             "-days", days, "-extfile", "openssl.cnf", "-extensions", "server", "-out", "tls.crt", cwd=folder)
    os.remove(f"{folder}/ca.key")
    return {name: f"{folder}/{name}" for name in ("ca.crt", "tls.crt", "tls.key")}


def _cmd_tls(args) -> int:
    """The adapter's certificate into its Secret, and the CA that signed it into the APIService's caBundle,
    so the API server verifies the adapter instead of skipping verification. Run after the manifests are
    applied (the APIService must exist); the adapter's pod waits for the Secret."""
    with tempfile.TemporaryDirectory(prefix="servelab-adapter-tls-") as folder:  # mode 700
        files = adapter_tls(folder)
        kubectl("delete", "secret", ADAPTER_TLS_SECRET, "--ignore-not-found")
        kubectl("create", "secret", "tls", ADAPTER_TLS_SECRET, f"--cert={files['tls.crt']}", f"--key={files['tls.key']}")
        with open(files["ca.crt"], "rb") as f:
            ca = base64.b64encode(f.read()).decode()
    kubectl("patch", "apiservice", APISERVICE, "--type=merge", "-p", json.dumps({"spec": {"caBundle": ca}}))
    kubectl("rollout", "restart", f"deployment/{ADAPTER}")  # a running adapter serves its new certificate
    print(f"secret/{ADAPTER_TLS_SECRET}: a certificate for {ADAPTER_HOST}; apiservice/{APISERVICE}: caBundle set "
          f"(the API server now verifies the adapter)")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("kube", help="notebook 6d on the node: the HPA's target and the computed decisions")
    ksub = p.add_subparsers(dest="kube_command", metavar="ACTION")
    ksub.required = True
    t = ksub.add_parser("target", help="S(1) from Triton's statistics -> servelab.core.scaling.queue_target_us -> HPA")
    t.add_argument("--model", default=MODEL)
    t.set_defaults(func=_cmd_target)
    w = ksub.add_parser("watch", help="every 15 s: the metric, the replicas, and desired_replicas beside them")
    w.add_argument("--minutes", type=float, default=8.0)
    w.set_defaults(func=_cmd_watch)
    s = ksub.add_parser("tls", help="prometheus-adapter's serving certificate (Secret) and its CA (APIService caBundle)")
    s.set_defaults(func=_cmd_tls)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m servelab.node")
    add_parser(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["kube", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
