"""A fake Chameleon site behind python-chi's client seam.

The real python-chi 1.2.10 code runs; only the objects it gets from its client
factories are replaced (the same seam python-chi's own tests patch):

    chi.lease.blazar, chi.lease.connection, chi.server.nova, chi.server.connection,
    chi.server.session, chi.image.glance, chi.network.neutron,
    chi.server.Connection (fabric SSH), chi.server.Server._can_connect_to_port,
    chi.context.list_sites, chi.context.list_projects (widgets' data)

The fake cloud keeps its state in a JSON file (``FAKE_CHAMELEON_STATE``) so
that several notebooks, each in its own kernel, see the same leases, servers
and floating IPs, and the test reads back every call made. Each fake method
has the signature of the real client method it stands for, and behaves like
the service where the lab depends on it: a lease starts PENDING and becomes
ACTIVE, a server is BUILD then ACTIVE (or ERROR, for as many deploys as a
test sets in ``failed_deploys``), a bare-metal server needs an active
node reservation, a lease stays PENDING until its start time, deleting a
server leaves its floating IP allocated,
the raw ``conn.network.delete(<id>)`` python-chi sends from ``Server.delete``
releases nothing, SSH only reaches an ACTIVE server's floating IP, a lease
is prolonged only up to the start of the next reservation of its node
(``node_reserved_from``, set by a test), or refused. On the
node (:class:`FakeNode`), commands the lab does not send fail (exit 127),
``git clone`` works only for URLs a test marked reachable, the trained model's
download gets the stand-in file a test serves (or fails), and uploads,
archives and the unpacked kit are real files in a folder beside the state.

Loaded in a notebook kernel by an IPython start-up file the test writes
(``install_from_env()``), never by the notebooks themselves.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import uuid
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from unittest import mock

STATE_ENV = "FAKE_CHAMELEON_STATE"
K3S_VERSION = "v1.31.5+k3s1"  # servelab.deploy.k8s.K3S_VERSION (a test keeps them equal)
# k3s's kubectl when the cc user cannot read the admin kubeconfig (k3s pkg/kubectl/main.go, then kubectl's own error)
UNREADABLE_KUBECONFIG = (
    'level=warning msg="Unable to read /etc/rancher/k3s/k3s.yaml, please start server with --write-kubeconfig-mode '
    'or --write-kubeconfig-group to modify kube config permissions"\n'
    'error: error loading config file "/etc/rancher/k3s/k3s.yaml": open /etc/rancher/k3s/k3s.yaml: permission denied')

PROJECT_ID = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
PROJECT_NAME = "CHI-251409"
USER_ID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"

SITES = {
    "CHI@TACC": {"name": "CHI@TACC", "web": "https://chi.tacc.chameleoncloud.org", "location": "Austin, Texas, USA",
                 "user_support_contact": "help@chameleoncloud.org", "site_class": "baremetal"},
    "CHI@UC": {"name": "CHI@UC", "web": "https://chi.uc.chameleoncloud.org", "location": "Chicago, Illinois, USA",
               "user_support_contact": "help@chameleoncloud.org", "site_class": "baremetal"},
}
IMAGES = [
    {"id": "5d2e1b9a-0001-4c3e-9d0a-cc2404cuda01", "name": "CC-Ubuntu24.04-CUDA", "build-repo": "https://github.com/ChameleonCloud/cc-images"},
    {"id": "5d2e1b9a-0002-4c3e-9d0a-cc2404000002", "name": "CC-Ubuntu24.04", "build-repo": "https://github.com/ChameleonCloud/cc-images"},
    {"id": "5d2e1b9a-0003-4c3e-9d0a-cc2204000003", "name": "CC-Ubuntu22.04", "build-repo": "https://github.com/ChameleonCloud/cc-images"},
]
NETWORKS = [
    {"id": "net-sharednet1-0000-0000-000000000001", "name": "sharednet1", "router:external": False},
    {"id": "net-public-00000-0000-0000-000000000002", "name": "public", "router:external": True},
]
FLAVORS = [{"id": "flavor-baremetal-0001", "name": "baremetal"}]
GPU_LINES = [
    "0, Tesla P100-PCIE-16GB, 16384 MiB, 560.35.05",
    "1, Tesla P100-PCIE-16GB, 16384 MiB, 560.35.05",
]
SERVER_BUILD_POLLS = 2  # nova GETs that still say BUILD after create


class FakeServiceError(Exception):
    """A request the real service would refuse (HTTP 4xx)."""


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _blazar_date(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%f")


def _blazar_created(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%d %H:%M:%S")


# --------------------------------------------------------------------------
# The cloud's state, in a JSON file


class Cloud:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.node_home = self.path.with_name(self.path.stem + "-node-home")  # /home/cc on the node

    def empty_state(self) -> dict:
        return {"leases": {}, "servers": {}, "floatingips": {}, "ports": {}, "keypairs": {},
                "calls": [], "ssh": [], "cloned": [], "next_ip": 10,
                # the node: flags for what is installed; files live in node_home
                "node": {}, "uploads": [], "downloads": [], "unpacked": [],
                "reachable_repos": [], "failed_deploys": 0, "node_reserved_from": None,
                "prepared": [], "trained_weights": None, "weights_fetches": []}

    def load(self) -> dict:
        if not self.path.exists():
            return self.empty_state()
        return json.loads(self.path.read_text())

    def save(self, state: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, default=str))
        tmp.replace(self.path)

    @contextmanager
    def state(self):
        state = self.load()
        yield state
        self.save(state)

    def add_reachable_repo(self, url: str) -> None:
        """A git URL the node can clone (every other URL is unreachable)."""
        with self.state() as st:
            st["reachable_repos"].append(url)

    def record(self, client: str, method: str, *args, **kwargs) -> None:
        with self.state() as st:
            st["calls"].append({"client": client, "method": method,
                                "args": json.loads(json.dumps(list(args), default=str)),
                                "kwargs": json.loads(json.dumps(kwargs, default=str))})

    # Seeding helpers for tests ------------------------------------------------

    def serve_trained_weights(self, path: str | os.PathLike | None, blob: str | None = None) -> None:
        """What the node downloads as the earlier lab's trained model: the stand-in file ``path``, and the
        git blob id the test records for it (in place of the real one); ``None``: the download fails."""
        with self.state() as st:
            st["trained_weights"] = None if path is None else {"file": str(path), "blob": blob}

    def fail_next_deploys(self, count: int = 1) -> None:
        """The next ``count`` servers end their BUILD in ERROR (a failed bare-metal deploy)."""
        with self.state() as st:
            st["failed_deploys"] = count

    def reserve_node_from(self, start: datetime) -> None:
        """Another lease holds the node from ``start`` (naive UTC): no extension past it."""
        with self.state() as st:
            st["node_reserved_from"] = _blazar_date(start)

    def shorten_lease(self, name: str, minutes_left: float) -> None:
        """Move a lease's end so that ``minutes_left`` remain (a lease about to end)."""
        with self.state() as st:
            for lease in st["leases"].values():
                if lease["name"] == name:
                    lease["end_date"] = _blazar_date(_now() + timedelta(minutes=minutes_left))

    def seed_lease(self, name: str, status: str, user_id: str = USER_ID, hours_ago: float = 0.0) -> dict:
        start = _now() - timedelta(hours=hours_ago)
        lease = _lease_json(name, start, start + timedelta(hours=3), status, user_id,
                            [{"resource_type": "physical:host", "min": 1, "max": 1,
                              "resource_properties": '["==", "$node_type", "gpu_p100"]',
                              "hypervisor_properties": ""}])
        with self.state() as st:
            st["leases"][lease["id"]] = lease
        return lease


def _lease_json(name, start, end, status, user_id, reservations) -> dict:
    lease_id = str(uuid.uuid4())
    res_status = {"ACTIVE": "active", "PENDING": "pending", "TERMINATED": "deleted"}.get(status, "pending")
    return {
        "id": lease_id, "name": name, "status": status, "user_id": user_id, "project_id": PROJECT_ID,
        "start_date": _blazar_date(start), "end_date": _blazar_date(end),
        "created_at": _blazar_created(_now()), "updated_at": None, "degraded": False,
        "reservations": [
            dict(r, id=str(uuid.uuid4()), lease_id=lease_id, resource_id=str(uuid.uuid4()), status=res_status,
                 min=int(r.get("min", 0)) if "min" in r else r.get("min"),
                 max=int(r.get("max", 0)) if "max" in r else r.get("max"))
            for r in reservations
        ],
        "events": [],
    }


# --------------------------------------------------------------------------
# Blazar (reservations): blazarclient.v1.leases.LeaseClientManager


class FakeLeaseManager:
    def __init__(self, cloud: Cloud):
        self.cloud = cloud

    def create(self, name, start, end, reservations, events, before_end=None):
        self.cloud.record("blazar", "lease.create", name=name, start=start, end=end,
                          reservations=reservations, events=events, before_end=before_end)
        start_dt = _now() if start == "now" else datetime.strptime(start, "%Y-%m-%d %H:%M")
        end_dt = datetime.strptime(end, "%Y-%m-%d %H:%M")
        if end_dt <= start_dt:
            raise _blazar_error("The lease end date must be later than its start date.", 400)
        if not reservations:
            raise _blazar_error("No reservations provided.", 400)
        for r in reservations:
            if r.get("resource_type") == "physical:host":
                json.loads(r["resource_properties"])  # must be valid JSON, as Blazar parses it
                if int(r["min"]) < 1 or int(r["max"]) < int(r["min"]):
                    raise _blazar_error("Invalid min/max for a host reservation.", 400)
        lease = _lease_json(name, start_dt, end_dt, "PENDING", USER_ID, reservations)
        with self.cloud.state() as st:
            st["leases"][lease["id"]] = lease
        return lease

    def get(self, lease_id):
        self.cloud.record("blazar", "lease.get", lease_id)
        with self.cloud.state() as st:
            lease = st["leases"].get(lease_id)
            if lease is None:
                raise _blazar_error(f"Object with {{'lease_id': '{lease_id}'}} not found", 404)
            start = datetime.strptime(lease["start_date"], "%Y-%m-%dT%H:%M:%S.%f")
            if lease["status"] == "PENDING" and _now() >= start:  # the reservation starts at its start time
                lease["status"] = "ACTIVE"
                for r in lease["reservations"]:
                    r["status"] = "active"
            return lease

    def update(self, lease_id, name=None, prolong_for=None, reduce_by=None, end_date=None, advance_by=None,
               defer_by=None, start_date=None, reservations=None):
        """Only what the lab sends: prolong an active lease (Blazar's ``prolong_for``, e.g. "1h")."""
        from blazarclient import utils as blazar_utils

        self.cloud.record("blazar", "lease.update", lease_id, prolong_for=prolong_for)
        if not prolong_for or any((name, reduce_by, end_date, advance_by, defer_by, start_date, reservations)):
            raise FakeServiceError("the fake Blazar only prolongs leases (prolong_for)")
        delta = blazar_utils.from_elapsed_time_to_delta(prolong_for)  # raises on a bad form, like the client
        with self.cloud.state() as st:
            lease = st["leases"].get(lease_id)
            if lease is None:
                raise _blazar_error(f"Object with {{'lease_id': '{lease_id}'}} not found", 404)
            if lease["status"] != "ACTIVE":
                raise _blazar_error(f"Lease {lease_id} is {lease['status']}: only an active lease can be extended.",
                                    409)
            end = datetime.strptime(lease["end_date"], "%Y-%m-%dT%H:%M:%S.%f") + delta
            taken = st.get("node_reserved_from")
            if taken and end > datetime.strptime(taken, "%Y-%m-%dT%H:%M:%S.%f"):
                raise _blazar_error("Not enough hosts available: the node is reserved by another lease from "
                                    f"{taken[:16]}.", 409)
            lease["end_date"] = _blazar_date(end)
            return dict(lease)

    def list(self, sort_by=None):
        self.cloud.record("blazar", "lease.list")
        leases = list(self.cloud.load()["leases"].values())
        return sorted(leases, key=lambda x: x[sort_by]) if sort_by else leases

    def delete(self, lease_id):
        self.cloud.record("blazar", "lease.delete", lease_id)
        with self.cloud.state() as st:
            lease = st["leases"].pop(lease_id, None)
            if lease is None:
                raise _blazar_error(f"Object with {{'lease_id': '{lease_id}'}} not found", 404)
            # Ending a lease ends the servers on its reservations (their ports go too).
            res_ids = {r["id"] for r in lease["reservations"]}
            for sid in [sid for sid, s in st["servers"].items() if s["reservation"] in res_ids]:
                _delete_server(st, sid)


def _blazar_error(message, code):
    from blazarclient.exception import BlazarClientException

    return BlazarClientException(message, code=code)


class FakeBlazar:
    def __init__(self, cloud: Cloud):
        self.lease = FakeLeaseManager(cloud)


# --------------------------------------------------------------------------
# Nova (compute): novaclient.v2 managers


class FakeNovaServer:
    """What novaclient returns: attributes, plus .networks like novaclient's."""

    def __init__(self, data: dict):
        self._data = data
        self.id = data["id"]
        self.name = data["name"]
        self.status = data["status"]
        self.addresses = data["addresses"]
        self.created = data["created"]
        self.hostId = data["host_id"]
        self.image = {"id": data["image_id"]}
        self.flavor = {"original_name": data["flavor_name"]}
        self.key_name = data["key_name"]

    @property
    def networks(self):
        nets = {}
        for label, addrs in self.addresses.items():
            nets[label] = [a["addr"] for a in addrs]
        return nets

    def to_dict(self):
        return dict(self._data)


class FakeServers:
    def __init__(self, cloud: Cloud):
        self.cloud = cloud

    def get(self, server):
        self.cloud.record("nova", "servers.get", server)
        with self.cloud.state() as st:
            data = st["servers"].get(server)
            if data is None:
                raise _nova_not_found(f"Server {server} could not be found.")
            if data["status"] == "BUILD":
                data["polls"] += 1
                if data["polls"] > SERVER_BUILD_POLLS:
                    failed = st.get("failed_deploys", 0) > 0
                    if failed:  # the bare-metal deploy failed: Nova says ERROR, for good
                        st["failed_deploys"] -= 1
                    data["status"] = "ERROR" if failed else "ACTIVE"
            return FakeNovaServer(data)

    def list(self, detailed=True, search_opts=None, marker=None, limit=None, sort_keys=None, sort_dirs=None):
        self.cloud.record("nova", "servers.list")
        return [FakeNovaServer(s) for s in self.cloud.load()["servers"].values()]

    def delete(self, server):
        self.cloud.record("nova", "servers.delete", server)
        with self.cloud.state() as st:
            if server not in st["servers"]:
                raise _nova_not_found(f"Server {server} could not be found.")
            _delete_server(st, server)


def _delete_server(st: dict, server_id: str) -> None:
    """Nova deletes the server and its ports; Neutron keeps floating IPs allocated."""
    st["servers"].pop(server_id, None)
    for pid in [pid for pid, p in st["ports"].items() if p["device_id"] == server_id]:
        st["ports"].pop(pid)
        for fip in st["floatingips"].values():
            if fip["port_id"] == pid:
                fip.update(port_id=None, fixed_ip_address=None, status="DOWN")


def _nova_not_found(message):
    from novaclient.exceptions import NotFound

    return NotFound(404, message)


class FakeKeypair:
    def __init__(self, data):
        self.name = data["name"]
        self.public_key = data["public_key"]
        self.fingerprint = data["fingerprint"]
        self.id = data["name"]


class FakeKeypairs:
    def __init__(self, cloud: Cloud):
        self.cloud = cloud

    def get(self, keypair, user_id=None):
        self.cloud.record("nova", "keypairs.get", keypair)
        data = self.cloud.load()["keypairs"].get(keypair)
        if data is None:
            raise _nova_not_found(f"Keypair {keypair} not found.")
        return FakeKeypair(data)

    def create(self, name, public_key, key_type="ssh", user_id=None):
        from chi.util import sshkey_fingerprint

        self.cloud.record("nova", "keypairs.create", name, key_type=key_type)
        with self.cloud.state() as st:
            if name in st["keypairs"]:
                raise FakeServiceError(f"Key pair '{name}' already exists. (HTTP 409)")
            st["keypairs"][name] = {"name": name, "public_key": public_key,
                                    "fingerprint": sshkey_fingerprint(public_key)}
            return FakeKeypair(st["keypairs"][name])

    def delete(self, key, user_id=None):
        self.cloud.record("nova", "keypairs.delete", key)
        with self.cloud.state() as st:
            if st["keypairs"].pop(key, None) is None:
                raise _nova_not_found(f"Keypair {key} not found.")


class FakeFlavor:
    def __init__(self, data):
        self.id = data["id"]
        self.name = data["name"]


class FakeFlavors:
    def __init__(self, cloud: Cloud):
        self.cloud = cloud

    def list(self, detailed=True, is_public=True, marker=None, min_disk=None, min_ram=None, limit=None,
             sort_key=None, sort_dir=None):
        self.cloud.record("nova", "flavors.list")
        return [FakeFlavor(f) for f in FLAVORS]

    def get(self, flavor):
        for f in FLAVORS:
            if f["id"] == flavor:
                return FakeFlavor(f)
        raise _nova_not_found(f"Flavor {flavor} could not be found.")


class FakeNova:
    def __init__(self, cloud: Cloud):
        self.servers = FakeServers(cloud)
        self.keypairs = FakeKeypairs(cloud)
        self.flavors = FakeFlavors(cloud)


# --------------------------------------------------------------------------
# openstacksdk Connection: compute and network proxies


class FakeSdkServer:
    def __init__(self, data):
        self.id = data["id"]
        self.name = data["name"]
        self.host_status = "UP"
        self.hypervisor_hostname = data["hypervisor"]
        self.is_locked = False


class FakeComputeProxy:
    def __init__(self, cloud: Cloud):
        self.cloud = cloud

    def create_server(self, **attrs):
        self.cloud.record("sdk", "compute.create_server", **attrs)
        with self.cloud.state() as st:
            image = next((i for i in IMAGES if i["id"] == attrs.get("imageRef")), None)
            if image is None:
                raise FakeServiceError(f"Image {attrs.get('imageRef')} could not be found. (HTTP 400)")
            if not any(f["id"] == attrs.get("flavorRef") for f in FLAVORS):
                raise FakeServiceError(f"Flavor {attrs.get('flavorRef')} could not be found. (HTTP 400)")
            key = attrs.get("key_name")
            if key not in st["keypairs"]:
                raise FakeServiceError(f"Invalid key_name provided: {key!r}. (HTTP 400)")
            reservation = (attrs.get("scheduler_hints") or {}).get("reservation")
            host_reservation = next(
                (r for lease in st["leases"].values() if lease["status"] == "ACTIVE"
                 for r in lease["reservations"] if r["id"] == reservation and r["resource_type"] == "physical:host"),
                None)
            if host_reservation is None:
                # Chameleon's bare-metal flavor only schedules onto an active host reservation.
                raise FakeServiceError("No valid host was found: a bare-metal server needs an active "
                                       "host reservation in scheduler_hints. (HTTP 500 from the scheduler)")
            in_use = sum(1 for s in st["servers"].values() if s["reservation"] == reservation)
            if in_use >= int(host_reservation["max"]):
                raise FakeServiceError("No valid host was found: every reserved node is in use.")
            net_ids = [n["uuid"] for n in attrs.get("networks") or []]
            nets = [n for n in NETWORKS if n["id"] in net_ids]
            if not nets:
                raise FakeServiceError("Network could not be found. (HTTP 400)")
            server_id = str(uuid.uuid4())
            fixed = f"10.52.0.{len(st['servers']) + 20}"
            port_id = str(uuid.uuid4())
            st["ports"][port_id] = {"id": port_id, "device_id": server_id, "network_id": nets[0]["id"],
                                    "fixed_ips": [{"ip_address": fixed}]}
            st["servers"][server_id] = {
                "id": server_id, "name": attrs["name"], "status": "BUILD", "polls": 0,
                "image_id": image["id"], "flavor_name": "baremetal", "key_name": key,
                "reservation": reservation, "created": _now().isoformat() + "Z",
                "host_id": uuid.uuid4().hex, "hypervisor": "c01-" + uuid.uuid4().hex[:6],
                "addresses": {nets[0]["name"]: [{"addr": fixed, "version": 4, "OS-EXT-IPS:type": "fixed",
                                                 "OS-EXT-IPS-MAC:mac_addr": "fa:16:3e:00:00:01"}]},
            }
        return FakeSdkServer(st["servers"][server_id])

    def get_server(self, server):
        self.cloud.record("sdk", "compute.get_server", server)
        data = self.cloud.load()["servers"].get(server)
        if data is None:
            raise FakeServiceError(f"No Server found for {server}")
        return FakeSdkServer(data)

    def remove_floating_ip_from_server(self, server, address):
        raise FakeServiceError("not used by the lab")


class FakeResponse:
    def __init__(self, status_code):
        self.status_code = status_code
        self.ok = status_code < 400


class FakeNetworkProxy:
    def __init__(self, cloud: Cloud):
        self.cloud = cloud

    def ports(self, **query):
        self.cloud.record("sdk", "network.ports", **query)
        ports = self.cloud.load()["ports"].values()
        return [p for p in ports if all(p.get(k) == v for k, v in query.items())]

    def update_ip(self, floating_ip, if_revision=None, **attrs):
        self.cloud.record("sdk", "network.update_ip", floating_ip, **attrs)
        with self.cloud.state() as st:
            fip = st["floatingips"].get(floating_ip)
            if fip is None:
                raise _sdk_error(f"Floating IP {floating_ip} not found")
            port = st["ports"].get(attrs.get("port_id"))
            if port is None:
                raise _sdk_error(f"Port {attrs.get('port_id')} not found")
            if fip["port_id"] not in (None, port["id"]):
                raise _sdk_error(f"Floating IP {fip['floating_ip_address']} is already in use (HTTP 409)")
            fip.update(port_id=port["id"], fixed_ip_address=port["fixed_ips"][0]["ip_address"], status="ACTIVE")
            server = st["servers"][port["device_id"]]
            label = next(iter(server["addresses"]))
            server["addresses"][label].append({"addr": fip["floating_ip_address"], "version": 4,
                                               "OS-EXT-IPS:type": "floating",
                                               "OS-EXT-IPS-MAC:mac_addr": "fa:16:3e:00:00:01"})
            return dict(fip)

    def delete(self, url, **kwargs):
        # python-chi's Server.delete(delete_ips=True) calls this with a bare
        # floating-IP id: a raw DELETE on the network endpoint's root, which
        # the service answers 404 and which releases nothing.
        self.cloud.record("sdk", "network.delete", url, **kwargs)
        return FakeResponse(404)


def _sdk_error(message):
    from openstack.exceptions import SDKException

    return SDKException(message)


class FakeConnection:
    def __init__(self, cloud: Cloud):
        self.compute = FakeComputeProxy(cloud)
        self.network = FakeNetworkProxy(cloud)
        self.current_user_id = USER_ID

    def get_user_id(self):
        return USER_ID


class FakeSession:
    """Stands in for the keystone session python-chi passes to connection()."""

    region_name = "CHI@TACC"
    interface = "public"

    def get_project_id(self):
        return PROJECT_ID

    def get_user_id(self):
        return USER_ID


# --------------------------------------------------------------------------
# Glance (images): glanceclient.v2.images.Controller


class FakeImage(dict):
    """glanceclient returns warlock models: attributes and dict-style keys."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


class FakeImages:
    def __init__(self, cloud: Cloud):
        self.cloud = cloud

    def list(self, **kwargs):
        self.cloud.record("glance", "images.list", **kwargs)
        filters = kwargs.get("filters") or {}
        return [FakeImage(i, created_at="2025-06-01T00:00:00Z") for i in IMAGES
                if all(i.get(k) == v for k, v in filters.items())]

    def get(self, image_id):
        self.cloud.record("glance", "images.get", image_id)
        for i in IMAGES:
            if i["id"] == image_id:
                return FakeImage(i, created_at="2025-06-01T00:00:00Z")
        from glanceclient.exc import NotFound

        raise NotFound(f"No image found with ID {image_id}")


class FakeGlance:
    def __init__(self, cloud: Cloud):
        self.images = FakeImages(cloud)


# --------------------------------------------------------------------------
# Neutron: neutronclient.v2_0.client.Client


class FakeNeutron:
    def __init__(self, cloud: Cloud):
        self.cloud = cloud

    def list_networks(self, retrieve_all=True, **_params):
        self.cloud.record("neutron", "list_networks")
        return {"networks": [dict(n) for n in NETWORKS]}

    def show_network(self, network, **_params):
        self.cloud.record("neutron", "show_network", network)
        for n in NETWORKS:
            if n["id"] == network:
                return {"network": dict(n)}
        from neutronclient.common.exceptions import NotFound

        raise NotFound(message=f"Network {network} could not be found.")

    def list_floatingips(self, retrieve_all=True, **_params):
        self.cloud.record("neutron", "list_floatingips")
        return {"floatingips": [dict(f) for f in self.cloud.load()["floatingips"].values()]}

    def create_floatingip(self, body=None):
        self.cloud.record("neutron", "create_floatingip", body=body)
        net = body["floatingip"]["floating_network_id"]
        if net != next(n["id"] for n in NETWORKS if n["name"] == "public"):
            raise FakeServiceError("Floating IPs come from the public network.")
        with self.cloud.state() as st:
            fip_id = str(uuid.uuid4())
            address = f"129.114.108.{st['next_ip']}"
            st["next_ip"] += 1
            st["floatingips"][fip_id] = {"id": fip_id, "floating_ip_address": address, "floating_network_id": net,
                                         "port_id": None, "fixed_ip_address": None, "status": "DOWN",
                                         "project_id": PROJECT_ID, "tags": []}
            return {"floatingip": dict(st["floatingips"][fip_id])}

    def delete_floatingip(self, floatingip):
        self.cloud.record("neutron", "delete_floatingip", floatingip)
        with self.cloud.state() as st:
            if st["floatingips"].pop(floatingip, None) is None:
                from neutronclient.common.exceptions import NotFound

                raise NotFound(message=f"Floating IP {floatingip} could not be found.")


# --------------------------------------------------------------------------
# SSH: fabric.Connection


class FakeResult:
    def __init__(self, command, stdout, exited=0):
        self.command = command
        self.stdout = stdout
        self.stderr = ""
        self.exited = exited
        self.ok = exited == 0

    def __bool__(self):
        return self.ok

    def __repr__(self):  # as fabric's Result shows itself
        return f"<Result cmd={self.command!r} exited={self.exited}>"


class _FakeSSHClient:
    def set_missing_host_key_policy(self, policy):
        self.policy = policy


def make_fabric_connection(cloud: Cloud, repo_root: Path):
    class FakeFabricConnection:
        def __init__(self, host, user=None, port=None, config=None, gateway=None, forward_agent=None,
                     connect_timeout=None, connect_kwargs=None, inline_ssh_env=None):
            self.host, self.user, self.connect_kwargs = host, user, connect_kwargs
            self.client = _FakeSSHClient()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def _check_reachable(self):
            st = cloud.load()
            ok = _reachable(st, self.host, 22)
            if not ok:
                raise TimeoutError(f"ssh to {self.host}:22 timed out (not an active server's floating IP)")

        def run(self, command, warn=False, hide=None, **kwargs):
            """fabric's Connection.run: a non-zero exit raises invoke's UnexpectedExit."""
            from fabric.runners import Result
            from invoke.exceptions import UnexpectedExit

            self._check_reachable()
            with cloud.state() as st:
                node = FakeNode(st, cloud.node_home, repo_root)
                stdout, stderr, code = node.run(command)
                st["ssh"].append({"host": self.host, "user": self.user, "command": command, "exited": code})
            if stdout and not hide:
                print(stdout, end="" if stdout.endswith("\n") else "\n")
            if stderr and not hide:
                print(stderr, end="" if stderr.endswith("\n") else "\n", file=sys.stderr)
            result = Result(connection=self, stdout=stdout, stderr=stderr, command=command, exited=code,
                            hide=("stdout", "stderr"))
            if code != 0 and not warn:
                raise UnexpectedExit(result)
            return result

        def put(self, local, remote=None, preserve_mode=True):
            """SFTP upload into the node's home (relative paths are relative to it, as with SFTP)."""
            self._check_reachable()
            local = Path(local)
            remote = remote or local.name
            target = _node_path(cloud.node_home, remote)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(local.read_bytes())
            with cloud.state() as st:
                st["ssh"].append({"host": self.host, "user": self.user, "command": f"<put {local.name} {remote}>",
                                  "exited": 0})
                st["uploads"].append({"local": str(local), "remote": remote, "bytes": local.stat().st_size})

        def get(self, remote, local=None, preserve_mode=True):
            """SFTP download from the node's home; a missing file fails like SFTP's."""
            self._check_reachable()
            source = _node_path(cloud.node_home, remote)
            if not source.is_file():
                raise FileNotFoundError(2, "No such file", remote)
            local = Path(local) if local else Path.cwd() / Path(remote).name
            if local.is_dir():
                local = local / Path(remote).name
            local.write_bytes(source.read_bytes())
            with cloud.state() as st:
                st["ssh"].append({"host": self.host, "user": self.user, "command": f"<get {remote} {local}>",
                                  "exited": 0})
                st["downloads"].append({"remote": remote, "local": str(local)})

    return FakeFabricConnection


def _reachable(st: dict, host: str, port: int) -> bool:
    if port != 22:
        return False
    for fip in st["floatingips"].values():
        if fip["floating_ip_address"] == host and fip["port_id"]:
            port_obj = st["ports"].get(fip["port_id"])
            server = st["servers"].get(port_obj["device_id"]) if port_obj else None
            return bool(server and server["status"] == "ACTIVE")
    return False


def _node_path(home: Path, path: str) -> Path:
    """A path on the node (``~/x``, ``/home/cc/x`` or relative to the home) in the fake's folder."""
    path = path.strip()
    if path in ("~", "/home/cc", "/home/cc/"):
        return home.resolve()
    for prefix in ("~/", "/home/cc/"):
        if path.startswith(prefix):
            path = path[len(prefix):]
            break
    else:
        if path.startswith("/"):
            raise ValueError(f"fake node: only the cc user's home is modelled, not {path}")
    target = (home / path).resolve()
    if not target.is_relative_to(home.resolve()):
        raise ValueError(f"fake node: {path} leaves the home folder")
    return target


class FakeNode:
    """A gpu_p100 node with CC-Ubuntu24.04-CUDA, as the lab's commands see it.

    Strict: a command the lab does not send gets exit 127, so a new or changed
    notebook command fails here until the fake is taught what the node does.
    Files in the cc user's home are real files under ``home`` (uploads, the
    unpacked kit, the archive notebook 7 copies back). Packages and Docker
    are state flags: ``docker`` works only once installed, ``--gpus all``
    only with the container toolkit configured.
    """

    def __init__(self, st: dict, home: Path, repo_root: Path):
        self.st, self.home, self.repo_root = st, home, repo_root
        self.home.mkdir(parents=True, exist_ok=True)
        self.flags = st["node"]

    # one simple command -> (stdout, stderr, exit code)
    def run(self, command: str):
        command = command.strip()
        for rule, handler in self.RULES:
            m = rule.fullmatch(command)
            if m:
                return handler(self, m)
        if " && " in command:  # a chain of simple commands, each of which must be known
            out_all = ""
            for part in command.split(" && "):
                out, err, code = self.run(part)
                out_all += out
                if code:
                    return out_all, err, code
            return out_all, "", 0
        return "", f"fake node: no rule for this command (exit 127): {command}", 127

    # -- the kit -----------------------------------------------------------
    def _test_d_or(self, m):
        if _node_path(self.home, m["path"]).is_dir():
            return "", "", 0
        return self.run(m["rest"])

    def _ls_remote(self, m):
        url = m["url"]
        if url in self.st["reachable_repos"]:
            return f"{'0' * 40}\tHEAD\n", "", 0
        return "", f"fatal: unable to access '{url}': Could not resolve host: {url.split('/')[2] if '//' in url else url}", 128

    def _clone(self, m):
        url, dest = m["url"], m["dest"]
        if url not in self.st["reachable_repos"]:
            return "", f"Cloning into '{dest}'...\nfatal: repository '{url}' not found", 128
        target = _node_path(self.home, dest)
        if target.exists():
            return "", f"fatal: destination path '{dest}' already exists and is not an empty directory.", 128
        for rel in _tracked(self.repo_root):
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            (target / rel).write_bytes((self.repo_root / rel).read_bytes())
        self.st["cloned"].append({"url": url, "dest": dest})
        return "", f"Cloning into '{dest}'...", 0

    def _mkdir(self, m):
        for path in m["paths"].split():
            _node_path(self.home, path).mkdir(parents=True, exist_ok=True)
        return "", "", 0

    def _untar(self, m):
        import tarfile

        archive, dest = _node_path(self.home, m["archive"]), _node_path(self.home, m["dest"] or "~/")
        if not archive.is_file():
            return "", f"tar: {m['archive']}: Cannot open: No such file or directory", 2
        if not dest.is_dir():
            return "", f"tar: {m['dest']}: Cannot open: No such file or directory", 2
        skip_old = bool(m["skip"])
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                target = (dest / member.name).resolve()
                if not target.is_relative_to(dest.resolve()):
                    return "", f"tar: {member.name}: Member name contains '..'", 2
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif member.isfile():
                    if skip_old and target.exists():
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(member).read())
        self.st["unpacked"].append({"archive": m["archive"], "dest": m["dest"] or "~"})
        return "", "", 0

    def _tar_create(self, m):
        import tarfile

        base = _node_path(self.home, m["base"])
        names = m["names"].split()
        missing = [n for n in names if not (base / n).exists()]
        if missing:
            return "", f"tar: {missing[0]}: Cannot stat: No such file or directory", 2
        with tarfile.open(_node_path(self.home, m["archive"]), "w:gz") as tar:
            for n in names:
                tar.add(base / n, arcname=n)
        return "", "", 0

    def _rm(self, m):
        for path in m["paths"].split():
            target = _node_path(self.home, path)
            if target.is_file():
                target.unlink()
            elif not m["force"]:
                return "", f"rm: cannot remove '{path}': No such file or directory", 1
        return "", "", 0

    def _ls(self, m):
        target = _node_path(self.home, m["path"])
        if not target.is_dir():
            return "", f"ls: cannot access '{m['path']}': No such file or directory", 2
        return "\n".join(sorted(p.name for p in target.iterdir())) + "\n", "", 0

    # -- packages, Docker, the NVIDIA container toolkit ----------------------
    @staticmethod
    def _flag(_unused, names, out=""):
        """A handler that records installed packages or services and succeeds."""
        def handler(self, m):
            for name in names.split():
                self.flags[name] = True
            return out, "", 0
        return handler

    def _ok(self, m):
        return "", "", 0

    def _docker_needed(self):
        if not self.flags.get("docker"):
            return "", "bash: line 1: docker: command not found", 127
        return None

    def _compose_version(self, m):
        return self._docker_needed() or ("Docker Compose version v2.40.3\n", "", 0)

    def _toolkit_configure(self, m):
        if not self.flags.get("toolkit"):
            return "", "sudo: nvidia-ctk: command not found", 1
        if not self.flags.get("docker"):
            return "", "Failed to restart docker.service: Unit docker.service not found.", 5
        self.flags["nvidia_runtime"] = True
        return "INFO Wrote updated config to /etc/docker/daemon.json\n", "", 0

    def _cgroupfs(self, m):
        if not (self.flags.get("jq") and self.flags.get("docker")):
            return "", "jq: command not found", 127
        self.flags["cgroupfs"] = True
        return "", "", 0

    def _cgroup_driver(self, m):
        return self._docker_needed() or (("cgroupfs" if self.flags.get("cgroupfs") else "systemd") + "\n", "", 0)

    def _prepare(self, m):
        """docker/prepare-node.sh in the background: needs Docker, the kit and the script in it."""
        missing = self._docker_needed()
        if missing:
            return missing
        script = _node_path(self.home, m["script"])
        if not script.is_file():
            return "", f"sh: 0: cannot open {m['script']}: No such file", 2
        self.st["prepared"].append(m["script"])
        return "", "", 0

    def _weights_fetch(self, m):
        """`python3 -m servelab.node.weights fetch` in the kit's folder: the real module, on the node's own
        python3 (-S: standard library only). The network is the test's: the stand-in file and its recorded
        id (``Cloud.serve_trained_weights``), or, by default, a download that fails."""
        import subprocess

        kit = _node_path(self.home, "~/serve-system-chi")
        if not (kit / "servelab" / "node" / "weights.py").is_file():
            return "", "/usr/bin/python3: Error while finding module specification for 'servelab.node.weights' " \
                       "(ModuleNotFoundError: No module named 'servelab')", 1
        served = self.st.get("trained_weights")
        if served:
            args = ["--url", Path(served["file"]).as_uri(), "--blob", served["blob"]]
        else:  # no route to the file: urlopen fails as it would offline
            args = ["--url", (self.home.parent / "unreachable" / "food11.pth").resolve().as_uri()]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SERVELAB_ROOT")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # the kit's files on the node stay the uploaded ones
        out = subprocess.run([sys.executable, "-S", "-m", "servelab.node.weights", "fetch", *args], cwd=kit,
                             env=env, capture_output=True, text=True, timeout=120)
        self.st["weights_fetches"].append({"served": served, "stdout": out.stdout, "exited": out.returncode})
        return out.stdout, out.stderr, out.returncode

    def _echo_to(self, m):
        target = _node_path(self.home, m["path"])
        if not target.parent.is_dir():
            return "", f"sh: 1: cannot create {m['path']}: Directory nonexistent", 2
        target.write_text(m["text"] + "\n")
        return "", "", 0

    def _smi_query(self, m):
        return "\n".join(GPU_LINES) + "\n", "", 0

    def _docker_gpus(self, m):
        missing = self._docker_needed()
        if missing:
            return missing
        if not self.flags.get("nvidia_runtime"):
            return "", ("docker: Error response from daemon: could not select device driver \"\" with "
                        "capabilities: [[gpu]]."), 125
        return "".join(f"GPU {i}: Tesla P100-PCIE-16GB (UUID: GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, str(i))})\n"
                       for i in range(2)), "", 0


    # -- k3s and the lab on Kubernetes (notebook 6d) --------------------------
    def _needs(self, *flags):
        """(stdout, stderr, code) of a missing prerequisite, or None."""
        msgs = {"docker": "bash: line 1: docker: command not found",
                "k3s": "bash: line 1: kubectl: command not found",
                "namespace": 'Error from server (NotFound): namespaces "servelab" not found',
                "k8s_applied": 'Error from server (NotFound): deployments.apps "triton-server" not found'}
        for f in flags:
            if f == "kubeconfig":
                if not self._kubeconfig_readable():
                    return "", UNREADABLE_KUBECONFIG, 1
            elif not self.flags.get(f):
                return "", msgs.get(f, f"fake node: {f} missing"), 127 if f in ("docker", "k3s") else 1
        return None

    def _kubeconfig_readable(self):
        """k3s's kubectl reads /etc/rancher/k3s/k3s.yaml (written with K3S_KUBECONFIG_MODE, root's) unless
        KUBECONFIG names another file (k3s pkg/kubectl/main.go): the cc user needs mode 644 or its own copy."""
        if self.flags.get("kubeconfig_env"):
            return _node_path(self.home, "~/.kube/config").is_file()
        return self.flags.get("kubeconfig_mode") == "644"

    def _k3s_install(self, m):
        if m["version"] != K3S_VERSION:
            return "", f"fake node: k3s {m['version']} is not the pinned {K3S_VERSION}", 1
        self.flags["k3s"] = True
        self.flags["kubeconfig_mode"] = m["mode"]
        self.flags["k3s_nvidia"] = bool(self.flags.get("toolkit"))  # found at start, if installed before
        return "[INFO]  systemd: Starting k3s\n", "", 0

    def _k_get_nodes(self, m):
        return self._needs("k3s", "kubeconfig") or ("NAME                STATUS   ROLES                  AGE   VERSION\n"
                                      f"node-serve-system   Ready    control-plane,master   1m    {K3S_VERSION}\n", "", 0)

    def _k_apply_cluster(self, m):
        missing = self._needs("k3s", "kubeconfig")
        if missing:
            return missing
        self.flags["k8s_cluster"] = True
        return "runtimeclass.node.k8s.io/nvidia created\ndaemonset.apps/nvidia-device-plugin created\n", "", 0

    def _k_plugin_rollout(self, m):
        missing = self._needs("k3s", "kubeconfig", "k8s_cluster")
        if missing:
            return missing
        if not self.flags.get("k3s_nvidia"):
            return "", "error: timed out waiting for the condition", 1
        self.flags["gpus_allocatable"] = True
        return 'daemon set "nvidia-device-plugin" successfully rolled out\n', "", 0

    def _k_allocatable(self, m):
        return self._needs("k3s", "kubeconfig") or (("2" if self.flags.get("gpus_allocatable") else ""), "", 0)

    def _k_import(self, m):
        missing = self._needs("docker", "k3s")
        if missing:
            return missing
        self.flags["k8s_images"] = m["images"].split()
        return "".join(f"unpacking docker.io/{i} ...done\n" for i in m["images"].split()), "", 0

    def _k_namespace(self, m):
        missing = self._needs("k3s", "kubeconfig")
        if missing:
            return missing
        self.flags["namespace"] = True
        return "namespace/servelab created\n", "", 0

    def _k_secret(self, m):
        missing = self._needs("k3s", "kubeconfig", "namespace")
        if missing:
            return missing
        env = _node_path(self.home, "~/" + m["path"])
        if not env.is_file():
            return "", f"error: open {m['path']}: no such file or directory", 1
        keys = dict(line.split("=", 1) for line in env.read_text().splitlines() if "=" in line)
        if not keys.get("TRITON_ADMIN_KEY"):
            return "", "fake node: docker/.env has no TRITON_ADMIN_KEY", 1
        self.flags["secret"] = True
        return "secret/servelab-secrets created\n", "", 0

    def _k_apply_lab(self, m):
        missing = self._needs("k3s", "kubeconfig")
        if missing:
            return missing
        if not _node_path(self.home, m["path"] + "/kustomization.yaml").is_file():
            return "", f"error: unable to find one of 'kustomization.yaml' in directory '{m['path']}'", 1
        self.flags["namespace"] = self.flags["k8s_applied"] = True
        return "deployment.apps/triton-server created\nhorizontalpodautoscaler.autoscaling/triton-server created\n", "", 0

    def _k_rollout(self, m):
        missing = self._needs("k3s", "kubeconfig", "k8s_applied")
        if missing:
            return missing
        why = ("secret servelab-secrets not found" if not self.flags.get("secret") else
               "ErrImageNeverPull: servelab/triton:24.10" if "servelab/triton:24.10" not in self.flags.get("k8s_images", [])
               else "0/1 nodes are available: 1 Insufficient nvidia.com/gpu" if not self.flags.get("gpus_allocatable")
               else None)
        if why:
            return "Waiting for deployment \"triton-server\" rollout to finish: 0 of 1 updated replicas are available...\n", \
                f"error: timed out waiting for the condition ({why})", 1
        self.flags["k8s_ready"] = True
        return 'deployment "triton-server" successfully rolled out\n', "", 0

    def _k_ready(self, out):
        def handler(self, m):
            return self._needs("k3s", "kubeconfig", "k8s_applied", "k8s_ready") or (out, "", 0)
        return handler

    def _k_teardown(self, names, out, needs=("k3s", "kubeconfig")):
        def handler(self, m):
            missing = self._needs(*needs)
            if missing:
                return missing
            for n in names.split():
                self.flags.pop(n, None)
            return out, "", 0
        return handler

    def _k_bench(self, m):
        missing = self._needs("docker", "k8s_ready")
        if missing:
            return missing
        return "rate 10/s: 100 sent, 100 ok\n", "", 0

    def _k_target(self, m):
        if not self.flags.get("k3s"):
            return "", "error: kubectl: No such file or directory", 1
        return self._needs("kubeconfig", "k8s_ready") or (
            "S(1) = 4000 us; target 2484 us of queue per request\nhpa/triton-server patched\n", "", 0)

    def _k_copy_kubeconfig(self, m):
        if not self.flags.get("k3s"):
            return "", "install: cannot stat '/etc/rancher/k3s/k3s.yaml': No such file or directory", 1
        target = _node_path(self.home, "~/.kube/config")
        if not target.parent.is_dir():
            return "", "install: cannot create regular file '/home/cc/.kube/config': No such file or directory", 1
        target.write_text("apiVersion: v1\nkind: Config\n# the cluster's admin credentials\n")
        target.chmod(int(m["mode"], 8))
        return "", "", 0

    def _bashrc_append(self, m):
        rc = _node_path(self.home, "~/.bashrc")
        rc.write_text((rc.read_text() if rc.is_file() else "") + m["line"] + "\n")
        return "", "", 0

    def _bashrc_delete(self, m):
        rc = _node_path(self.home, "~/.bashrc")
        if rc.is_file():
            rc.write_text("".join(ln + "\n" for ln in rc.read_text().splitlines()
                                  if ln != "export KUBECONFIG=$HOME/.kube/config"))
        return "", "", 0

    def _k_tls(self, m):
        if not self.flags.get("k3s"):
            return "", "error: kubectl: No such file or directory", 1
        missing = self._needs("kubeconfig", "k8s_applied")
        if missing:
            return "", 'error: kubectl patch apiservice v1beta1.custom.metrics.k8s.io: Error from server (NotFound)', 1
        self.flags["adapter_tls"] = True
        return ("secret/prometheus-adapter-tls: a certificate for prometheus-adapter.servelab.svc; "
                "apiservice/v1beta1.custom.metrics.k8s.io: caBundle set\n"), "", 0

    def _k_adapter_rollout(self, m):
        missing = self._needs("k3s", "kubeconfig", "k8s_applied")
        if missing:
            return missing
        if not self.flags.get("adapter_tls"):
            return "", 'error: timed out waiting for the condition (secret "prometheus-adapter-tls" not found)', 1
        return 'deployment "prometheus-adapter" successfully rolled out\n', "", 0

    def _k_metric(self, m):
        missing = self._needs("k3s", "kubeconfig", "k8s_applied", "k8s_ready")
        if missing:
            return missing
        if not self.flags.get("adapter_tls"):  # no caBundle: the API server does not trust the adapter
            return "", "Error from server (ServiceUnavailable): the server is currently unable to handle the request", 1
        return '{"kind":"MetricValueList","items":[{"value":"0"}]}\n', "", 0

    RULES = []  # filled below


def _tracked(root: Path) -> list[str]:
    import subprocess

    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True).stdout
    return [n for n in out.decode().split("\0") if n and (root / n).is_file()]


_P = r"(?P<path>[~\w/.\-]+)"
FakeNode.RULES = [(__import__("re").compile(pattern), handler) for pattern, handler in [
    (r"test -d " + _P + r" \|\| (?P<rest>.+)", FakeNode._test_d_or),
    (r"git ls-remote (?:--\S+ |-q )*(?P<url>\S+)(?: HEAD)?(?: >/dev/null)?", FakeNode._ls_remote),
    (r"git clone (?:--\S+ )*(?P<url>\S+) (?P<dest>\S+)", FakeNode._clone),
    (r"mkdir -p (?P<paths>[~\w/.\- ]+)", FakeNode._mkdir),
    (r"tar (?P<skip>--skip-old-files )?-xzf (?P<archive>\S+)(?: -C (?P<dest>\S+))?", FakeNode._untar),
    (r"tar -czf (?P<archive>\S+) -C (?P<base>\S+) (?P<names>[\w.\- ]+)", FakeNode._tar_create),
    (r"rm (?P<force>-f )?(?P<paths>[~\w/.\- ]+)", FakeNode._rm),
    (r"ls " + _P, FakeNode._ls),
    (r"curl -sSL https://get\.docker\.com/? \| sudo sh", FakeNode._flag(None, "docker", "Client: Docker Engine\n")),
    (r"sudo groupadd -f docker; sudo usermod -aG docker \$USER", FakeNode._ok),
    (r"docker compose version", FakeNode._compose_version),
    (r"curl -fsSL https://nvidia\.github\.io/libnvidia-container/gpgkey \| sudo gpg --batch --yes --dearmor "
     r"-o /usr/share/keyrings/nvidia-container-toolkit-keyring\.gpg", FakeNode._ok),
    (r"curl -fsSL https://nvidia\.github\.io/libnvidia-container/stable/deb/nvidia-container-toolkit\.list \| "
     r"sed .+ \| sudo tee /etc/apt/sources\.list\.d/nvidia-container-toolkit\.list", FakeNode._ok),
    (r"sudo apt-get update -q && sudo apt-get install -y -q nvidia-container-toolkit jq",
     FakeNode._flag(None, "toolkit jq", "Setting up nvidia-container-toolkit ...\n")),
    (r"sudo nvidia-ctk runtime configure --runtime=docker", FakeNode._toolkit_configure),
    (r"jq '\. \+ \{\"exec-opts\": \[\"native\.cgroupdriver=cgroupfs\"\]\}' /etc/docker/daemon\.json "
     r"> /tmp/daemon\.json && sudo mv /tmp/daemon\.json /etc/docker/daemon\.json && sudo systemctl restart docker",
     FakeNode._cgroupfs),
    (r"docker info --format '\{\{\.CgroupDriver\}\}'", FakeNode._cgroup_driver),
    (r"nohup sh (?P<script>~/[\w.\-]+/docker/prepare-node\.sh) > ~/prepare-node\.log 2>&1 < /dev/null &",
     FakeNode._prepare),
    (r"echo (?P<text>[\w:.\-]+) > (?P<path>~/[\w.\-/]+)", FakeNode._echo_to),
    (r"sudo apt-get install -y -q nvtop", FakeNode._flag(None, "nvtop")),
    (r"nvidia-smi --query-gpu=index,name,memory\.total,driver_version --format=csv,noheader", FakeNode._smi_query),
    (r"docker run --rm --gpus all ubuntu:24\.04 nvidia-smi -L", FakeNode._docker_gpus),
    # notebook 6d: k3s (pinned), GPU support, images, the Secret from docker/.env, the manifests
    (r"cd ~/serve-system-chi", FakeNode._ok),
    (r"python3 -m servelab\.node\.leaseclock", FakeNode._ok),
    (r"python3 -m servelab\.node\.weights fetch", FakeNode._weights_fetch),
    (r"docker compose -f ~/serve-system-chi/docker/docker-compose-triton\.yaml (down|build)",
     lambda self, m: self._docker_needed() or ("", "", 0)),
    (r"curl -sfL https://get\.k3s\.io \| INSTALL_K3S_VERSION=(?P<version>\S+) K3S_KUBECONFIG_MODE=(?P<mode>\d+) "
     r"sh -s - --disable traefik", FakeNode._k3s_install),
    (r"sudo install -m (?P<mode>[0-7]{3}) -o \$\(id -u\) -g \$\(id -g\) /etc/rancher/k3s/k3s\.yaml ~/\.kube/config",
     FakeNode._k_copy_kubeconfig),
    (r"echo '(?P<line>export KUBECONFIG=\$HOME/\.kube/config)' >> ~/\.bashrc", FakeNode._bashrc_append),
    (r"export KUBECONFIG=\$HOME/\.kube/config", FakeNode._flag(None, "kubeconfig_env")),
    (r"sed -i '/\^export KUBECONFIG=\\\$HOME\\/\\\.kube\\/config\$/d' ~/\.bashrc", FakeNode._bashrc_delete),
    (r"kubectl get nodes", FakeNode._k_get_nodes),
    (r"kubectl apply -k ~/serve-system-chi/k8s/cluster", FakeNode._k_apply_cluster),
    (r"kubectl -n kube-system rollout status daemonset/nvidia-device-plugin --timeout=\d+m", FakeNode._k_plugin_rollout),
    (r"kubectl get nodes -o jsonpath='\{\.items\[0\]\.status\.allocatable\.nvidia\\\.com/gpu\}'", FakeNode._k_allocatable),
    (r"docker save (?P<images>(?:servelab/[\w.:\-]+ ?)+) \| sudo k3s ctr images import -", FakeNode._k_import),
    (r"kubectl create namespace servelab", FakeNode._k_namespace),
    (r"kubectl -n servelab create secret generic servelab-secrets --from-env-file=\$HOME/(?P<path>[\w.\-/]+)",
     FakeNode._k_secret),
    (r"kubectl kustomize --load-restrictor LoadRestrictionsNone (?P<path>~/[\w.\-/]+) \| kubectl apply -f -",
     FakeNode._k_apply_lab),
    (r"kubectl -n servelab rollout status deployment/triton-server --timeout=\d+m", FakeNode._k_rollout),
    (r"kubectl -n servelab get pods -o wide", FakeNode._k_ready(None, "triton-server-1   1/1   Running\n")),
    (r"python3 -m servelab\.node\.kube tls", FakeNode._k_tls),
    (r"kubectl -n servelab rollout status deployment/prometheus-adapter --timeout=\d+m", FakeNode._k_adapter_rollout),
    (r"kubectl get --raw /apis/custom\.metrics\.k8s\.io/v1beta1/namespaces/servelab/services/triton-server/"
     r"servelab_queue_us_per_request", FakeNode._k_metric),
    (r"TRITON=\$\(kubectl -n servelab get svc triton-server -o jsonpath='\{\.spec\.clusterIP\}'\)",
     FakeNode._k_ready(None, "")),
    (r"docker run --rm --network host -v ~/serve-system-chi:/kit -w /kit -e PYTHONPATH=/kit "
     r"servelab/jupyter-sdk:24\.10 python3 -m servelab bench triton \$TRITON:8000 -m food_classifier_onnx "
     r"--rate [\d,]+(?: --distribution poisson)? -d \d+", FakeNode._k_bench),
    (r"python3 -m servelab\.node\.kube target", FakeNode._k_target),
    (r"python3 -m servelab\.node\.kube watch --minutes \d+",
     FakeNode._k_ready(None, "time     servelab_queue_us_per_request  target replicas computed\n")),
    (r"kubectl -n servelab get hpa triton-server -w",
     FakeNode._k_ready(None, "NAME            REFERENCE                  TARGETS   MINPODS   MAXPODS   REPLICAS\n")),
    (r"kubectl delete namespace servelab", FakeNode._k_teardown(None, "namespace k8s_applied k8s_ready secret adapter_tls",
                                                               'namespace "servelab" deleted\n')),
    (r"kubectl delete -k ~/serve-system-chi/k8s/cluster", FakeNode._k_teardown(None, "k8s_cluster gpus_allocatable", "")),
    (r"/usr/local/bin/k3s-uninstall\.sh", FakeNode._k_teardown(None, "k3s k3s_nvidia k8s_images kubeconfig_mode", "",
                                                                needs=("k3s",))),  # root's, through sudo
]]


# --------------------------------------------------------------------------
# Installing the fake


def fake_can_connect_to_port(cloud: Cloud):
    def _can_connect_to_port(self, host, port, timeout):
        return _reachable(cloud.load(), host, port)

    return _can_connect_to_port


def fake_list_sites(show=None):
    if show is not None:
        raise AssertionError("the fake only serves list_sites() as use_site() calls it")
    return {k: dict(v) for k, v in SITES.items()}


def fake_list_projects(show=None):
    if show == "text":
        print(PROJECT_NAME)
        return None
    return [PROJECT_NAME]


def _guard_network():
    """Refuse any non-loopback connection, so an unfaked client fails loudly."""
    real_connect = socket.socket.connect

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and not (host.startswith("127.") or host in ("localhost", "::1")) \
                and self.family in (socket.AF_INET, socket.AF_INET6):
            raise ConnectionRefusedError(f"fake_chameleon: network access to {address} blocked (unfaked client?)")
        return real_connect(self, address)

    socket.socket.connect = connect


def install(state_path: str | os.PathLike, repo_root: str | os.PathLike | None = None):
    """Patch python-chi's client seam; return the started patchers."""
    import chi.context
    import chi.image
    import chi.lease
    import chi.network
    import chi.server  # noqa: F401

    cloud = Cloud(state_path)
    repo_root = Path(repo_root) if repo_root else Path(__file__).resolve().parents[2]
    patchers = [
        mock.patch("chi.lease.blazar", lambda session=None: FakeBlazar(cloud)),
        mock.patch("chi.lease.connection", lambda session=None: FakeConnection(cloud)),
        mock.patch("chi.server.nova", lambda session=None: FakeNova(cloud)),
        mock.patch("chi.server.connection", lambda session=None: FakeConnection(cloud)),
        mock.patch("chi.server.session", lambda: FakeSession()),
        mock.patch("chi.image.glance", lambda session=None: FakeGlance(cloud)),
        mock.patch("chi.network.neutron", lambda session=None: FakeNeutron(cloud)),
        mock.patch("chi.server.Connection", make_fabric_connection(cloud, repo_root)),
        mock.patch("chi.server.Server._can_connect_to_port", fake_can_connect_to_port(cloud)),
        mock.patch("chi.context.list_sites", fake_list_sites),
        mock.patch("chi.context.list_projects", fake_list_projects),
    ]
    for p in patchers:
        p.start()
    return patchers


def install_from_env() -> None:
    """Entry point for the kernel start-up file."""
    _guard_network()
    install(os.environ[STATE_ENV])


if __name__ == "__main__":  # pragma: no cover
    sys.exit("import this module; see the module docstring")
