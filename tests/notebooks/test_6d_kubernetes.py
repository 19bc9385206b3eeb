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
    assert any("k3s-uninstall" in line for line, _ in ran[-1:])
    assert outputs["kubectl get nodes -o jsonpath='{.items[0].status.allocatable.nvidia\\.com/gpu}'"] == "2"
    assert "successfully rolled out" in outputs["kubectl -n servelab rollout status deployment/triton-server --timeout=10m"]
    for flag in ("k3s", "k8s_applied", "secret", "k8s_cluster"):  # nothing left behind
        assert not st["node"].get(flag), flag


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
