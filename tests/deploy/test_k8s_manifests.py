"""k8s/: built by kubectl kustomize, strictly schema-valid for the k3s release notebook 6d installs, and
consistent with docker/ and servelab.core.scaling (one source for names, ports, images, the metric).
Each check is shown to fail on a planted defect (a literal key, a wrong port, a changed PromQL ...)."""

from __future__ import annotations

import copy

import pytest
import yaml

from servelab.core import scaling
from servelab.deploy import k8s


@pytest.fixture(scope="module")
def objects():
    return k8s.render(k8s.K8S_DIR) + k8s.render(k8s.K8S_DIR / "cluster")


def _get(objs, kind, name):
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def _triton(objs):
    return _get(objs, "Deployment", "triton-server")["spec"]["template"]["spec"]


def test_manifests_build_validate_and_agree(objects, capsys):
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler", "APIService", "DaemonSet",
            "RuntimeClass"} <= kinds
    assert k8s.validate(objects) == []
    assert k8s.problems(objects) == []
    assert k8s.check() == 0
    out = capsys.readouterr().out
    assert f"strict: {len(objects)} of {len(objects)} objects pass" in out and "consistency" in out


def test_every_object_lands_in_the_lab_namespace_except_cluster_pieces(objects):
    for o in objects:
        ns = o["metadata"].get("namespace")
        if o["kind"] in ("Namespace", "ClusterRole", "ClusterRoleBinding", "APIService", "RuntimeClass"):
            assert ns is None, o["metadata"]["name"]
        else:
            assert ns in ("servelab", "kube-system"), o["metadata"]["name"]


def test_schema_check_fails_on_an_unknown_field(objects):
    broken = copy.deepcopy(objects)
    _triton(broken)["containers"][0]["livenessProbes"] = {}  # a typo the API server would drop silently
    errors = k8s.validate(broken)
    assert len(errors) == 1 and "Deployment/triton-server" in errors[0]


def test_the_model_configs_come_from_models_staging(objects):
    cm = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("triton-model-configs"))
    for model, text in cm["data"].items():
        assert text == (k8s.paths.MODELS_STAGING / model / "config.pbtxt").read_text()
    # the Deployment refers to the generated (hashed) name
    vols = {v["name"]: v for v in _triton(objects)["volumes"]}
    assert vols["model-configs"]["configMap"]["name"] == cm["metadata"]["name"]


def _planted(objects, change):
    broken = copy.deepcopy(objects)
    change(broken)
    return k8s.problems(broken)


def _set_arg(objs, value):
    args = _triton(objs)["containers"][0]["args"]
    args[args.index("--http-restricted-api=logging:admin-key=$(TRITON_ADMIN_KEY)")] = value


def _literal_env(objs):
    env = _triton(objs)["containers"][0]["env"]
    env[0] = {"name": "TRITON_ADMIN_KEY", "value": "0123456789abcdef"}


def _port(objs, name, port):
    for p in _triton(objs)["containers"][0]["ports"]:
        if p["name"] == name:
            p["containerPort"] = port


@pytest.mark.parametrize("change, expect", [
    (lambda o: _set_arg(o, "--http-restricted-api=logging:admin-key=0123456789abcdef"), "admin key written as"),
    (_literal_env, "literal value"),
    (lambda o: o.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "servelab-secrets"},
                         "stringData": {"TRITON_ADMIN_KEY": "x"}}), "a Secret with a value"),
    (lambda o: _port(o, "http", 8080), "container ports"),
    (lambda o: _port(o, "metrics", 9000), "container ports"),
    (lambda o: _get(o, "Service", "flask")["spec"]["ports"][0].update(port=8080), "Service port 8080"),
    (lambda o: _triton(o)["containers"][0]["readinessProbe"]["httpGet"].update(path="/v2/health/live"),
     "readiness probe"),
    (lambda o: _triton(o)["containers"][0]["livenessProbe"]["httpGet"].update(port=8001), "liveness"),
    (lambda o: _triton(o)["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": 2}), "nvidia.com/gpu: 1"),
    (lambda o: _get(o, "Deployment", "flask")["spec"]["template"]["spec"]["containers"][0].update(
        resources={"limits": {"nvidia.com/gpu": 1}}), "Compose gives flask no GPU"),
    (lambda o: _triton(o)["containers"][0].update(image="nvcr.io/nvidia/tritonserver:24.11-py3"), "image"),
    (lambda o: _triton(o)["containers"][0]["args"].remove("--exit-on-error=false"), "args differ"),
    (lambda o: next(v for v in _triton(o)["volumes"] if v["name"] == "dshm")["emptyDir"].update(sizeLimit="64Mi"),
     "/dev/shm"),
    (lambda o: next(v for v in _triton(o)["volumes"] if v["name"] == "models")["hostPath"].update(path="/tmp/m"),
     "models_staging"),
    (lambda o: _get(o, "Deployment", "flask")["spec"]["template"]["spec"]["containers"][0]["env"][1].update(
        value="triton_server:8000"), "TRITON_SERVER_URL"),
    (lambda o: _get(o, "HorizontalPodAutoscaler", "triton-server")["spec"]["metrics"][0]["object"]["target"].update(
        value="5000"), "queue_target_us"),
    (lambda o: _get(o, "HorizontalPodAutoscaler", "triton-server")["spec"].update(maxReplicas=4), "one per GPU"),
    (lambda o: _get(o, "HorizontalPodAutoscaler", "triton-server")["spec"]["behavior"].pop("scaleDown"),
     "stabilization"),
])
def test_a_planted_defect_is_caught(objects, change, expect):
    found = _planted(objects, change)
    assert found and any(expect in line for line in found), found


def _edit_config(objs, name, key, edit):
    cm = _get(objs, "ConfigMap", name)
    cm["data"][key] = edit(cm["data"][key])


@pytest.mark.parametrize("name, key, old, new, expect", [
    ("prometheus-config", "prometheus.yml", "scrape_interval: 5s", "scrape_interval: 15s", "scrape_interval"),
    ("prometheus-config", "rules.yml", "[30s]", "[1m]", "promql()"),
    ("prometheus-adapter-config", "config.yaml", "delta(nv_inference_request_success", "rate(nv_inference_request_success",
     "prometheus-adapter"),
    ("prometheus-adapter-config", "config.yaml", "as: servelab_queue_us_per_request", "as: queue_us", "prometheus-adapter"),
])
def test_the_metric_is_servelab_core_scalings(objects, name, key, old, new, expect):
    found = _planted(objects, lambda o: _edit_config(o, name, key, lambda t: t.replace(old, new)))
    assert any(expect in line for line in found), found


def test_the_adapter_query_is_the_lessons_promql_for_one_service(objects):
    """The adapter's template, filled in as it fills it for the HPA's Object metric, is promql(by=service)
    restricted to the Triton Service."""
    rule = yaml.safe_load(_get(objects, "ConfigMap", "prometheus-adapter-config")["data"]["config.yaml"])["rules"][0]
    filled = (rule["metricsQuery"].replace("<<.GroupBy>>", "service")
              .replace("<<.LabelMatchers>>", 'namespace="servelab",service="triton-server"'))
    assert filled == scaling.promql(by="service", match='namespace="servelab",service="triton-server"')
    assert filled.replace('{namespace="servelab",service="triton-server"}', "") == scaling.promql(by="service")


def test_hpa_target_comes_from_the_queueing_model():
    rho = scaling.held_utilization()
    assert scaling.p99_response(rho, 1.0) == pytest.approx(scaling.BUDGET_FACTOR, rel=1e-6)
    assert scaling.p99_response(rho + 0.01, 1.0) > scaling.BUDGET_FACTOR  # the highest such utilization
    assert k8s.hpa_target_us(5600) == round(rho * 5600 / (2 * (1 - rho)))
    assert k8s.hpa_target_us(11200) == pytest.approx(2 * k8s.hpa_target_us(5600), abs=1)  # linear in S(1)
    # a looser budget lets each replica run busier before the autoscaler adds one
    assert scaling.held_utilization(20) > rho
    with pytest.raises(ValueError):
        scaling.queue_target_us(0)
    with pytest.raises(ValueError):
        scaling.held_utilization(1.0)


# --------------------------------------------------------------------------
# Containment (issue 48, finding 5): resources, pod security, network policy, the adapter's TLS


def _spec(objs, name, kind="Deployment"):
    return _get(objs, kind, name)["spec"]["template"]["spec"]


def _policy(objs, name):
    return _get(objs, "NetworkPolicy", name)["spec"]


def test_every_container_has_cpu_and_memory_requests_and_limits(objects):
    assert k8s.resource_problems(objects) == []
    containers = [c for _o, spec, _l in k8s._workloads(objects) for c in spec["containers"]]
    assert len(containers) == 6  # triton, flask, fastapi, prometheus, adapter, device plugin
    for c in containers:
        res = c["resources"]
        assert {"cpu", "memory"} <= set(res["requests"]) and {"cpu", "memory"} <= set(res["limits"]), c["name"]
    # the GPU pods keep one GPU each
    for name in ("triton-server", "fastapi-server"):
        assert _spec(objects, name)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    # Triton's /dev/shm (1 GiB in memory) is charged to its memory limit: the limit leaves room beyond it
    triton = _spec(objects, "triton-server")["containers"][0]["resources"]["limits"]
    assert k8s.quantity(triton["memory"]) > k8s.quantity("1Gi")


def test_pods_are_restricted_and_mount_tokens_only_where_they_use_the_api(objects):
    assert k8s.security_problems(objects) == []
    for name in k8s.RESTRICTED:
        spec = _spec(objects, name)
        c = spec["containers"][0]["securityContext"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c["allowPrivilegeEscalation"] is False and c["capabilities"]["drop"] == ["ALL"]
    # the built images' USER, and the official images' users (Prometheus: USER nobody, a name)
    assert _spec(objects, "flask")["securityContext"]["runAsUser"] == k8s.image_user("servelab/flask:0.1.0") == 10001
    assert _spec(objects, "prometheus")["securityContext"]["runAsUser"] == 65534
    tokens = {o["metadata"]["name"]: spec.get("automountServiceAccountToken", True)
              for o, spec, _l in k8s._workloads(objects, "servelab")}
    assert tokens == {"triton-server": False, "flask": False, "fastapi-server": False,
                      "prometheus": True, "prometheus-adapter": True}  # discovery / the aggregated API need it


def test_the_model_repository_is_mounted_read_only(objects):
    mounts = {m["mountPath"]: m for m in _spec(objects, "triton-server")["containers"][0]["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    vols = {v["name"]: v for v in _spec(objects, "triton-server")["volumes"]}
    assert "hostPath" in vols[mounts["/models"]["name"]]


def test_the_namespace_denies_by_default_and_lets_the_labs_flows_through(objects):
    assert k8s.network_problems(objects) == []
    flows = {what for what, *_rest in k8s.lab_flows(objects)}
    assert "flask -> triton-server:8000 (the web page's inference backend)" in flows
    assert "prometheus -> triton-server pods' metrics port (scrape)" in flows
    assert "prometheus-adapter -> prometheus:9090 (the metric it serves)" in flows
    assert "any client -> flask:80 (published)" in flows
    pods = {name: (labels, "servelab", ports) for name, labels, ports in k8s._pods(objects)}
    # what the lab does not need stays blocked
    assert not k8s.allowed(objects, None, pods["triton-server"], 8000)            # Triton from outside
    assert not k8s.allowed(objects, pods["flask"], pods["triton-server"], 8002)   # the web page: no metrics
    assert not k8s.allowed(objects, pods["flask"], pods["prometheus"], 9090)
    assert not k8s.allowed(objects, pods["triton-server"], None, 443)            # Triton: no way out
    assert not k8s.allowed(objects, pods["fastapi-server"], pods["triton-server"], 8000)
    # the API server reaches the adapter from the node itself, which a policy never blocks (NetworkPolicySpec:
    # "OR if the traffic source is the pod's local node"); no pod may
    assert not k8s.allowed(objects, pods["flask"], pods["prometheus-adapter"], 6443)


def _rule_ports(objs, name, direction, value):
    for rule in _policy(objs, name)[direction]:
        for p in rule.get("ports") or []:
            p["port"] = value


@pytest.mark.parametrize("change, expect", [
    # resources
    (lambda o: _spec(o, "flask")["containers"][0]["resources"]["limits"].pop("memory"), "flask: no memory limit"),
    (lambda o: _spec(o, "prometheus")["containers"][0]["resources"]["requests"].update(cpu="4"),
     "cpu request 4 is above its limit"),
    (lambda o: _spec(o, "nvidia-device-plugin", "DaemonSet")["containers"][0].pop("resources"), "no cpu request"),
    (lambda o: _spec(o, "triton-server")["containers"][0]["resources"]["limits"].update(memory="1Gi"),
     "in-memory emptyDir"),
    # pod security
    (lambda o: _spec(o, "prometheus")["securityContext"].pop("runAsUser"), "has no numeric USER"),
    (lambda o: _spec(o, "flask")["securityContext"].update(runAsUser=1000), "is not the image's USER 10001"),
    (lambda o: _spec(o, "fastapi-server")["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
     "allowPrivilegeEscalation"),
    (lambda o: _spec(o, "prometheus-adapter")["containers"][0]["securityContext"]["capabilities"].update(drop=[]),
     "drop ALL"),
    (lambda o: _spec(o, "flask")["securityContext"].pop("seccompProfile"), "seccompProfile"),
    (lambda o: _spec(o, "flask").update(automountServiceAccountToken=True), "has no role"),
    (lambda o: _spec(o, "prometheus").update(automountServiceAccountToken=False), "does not mount its token"),
    (lambda o: next(m for m in _spec(o, "triton-server")["containers"][0]["volumeMounts"]
                    if m["mountPath"] == "/models").pop("readOnly"), "mounted read-write"),
    # network policy: a port or label no pod has, a flow cut, a port opened to the world, no default deny
    (lambda o: _rule_ports(o, "triton-server", "ingress", 9000), "no pod it selects has it"),
    (lambda o: _policy(o, "triton-server")["podSelector"]["matchLabels"].update({"app.kubernetes.io/name": "triton"}),
     "selects no pod"),
    (lambda o: _policy(o, "flask")["egress"][0]["to"][0]["podSelector"]["matchLabels"].update(
        {"app.kubernetes.io/name": "tritonserver"}), "no pod has those labels"),
    (lambda o: _rule_ports(o, "prometheus-adapter", "egress", 9091), "no pod it reaches has it"),
    (lambda o: _policy(o, "prometheus")["ingress"].clear(), "blocked: prometheus-adapter -> prometheus:9090"),
    (lambda o: _policy(o, "triton-server")["ingress"].append({"ports": [{"port": "http"}]}),
     "triton-server accepts clients from anywhere"),
    (lambda o: _policy(o, "default-deny").update(policyTypes=["Ingress"]), "no default-deny"),
    (lambda o: _policy(o, "allow-dns")["egress"][0]["ports"][0].update(protocol="TCP"), "cluster DNS"),
    # the adapter's TLS
    (lambda o: _get(o, "APIService", "v1beta1.custom.metrics.k8s.io")["spec"].update(insecureSkipTLSVerify=True),
     "insecureSkipTLSVerify"),
    (lambda o: _spec(o, "prometheus-adapter")["containers"][0]["args"].remove(
        "--tls-cert-file=/etc/adapter-tls/tls.crt"), "--tls-cert-file"),
])
def test_a_planted_containment_defect_is_caught(objects, change, expect):
    found = _planted(objects, change)
    assert found and any(expect in line for line in found), found


def test_the_schema_accepts_every_new_object(objects):
    kinds = [o["kind"] for o in objects]
    assert kinds.count("NetworkPolicy") >= 6
    assert k8s.validate([o for o in objects if o["kind"] == "NetworkPolicy"]) == []
