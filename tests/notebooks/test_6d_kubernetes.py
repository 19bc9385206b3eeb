"""Notebook 6d (the lab on k3s) against the strict host-shell fake: every command line of its node blocks,
in order, is one the fake knows, and each succeeds only after what it needs (k3s before kubectl, the
device plugin before a GPU pod schedules, the Secret and the images before Triton rolls out). The pinned
k3s and the notebook's names are the kit's (servelab.deploy.k8s, servelab.node.kube)."""

from __future__ import annotations

import shutil

import pytest

from servelab.core import scaling
from servelab.deploy import k8s
from servelab.node import kube

from .nbkit import REPO_ROOT
from .test_chameleon_notebooks import fake
from .test_host_shell import node_blocks

NAME = "6d_kubernetes"


def lines() -> list[str]:
    out = []
    for block in node_blocks(NAME):
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def _node(tmp_path, **flags):
    cloud = fake.Cloud(tmp_path / "cloud.json")
    st = cloud.load()
    kit = cloud.node_home / "serve-system-chi"
    shutil.copytree(REPO_ROOT / "k8s", kit / "k8s")
    (kit / "docker").mkdir(parents=True)
    (kit / "docker" / ".env").write_text("JUPYTER_TOKEN=t0\nTRITON_ADMIN_KEY=k0\n")  # what notebook 2's write-env makes
    st["node"].update(flags)
    return fake.FakeNode(st, cloud.node_home, REPO_ROOT), st


AFTER_NOTEBOOK_2 = {"docker": True, "toolkit": True, "jq": True, "nvidia_runtime": True, "cgroupfs": True}


def test_notebook_6d_runs_on_the_fake_node_and_tears_down(tmp_path):
    node, st = _node(tmp_path, **AFTER_NOTEBOOK_2)
    ran = []
    for line in lines():
        out, err, code = node.run(line)
        assert code == 0, f"{line}\n{err}"
        ran.append((line, out))
    outputs = dict(ran)
    assert any("k3s-uninstall" in line for line, _ in ran[-3:])
    assert outputs["kubectl get nodes -o jsonpath='{.items[0].status.allocatable.nvidia\\.com/gpu}'"] == "2"
    assert "successfully rolled out" in outputs["kubectl -n servelab rollout status deployment/triton-server --timeout=10m"]
    for flag in ("k3s", "k8s_applied", "secret", "k8s_cluster", "adapter_tls"):  # nothing left behind
        assert not st["node"].get(flag), flag
    assert not (node.home / ".kube" / "config").exists()  # the admin credentials' copy
    assert "KUBECONFIG" not in (node.home / ".bashrc").read_text()


def test_the_fake_refuses_steps_out_of_order_and_unknown_commands(tmp_path):
    node, _ = _node(tmp_path, docker=True)  # notebook 2 not run: no container toolkit, so k3s finds no GPU runtime
    assert node.run("kubectl get nodes")[2] == 127                      # before k3s
    assert node.run("kubectl get pods -A")[2] == 127                    # not a command of the lab
    assert node.run("curl -sfL https://get.k3s.io | INSTALL_K3S_VERSION=v1.30.0+k3s1 K3S_KUBECONFIG_MODE=644 "
                    "sh -s - --disable traefik")[2] == 1                 # not the pinned release
    for line in lines():
        if "rollout status deployment/triton-server" in line:
            out, err, code = node.run(line)
            assert code == 1 and "Insufficient nvidia.com/gpu" in err  # no GPU runtime: the pod stays Pending
            break
        node.run(line)
    node2, _ = _node(tmp_path / "b", **AFTER_NOTEBOOK_2)
    for line in lines():
        if "create secret" in line:
            continue  # the Secret forgotten
        out, err, code = node2.run(line)
        if "rollout status deployment/triton-server" in line:
            assert code == 1 and "servelab-secrets" in err
            break


def test_the_notebook_uses_the_kits_pins_and_names():
    text = "\n".join(lines())
    assert f"INSTALL_K3S_VERSION={k8s.K3S_VERSION} " in text and fake.K3S_VERSION == k8s.K3S_VERSION
    assert k8s.KUBERNETES_VERSION.rsplit(".", 1)[0] == k8s.K3S_VERSION.lstrip("v").rsplit(".", 1)[0]
    assert f"secret generic {k8s.SECRET_NAME} " in text and "--from-literal" not in text
    assert f"deployment/{kube.TRITON}" in text and f"hpa {kube.TRITON} -w" in text
    assert f"/{scaling.METRIC}" in text
    assert "python3 -m servelab.node.kube target" in text and "python3 -m servelab.node.kube watch" in text


def test_the_node_module_reads_s1_from_tritons_statistics():
    stats = {"model_stats": [{"inference_stats": {
        "compute_input": {"count": 10, "ns": 2_000_000}, "compute_infer": {"count": 10, "ns": 36_000_000},
        "compute_output": {"count": 10, "ns": 2_000_000}}}]}
    assert kube.service_time_us(stats) == pytest.approx(4000.0)
    stats["model_stats"][0]["inference_stats"]["compute_infer"]["count"] = 0
    with pytest.raises(ValueError, match="warm-up"):
        kube.service_time_us(stats)


def _handshake(files: dict, server_hostname: str) -> str:
    """A TLS server with the adapter's certificate on a loopback port, and a client that trusts only ca.crt
    and checks the name, as the API server does for an APIService (kube-aggregator: caBundle, ServerName)."""
    import socket
    import ssl
    import threading

    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files["tls.crt"], files["tls.key"])
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        try:
            server.wrap_socket(conn, server_side=True).close()
        except (ssl.SSLError, OSError):
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client = ssl.create_default_context(cafile=files["ca.crt"])
    try:
        with socket.create_connection(listener.getsockname(), timeout=10) as raw, \
                client.wrap_socket(raw, server_hostname=server_hostname) as tls:
            return tls.version()
    finally:
        t.join(10)
        listener.close()


@pytest.mark.integration   # a real server on loopback
def test_the_adapters_certificate_is_trusted_through_its_ca_for_its_service_name_only(tmp_path):
    import ssl

    files = kube.adapter_tls(str(tmp_path))
    assert kube.ADAPTER_HOST == "prometheus-adapter.servelab.svc"
    assert _handshake(files, kube.ADAPTER_HOST).startswith("TLS")
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _handshake(files, "prometheus.servelab.svc")
    assert not (tmp_path / "ca.key").exists()  # nothing else can be signed by this CA


def test_kube_tls_puts_the_certificate_in_the_secret_and_its_ca_in_the_apiservice(monkeypatch, capsys):
    import base64
    import json

    calls = []

    def fake_kubectl(*args):
        if args[:3] == ("create", "secret", "tls"):
            cert = next(a for a in args if a.startswith("--cert=")).split("=", 1)[1]
            calls.append(("cert", open(cert).read()))
        calls.append(args)
        return ""

    monkeypatch.setattr(kube, "kubectl", fake_kubectl)
    assert kube.main(["tls"]) == 0
    verbs = [c[:2] for c in calls if c[0] != "cert"]
    assert verbs == [("delete", "secret"), ("create", "secret"), ("patch", "apiservice"), ("rollout", "restart")]
    patch = next(c for c in calls if c[:2] == ("patch", "apiservice"))
    assert patch[2] == kube.APISERVICE
    ca = base64.b64decode(json.loads(patch[-1])["spec"]["caBundle"]).decode()
    cert = next(c[1] for c in calls if c[0] == "cert")
    assert ca.startswith("-----BEGIN CERTIFICATE-----") and ca != cert  # the CA, not the adapter's own certificate
    assert "insecureSkipTLSVerify" not in patch[-1]


def _run_until(node, stop: str, skip: tuple[str, ...] = ()) -> tuple[str, str, int]:
    """Run the notebook's lines on the fake node, leaving out those containing one of ``skip``; return the
    result of the first line containing ``stop``."""
    for line in lines():
        if any(s in line for s in skip):
            continue
        out, err, code = node.run(line)
        if stop in line:
            return out, err, code
        assert code == 0, f"{line}\n{err}"
    raise AssertionError(f"no line with {stop!r}")


def test_the_admin_kubeconfig_stays_readable_by_root_and_the_user_alone(tmp_path):
    text = "\n".join(lines())
    assert "K3S_KUBECONFIG_MODE=600 " in text and "K3S_KUBECONFIG_MODE=644" not in text
    node, st = _node(tmp_path, **AFTER_NOTEBOOK_2)
    out, err, code = _run_until(node, "kubectl get nodes")
    assert code == 0 and "Ready" in out
    assert st["node"]["kubeconfig_mode"] == "600"
    assert (node.home / ".kube" / "config").stat().st_mode & 0o777 == 0o600  # the user's copy: no one else reads it
    assert "export KUBECONFIG=$HOME/.kube/config" in (node.home / ".bashrc").read_text().splitlines()  # new terminals


def test_without_its_own_copy_the_user_cannot_reach_the_cluster(tmp_path):
    node, _ = _node(tmp_path / "a", **AFTER_NOTEBOOK_2)
    out, err, code = _run_until(node, "kubectl get nodes", skip=("sudo install -m 600",))
    assert code == 1 and "k3s.yaml: permission denied" in err
    node, _ = _node(tmp_path / "b", **AFTER_NOTEBOOK_2)  # the copy made, but kubectl not told where it is
    out, err, code = _run_until(node, "kubectl get nodes", skip=("export KUBECONFIG=$HOME/.kube/config",))
    assert code == 1 and "permission denied" in err


def test_without_the_adapters_ca_the_autoscaler_gets_no_metric(tmp_path):
    node, _ = _node(tmp_path, **AFTER_NOTEBOOK_2)
    out, err, code = _run_until(node, "rollout status deployment/prometheus-adapter", skip=("servelab.node.kube tls",))
    assert code == 1 and "prometheus-adapter-tls" in err  # the adapter waits for its certificate
    out, err, code = node.run(next(line for line in lines() if "kubectl get --raw" in line))
    assert code == 1 and "ServiceUnavailable" in err       # and the API server never uses it unverified
