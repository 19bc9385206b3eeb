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
