"""The provisioning notebooks (1_create_lease, 2_create_server_nvidia,
7_delete_resources) run end to end in a real kernel with the real python-chi
1.2.10, against a fake Chameleon site at python-chi's client seam
(fake_chameleon.py, injected by an IPython start-up file: the notebooks carry
no test code). The fake is strict: a command the node is not known to run
fails, a git URL is unreachable unless a test says otherwise, a lease with a
later start stays PENDING. Then: the calls made, the kit uploaded and unpacked
with no repository URL, work copied back before deletion, idempotent re-runs,
the future-start and unreachable-URL paths, and a static check that every
python-chi call in every notebook binds to the installed API."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import subprocess
import sys
import tarfile
import typing
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbclient
import nbformat
import pytest

from servelab.course import lessons, nbexec
from servelab.node import chameleon
from tests.tiers import tier

from .nbkit import (
    NOTEBOOKS_DIR,
    REPO_ROOT,
    base_kernel_env,
    notebook_text,
    run_notebook,
)

# Not quiet: nothing here is timed. (In one run, 2026-11-26, a notebook run here took 310 s instead
# of about 11 beside another test, while pytest-xdist still split this file over two workers; the
# file now stays on one worker, and it has run beside other tests since.)

HERE = Path(__file__).resolve().parent
USER = "student1"
OTHER_USER = "student2"
CHI_NOTEBOOKS = tuple(lessons.slugs("chameleon"))


def _load_fake():
    spec = importlib.util.spec_from_file_location("fake_chameleon", HERE / "fake_chameleon.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fake = _load_fake()

STARTUP = """\
import importlib.util as _ilu, sys as _sys
_spec = _ilu.spec_from_file_location("fake_chameleon", {path!r})
_mod = _ilu.module_from_spec(_spec)
_sys.modules["fake_chameleon"] = _mod
_spec.loader.exec_module(_mod)
_mod.install_from_env()
del _ilu, _sys, _spec, _mod
"""


def _make_site(tmp, **extra_env):
    ipython_dir = tmp / "ipython"
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-fake-chameleon.py").write_text(STARTUP.format(path=str(HERE / "fake_chameleon.py")))
    ssh = tmp / "ssh"
    ssh.mkdir()
    # A syntactically valid public key (python-chi fingerprints it).
    (ssh / "id_rsa.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHl0ZXN0a2V5Zm9yc2VydmVsYWJub3RlYm9va3M= student1\n")
    (ssh / "id_rsa").write_text("not used by the fake\n")
    home = tmp / "home"  # the Chameleon Jupyter user's home: notebook 7 saves work under home/work
    home.mkdir()
    cloud = fake.Cloud(tmp / "cloud.json")
    env = base_kernel_env(
        IPYTHONDIR=str(ipython_dir), USER=USER, HOME=str(home),
        OS_KEYPAIR_PUBLIC_KEY=str(ssh / "id_rsa.pub"), OS_KEYPAIR_PRIVATE_KEY=str(ssh / "id_rsa"),
        **{fake.STATE_ENV: str(cloud.path)}, **extra_env,
    )
    env.pop("KIT_REPO_URL", None)
    env.update(extra_env)
    return {"cloud": cloud, "env": env, "home": home, "runs": {}}


@pytest.fixture(scope="module")
@tier("e2e")   # the tests that use it execute notebooks
def site(tmp_path_factory):
    """A fake site with an expired lease of ours and an active lease of a classmate; no KIT_REPO_URL."""
    site = _make_site(tmp_path_factory.mktemp("chameleon"))
    cloud = site["cloud"]
    site["expired"] = cloud.seed_lease(chameleon.lease_name(USER), "TERMINATED", hours_ago=30)
    site["classmate"] = cloud.seed_lease(chameleon.lease_name(OTHER_USER), "ACTIVE", user_id="another-user")
    return site


def _calls(state, client=None, method=None):
    return [c for c in state["calls"]
            if (client is None or c["client"] == client) and (method is None or c["method"] == method)]


def _run(site, name):
    nb = run_notebook(name, site["env"])
    site["runs"].setdefault(name, []).append(nb)
    return nb


# --------------------------------------------------------------------------
# End to end, in lab order. The tests depend on each other's effects on the
# fake site and run in file order.


def test_1_create_lease_reserves_one_gpu_p100_for_3_hours(site):
    before = datetime.now(timezone.utc).replace(tzinfo=None)
    nb = _run(site, "1_create_lease")
    state = site["cloud"].load()

    creates = _calls(state, "blazar", "lease.create")
    assert len(creates) == 1
    kw = creates[0]["kwargs"]
    assert kw["name"] == f"serve-system-{USER}"
    (reservation,) = kw["reservations"]
    assert reservation["resource_type"] == "physical:host"
    assert json.loads(reservation["resource_properties"]) == ["==", "$node_type", "gpu_p100"]
    assert int(reservation["min"]) == int(reservation["max"]) == 1
    assert kw["start"] == "now"
    end = datetime.strptime(kw["end"], "%Y-%m-%d %H:%M")
    assert timedelta(hours=2, minutes=58) <= end - before <= timedelta(hours=3, minutes=1)

    # The expired lease with our name was removed; the classmate's lease was not touched.
    assert site["expired"]["id"] not in state["leases"]
    assert [c["args"] for c in _calls(state, "blazar", "lease.delete")] == [[site["expired"]["id"]]]
    assert site["classmate"]["id"] in state["leases"]

    mine = [x for x in state["leases"].values() if x["name"] == f"serve-system-{USER}"]
    assert len(mine) == 1 and mine[0]["status"] == "ACTIVE"
    text = notebook_text(nb)
    assert "Your node is reserved" in text
    assert "python-chi 1.2.10" in text and "expects" not in text


def test_1_create_lease_is_idempotent(site):
    state_before = site["cloud"].load()
    nb = _run(site, "1_create_lease")
    state = site["cloud"].load()
    assert len(_calls(state, "blazar", "lease.create")) == 1, "a second run must reuse the lease"
    assert state["leases"].keys() == state_before["leases"].keys()
    assert "Found existing lease" in notebook_text(nb)


def test_2_create_server_on_the_reservation_with_the_cuda_image(site):
    nb = _run(site, "2_create_server_nvidia")
    state = site["cloud"].load()
    lease = next(x for x in state["leases"].values() if x["name"] == f"serve-system-{USER}")
    node_reservation = next(r for r in lease["reservations"] if r["resource_type"] == "physical:host")

    (create,) = _calls(state, "sdk", "compute.create_server")
    kw = create["kwargs"]
    assert kw["name"] == f"node-serve-system-{USER}"
    assert kw["scheduler_hints"] == {"reservation": node_reservation["id"]}
    cuda = next(i for i in fake.IMAGES if i["name"] == "CC-Ubuntu24.04-CUDA")
    assert kw["imageRef"] == cuda["id"]
    assert kw["key_name"] == f"{USER}-jupyter"

    # One floating IP, allocated and associated with the server's port.
    (server,) = state["servers"].values()
    (fip,) = state["floatingips"].values()
    assert server["status"] == "ACTIVE"
    assert fip["port_id"] == next(p["id"] for p in state["ports"].values() if p["device_id"] == server["id"])
    assert len(_calls(state, "neutron", "create_floatingip")) == 1
    assert [c["args"][0] for c in _calls(state, "sdk", "network.update_ip")] == [fip["id"]]

    # Every command ran over SSH as cc, and succeeded on the strict fake node.
    assert all(c["host"] == fip["floating_ip_address"] and c["user"] == "cc" for c in state["ssh"])
    assert [c["command"] for c in state["ssh"] if c["exited"] != 0] == []
    text = notebook_text(nb)
    assert "OK: both Tesla P100 GPUs are visible." in text
    assert "containers see 2 GPUs" in text
    assert f"ssh -i {site['env']['OS_KEYPAIR_PRIVATE_KEY']} cc@{fip['floating_ip_address']}" in text
    assert "server status: ACTIVE" in text and "is in ERROR" not in text
    assert "Connection successful" in text


def test_2_uploads_and_unpacks_the_kit_without_a_repository_url(site):
    state = site["cloud"].load()
    assert state["cloned"] == [] and not any("git " in c["command"] for c in state["ssh"])
    (upload,) = state["uploads"]
    assert upload["remote"] == f"/home/cc/{chameleon.KIT_DIR}.tar.gz"
    assert state["unpacked"] == [{"archive": f"~/{chameleon.KIT_DIR}.tar.gz", "dest": "~"}]
    kit = site["cloud"].node_home / chameleon.KIT_DIR
    tracked = set(_git_ls_files())
    on_node = {p.relative_to(kit).as_posix() for p in kit.rglob("*") if p.is_file()}
    # besides the kit's files, only what notebook 2 writes there: the lease's end (never packed)
    assert on_node == tracked | {"lease-end.txt"}, (sorted(on_node - tracked)[:5], sorted(tracked - on_node)[:5])
    assert "lease-end.txt" not in tracked and chameleon._excluded("lease-end.txt")
    assert (kit / "docker" / "docker-compose-fastapi.yaml").read_bytes() == \
        (REPO_ROOT / "docker" / "docker-compose-fastapi.yaml").read_bytes()
    assert not (site["cloud"].node_home / f"{chameleon.KIT_DIR}.tar.gz").exists(), "the archive is removed"
    text = notebook_text(site["runs"]["2_create_server_nvidia"][-1])
    assert f"packed {len(tracked)} files" in text and "upload this copy" in text


def test_2_configures_docker_for_the_gpus_and_starts_the_pulls(site):
    state = site["cloud"].load()
    node = state["node"]
    assert node["docker"] and node["toolkit"] and node["nvidia_runtime"] and node["nvtop"]
    assert node["cgroupfs"], "daemon.json exec-opts native.cgroupdriver=cgroupfs (toolkit issue 48)"
    commands = [c["command"] for c in state["ssh"]]
    restart = next(i for i, c in enumerate(commands) if "cgroupdriver=cgroupfs" in c)
    prepare = next(i for i, c in enumerate(commands) if "prepare-node.sh" in c)
    assert restart < prepare, "pulls and builds start after Docker's last restart (a restart would abort them)"
    assert state["prepared"] == [f"~/{chameleon.KIT_DIR}/docker/prepare-node.sh"]
    # The background script pulls the pinned Triton images and builds what notebooks 3 and 5 start.
    script = (REPO_ROOT / "docker" / "prepare-node.sh").read_text()
    for needed in ("docker pull nvcr.io/nvidia/tritonserver:24.10-py3 ",
                   "docker pull nvcr.io/nvidia/tritonserver:24.10-py3-sdk ",
                   "docker-compose-models.yaml run --rm models", "docker-compose-fastapi.yaml build",
                   "docker-compose-triton.yaml build"):
        assert needed in script, needed
    assert script.index("docker-compose-fastapi.yaml build") < script.index("docker pull"), \
        "the FastAPI part, needed first, is built before the Triton downloads"
    assert "Docker's cgroup driver: cgroupfs (OK)" in notebook_text(site["runs"]["2_create_server_nvidia"][-1])


def test_2_create_server_is_idempotent(site):
    state_before = site["cloud"].load()
    kit = site["cloud"].node_home / chameleon.KIT_DIR
    work = kit / "notebooks" / "4_fastapi.ipynb"
    work.write_text("executed on the node")  # the student's work is never overwritten
    _run(site, "2_create_server_nvidia")
    state = site["cloud"].load()
    assert len(_calls(state, "sdk", "compute.create_server")) == 1, "a second run must reuse the server"
    assert len(_calls(state, "neutron", "create_floatingip")) == 1, "a second run must keep the same IP"
    assert state["floatingips"].keys() == state_before["floatingips"].keys()
    assert len(state["unpacked"]) == 2 and work.read_text() == "executed on the node"
    assert [c["command"] for c in state["ssh"] if c["exited"] != 0] == []


def test_7_copies_the_work_back_then_releases_everything(site):
    kit = site["cloud"].node_home / chameleon.KIT_DIR
    (kit / "results" / "20260101-120000").mkdir(parents=True)
    (kit / "results" / "20260101-120000" / "report.md").write_text("measured on 2x P100")
    state_before = site["cloud"].load()
    (fip_before,) = state_before["floatingips"].values()
    (server_before,) = state_before["servers"].values()
    nb = _run(site, "7_delete_resources")
    state = site["cloud"].load()

    # First the copy, over the server's SSH connection, into ~/work in Chameleon Jupyter.
    # (the fake serves `get` only while the server is ACTIVE: the copy came before the deletion)
    (download,) = state["downloads"]
    assert download["remote"] == "serve-system-saved.tar.gz"
    (saved,) = (site["home"] / "work" / "serve-system-saved").iterdir()
    assert (saved / "notebooks" / "4_fastapi.ipynb").read_text() == "executed on the node"
    assert (saved / "results" / "20260101-120000" / "report.md").read_text() == "measured on 2x P100"
    assert not (saved / "serve-system-saved.tar.gz").exists()

    assert [c["args"] for c in _calls(state, "nova", "servers.delete")] == [[server_before["id"]]]
    assert state["servers"] == {}
    # Released through Neutron's floating IP API, not python-chi's raw delete.
    assert [c["args"] for c in _calls(state, "neutron", "delete_floatingip")] == [[fip_before["id"]]]
    assert _calls(state, "sdk", "network.delete") == []
    assert state["floatingips"] == {}
    # Our lease is gone; the classmate's stays.
    assert [x["name"] for x in state["leases"].values()] == [f"serve-system-{OTHER_USER}"]
    text = notebook_text(nb)
    assert "saved " in text and str(saved) in text
    assert f"released floating IP {fip_before['floating_ip_address']}" in text
    assert "server left: False" in text and "leases left: []" in text


def test_7_delete_resources_twice_is_harmless(site):
    nb = _run(site, "7_delete_resources")
    text = notebook_text(nb)
    assert f"no server named node-serve-system-{USER} - nothing to copy" in text
    assert f"no server named node-serve-system-{USER}" in text
    assert f"no lease named serve-system-{USER}" in text
    state = site["cloud"].load()
    assert [x["name"] for x in state["leases"].values()] == [f"serve-system-{OTHER_USER}"]
    assert len(state["downloads"]) == 1


def _git_ls_files():
    out = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    return [n for n in out.decode().split("\0") if n and (REPO_ROOT / n).is_file()]


def _run_edited(site, name, old, new):
    """Run a notebook after one edit a student makes to a cell (``old`` -> ``new``)."""
    nb = nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and old in c.source]
    assert len(cells) == 1, f"{old!r} is not in exactly one code cell of {name}"
    cells[0].source = cells[0].source.replace(old, new)
    client = nbexec.NotebookClient(nb, kernel_name="python3", timeout=300, allow_errors=False,
                                     resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
    client.execute(env=site["env"])
    return nb


@pytest.mark.e2e   # executes notebooks
def test_2_without_a_lease_says_to_create_one(tmp_path):
    """python-chi 1.2's get_lease raises CHIValueError for a name no lease has (it never returns
    None): notebook 2 turns that into the kit's one clear line."""
    site = _make_site(tmp_path)
    with pytest.raises(nbclient.exceptions.CellExecutionError) as err:
        _run(site, "2_create_server_nvidia")
    assert f"No lease named {chameleon.lease_name(USER)}: create it with 1_create_lease first." in str(err.value)
    assert not site["cloud"].load()["servers"]


@pytest.mark.e2e   # executes notebooks
def test_1_a_later_start_is_submitted_pending_without_waiting(tmp_path):
    site = _make_site(tmp_path)
    start = (datetime.now(timezone.utc) + timedelta(days=2)).replace(minute=0, second=0, microsecond=0,
                                                                      tzinfo=None)
    began = datetime.now()
    nb = _run_edited(site, "1_create_lease", "START = None",
                     f"START = datetime({start.year}, {start.month}, {start.day}, {start.hour}, 0)")
    assert (datetime.now() - began).total_seconds() < 120, "a later lease must not wait for its start"
    state = site["cloud"].load()
    (create,) = _calls(state, "blazar", "lease.create")
    assert create["kwargs"]["start"] == start.strftime("%Y-%m-%d %H:%M")
    # ends 5 minutes before the hour (the earlier lab's rule against back-to-back leases colliding)
    end = start + timedelta(hours=chameleon.LEASE_HOURS, minutes=-5)
    assert create["kwargs"]["end"] == end.strftime("%Y-%m-%d %H:%M") and end.minute == 55
    (mine,) = state["leases"].values()
    assert mine["status"] == "PENDING", "the fake keeps a lease PENDING until its start"
    text = notebook_text(nb)
    assert f"Your node is reserved from {start:%Y-%m-%d %H:%M} UTC" in text
    # The example the notebook prints is a later time, computed, not a date in the past.
    example = next(line for line in text.splitlines() if line.startswith("example of a later start"))
    shown = eval(example.split("START =", 1)[1].strip(), {"datetime": datetime})
    assert shown > datetime.now(timezone.utc).replace(tzinfo=None)

    # Notebook 2 before the start: a clear message, no server.
    with pytest.raises(nbclient.exceptions.CellExecutionError) as err:
        run_notebook("2_create_server_nvidia", site["env"])
    assert "Your lease is PENDING: it starts at" in str(err.value)
    assert site["cloud"].load()["servers"] == {}


@pytest.mark.e2e   # executes notebooks
def test_2_unreachable_repository_url_fails_clearly_then_a_reachable_one_clones(tmp_path):
    url = "https://git.example.invalid/nobody/serve-system-chi.git"
    site = _make_site(tmp_path, KIT_REPO_URL=url)
    site["cloud"].seed_lease(chameleon.lease_name(USER), "ACTIVE")
    with pytest.raises(nbclient.exceptions.CellExecutionError) as err:
        run_notebook("2_create_server_nvidia", site["env"])
    message = str(err.value)
    assert f"KIT_REPO_URL={url!r} cannot be reached from node-serve-system-{USER}" in message
    assert "git ls-remote" in message  # the failing cell is the first one that uses the URL
    state = site["cloud"].load()
    assert state["cloned"] == [] and state["uploads"] == []
    failed = [c for c in state["ssh"] if c["exited"] != 0]
    assert [c["command"] for c in failed] == [f"git ls-remote -q {url} HEAD >/dev/null"]

    site["cloud"].add_reachable_repo(url)
    run_notebook("2_create_server_nvidia", site["env"])
    state = site["cloud"].load()
    assert state["cloned"] == [{"url": url, "dest": f"~/{chameleon.KIT_DIR}"}] and state["uploads"] == []
    assert (site["cloud"].node_home / chameleon.KIT_DIR / "docker" / "docker-compose-triton.yaml").is_file()


def _lease_end(state: dict, lease_id: str) -> datetime:
    return datetime.strptime(state["leases"][lease_id]["end_date"], "%Y-%m-%dT%H:%M:%S.%f")


def _minutes_to(end: datetime) -> float:
    return (end - datetime.now(timezone.utc).replace(tzinfo=None)).total_seconds() / 60


def _node_clock(site) -> str:
    """`cd ~/serve-system-chi && python3 -m servelab.node.leaseclock` on the node: the node's own copy of the kit,
    standard library only (-S: no site-packages)."""
    kit = site["cloud"].node_home / chameleon.KIT_DIR
    env = {k: v for k, v in site["env"].items() if k not in ("PYTHONPATH", "SERVELAB_ROOT")}
    out = subprocess.run([sys.executable, "-S", "-m", "servelab.node.leaseclock"], cwd=kit, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.e2e   # executes notebooks
def test_timeline_error_server_then_a_lease_about_to_end(tmp_path):
    """Notebooks 1 -> 2 -> 7 on the strict fake, along the usual faults: the first bare-metal deploy ends in
    ERROR (notebook 2 deletes only the server and starts it again); the lease clock on the node; the lease
    about to end, an extension the site refuses (the node is reserved next), then one it grants."""
    site = _make_site(tmp_path)
    cloud = site["cloud"]
    _run(site, "1_create_lease")
    cloud.fail_next_deploys(1)
    nb2 = _run(site, "2_create_server_nvidia")
    state = cloud.load()
    text = notebook_text(nb2)
    print("\n--- notebook 2, the ERROR path ---")
    print("\n".join(line for line in text.splitlines()
                    if "ERROR" in line or line.startswith(("server status", "lease ends"))))

    creates = _calls(state, "sdk", "compute.create_server")
    deletes = _calls(state, "nova", "servers.delete")
    assert len(creates) == 2 and len(deletes) == 1, "one failed deploy: delete it, create once more"
    first_id = deletes[0]["args"][0]
    (server,) = state["servers"].values()
    assert server["id"] != first_id and server["status"] == "ACTIVE"
    order = [c["method"] for c in state["calls"] if c["method"] in ("compute.create_server", "servers.delete")]
    assert order == ["compute.create_server", "servers.delete", "compute.create_server"]
    assert f"node-serve-system-{USER} is in ERROR: deleting only the server" in text
    assert "server status: ACTIVE" in text
    # Only the server went: the lease is the same, one floating IP, never a raw network delete.
    (mine,) = [x for x in state["leases"].values() if x["name"] == f"serve-system-{USER}"]
    assert mine["status"] == "ACTIVE" and _calls(state, "blazar", "lease.delete") == []
    assert len(state["floatingips"]) == 1 and _calls(state, "sdk", "network.delete") == []
    assert [c["command"] for c in state["ssh"] if c["exited"] != 0] == []

    # The lease clock where the student works: the end time on the node, read with the node's python3.
    kit = cloud.node_home / chameleon.KIT_DIR
    end = datetime.strptime(mine["end_date"], "%Y-%m-%dT%H:%M:%S.%f")
    assert (kit / "lease-end.txt").read_text() == f"{end:%Y-%m-%dT%H:%M:%S}Z\n"
    clock = _node_clock(site)
    print("--- lease clock on the node, after notebook 2 ---\n" + clock)
    assert clock.startswith("lease clock: ") and f"the lease ends at {end:%H:%M} UTC" in clock
    left = int(clock.split("lease clock: ")[1].split()[0])
    assert 175 <= left <= 180
    assert "minutes left" in text

    # The lease about to end; the node is reserved by someone else 40 minutes from now.
    cloud.shorten_lease(chameleon.lease_name(USER), 20)
    cloud.reserve_node_from(datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(minutes=40))
    refused = _run_edited(site, "2_create_server_nvidia", 'EXTEND_BY = None', 'EXTEND_BY = "1h"')
    refused_text = notebook_text(refused)
    clock = _node_clock(site)
    print("--- extension refused; the clock on the node ---")
    print(next(line for line in refused_text.splitlines() if line.startswith("Chameleon did not extend")))
    print(clock)
    assert "Chameleon did not extend the lease: Not enough hosts available" in refused_text
    assert clock.startswith("⚠ lease clock: ") and "Save your work now" in clock
    # what is left when the clock was read (re-running notebook 2 took 5 minutes on a busy CI machine)
    short_end = _lease_end(cloud.load(), mine["id"])
    left = int(clock.split("lease clock: ")[1].split()[0])
    assert left <= 20 and abs(left - _minutes_to(short_end)) <= 1.5, (left, short_end)

    # The node is free after all: the extension is granted and the clock follows.
    with cloud.state() as st:
        st["node_reserved_from"] = None
    granted = _run_edited(site, "2_create_server_nvidia", 'EXTEND_BY = None', 'EXTEND_BY = "1h"')
    assert "extended by 1h" in notebook_text(granted)
    clock = _node_clock(site)
    print("--- extension granted; the clock on the node ---\n" + clock)
    left = int(clock.split("lease clock: ")[1].split()[0])
    assert _lease_end(cloud.load(), mine["id"]) == short_end + timedelta(hours=1)
    assert clock.startswith("lease clock: ") and abs(left - _minutes_to(short_end + timedelta(hours=1))) <= 1.5
    state = cloud.load()
    assert [c["kwargs"]["prolong_for"] for c in _calls(state, "blazar", "lease.update")] == ["1h", "1h"]
    assert len(_calls(state, "sdk", "compute.create_server")) == 2, "re-runs reuse the server"

    nb7 = _run(site, "7_delete_resources")
    state = cloud.load()
    assert state["servers"] == {} and state["floatingips"] == {} and state["leases"] == {}
    assert "server left: False" in notebook_text(nb7)


@pytest.mark.e2e   # executes notebooks
def test_2_trained_weights_on_the_node_three_cases(tmp_path, built_models):
    """Notebook 2 downloads the trained model on the strict fake node, which serves a stand-in file (a pickled
    11-class MobileNetV2) with the git blob id this test records for it: a failed download, then an id that is
    not the file's (the real file's id), then the file's own id. After each, the node's models build (the
    models container's command, `build --prefer-weights build/trained/food11.pth`) on what was kept."""
    import torch

    from servelab.serve import models

    site = _make_site(tmp_path)
    cloud = site["cloud"]
    cloud.seed_lease(chameleon.lease_name(USER), "ACTIVE")
    standin = tmp_path / "standin-food11.pth"
    torch.manual_seed(0)
    torch.save(models.new_mobilenet_v2().eval(), standin)
    own_id = subprocess.run(["git", "hash-object", "--no-filters", str(standin)], capture_output=True, text=True,
                            check=True).stdout.strip()
    kept = cloud.node_home / chameleon.KIT_DIR / "build" / "trained" / "food11.pth"
    from servelab.node import weights

    cases = [("the download fails", None, None), ("the id differs", standin, weights.RECORDED_BLOB),
             ("the id matches", standin, own_id)]
    kinds = []
    for case, served, blob in cases:
        cloud.serve_trained_weights(served, blob)
        text = notebook_text(_run(site, "2_create_server_nvidia"))
        (line,) = [x for x in text.splitlines() if x.startswith("trained weights")]
        build_lines = []
        out_dir = tmp_path / "trained-build" if kept.exists() else None  # demo: the session's build, current
        res = models.build_preferring(kept, out_dir=out_dir, place=False, log=build_lines.append)
        kinds.append(res.weights_kind)
        print(f"\n--- {case} ---\nnode:   {line}\nmodels: "
              + next(x for x in build_lines if x.startswith(("trained weights", "built ", "artifacts are"))))
        if served is None:
            assert "not downloaded (URLError" in line and line.endswith("the models build uses the demo weights")
        elif blob != own_id:
            assert line.startswith(f"trained weights refused: the download's git blob is {own_id[:12]}, not the "
                                   f"recorded {blob[:12]}") and line.endswith("the models build uses the demo weights")
        else:
            assert line.startswith("trained weights: downloaded build/trained/food11.pth") and "as recorded" in line
            assert kept.read_bytes() == standin.read_bytes()
        assert kept.exists() == (blob == own_id)
    assert kinds == ["demo", "demo", "trained"]
    state = cloud.load()
    assert [f["exited"] for f in state["weights_fetches"]] == [0, 0, 0]
    assert [c["command"] for c in state["ssh"] if c["exited"] != 0] == []
    # the download comes before the background builds start (their models step reads the file)
    commands = [c["command"] for c in state["ssh"]]
    assert commands.index(f"cd ~/{chameleon.KIT_DIR} && python3 -m servelab.node.weights fetch") < \
        next(i for i, c in enumerate(commands) if "prepare-node.sh" in c)


def test_the_lease_clock_without_a_lease_passes(tmp_path):
    """Locally (no lease-end.txt) the clock says so and returns None; a bad file is a clear error."""
    from servelab.node import leaseclock

    text, left = leaseclock.message(tmp_path)
    assert left is None and "no lease recorded here" in text
    now = datetime(2026, 11, 26, 8, 0, tzinfo=timezone.utc)
    (tmp_path / leaseclock.LEASE_END_FILE).write_text("2026-11-26T08:29:00Z\n")
    text, left = leaseclock.message(tmp_path, now)
    assert left == 29 and text.startswith("⚠") and "08:29 UTC" in text
    (tmp_path / leaseclock.LEASE_END_FILE).write_text("2026-11-26T07:50:00Z\n")
    text, left = leaseclock.message(tmp_path, now)
    assert left == -10 and text.startswith("✘") and "1_create_lease" in text
    (tmp_path / leaseclock.LEASE_END_FILE).write_text("tomorrow\n")
    with pytest.raises(ValueError, match="2_create_server_nvidia"):
        leaseclock.message(tmp_path, now)


def test_the_strict_fake_refuses_unknown_commands_and_unreachable_clones(tmp_path):
    cloud = fake.Cloud(tmp_path / "cloud.json")
    st = cloud.load()
    node = fake.FakeNode(st, cloud.node_home, REPO_ROOT)
    assert node.run("sudo rm -rf /")[2] == 127
    assert node.run("docker compose version")[2] == 127  # Docker not installed yet
    out, err, code = node.run("git clone https://example.invalid/x.git ~/kit")
    assert code == 128 and "not found" in err
    assert node.run("ls ~/kit")[2] == 2
    # the background builds need Docker and the kit's script; the lease's end needs the kit's folder
    prepare = "nohup sh ~/serve-system-chi/docker/prepare-node.sh > ~/prepare-node.log 2>&1 < /dev/null &"
    assert node.run(prepare)[2] == 127
    node.flags["docker"] = True
    assert node.run(prepare)[2] == 2 and st["prepared"] == []
    assert node.run("echo 2026-11-26T10:55:00Z > ~/serve-system-chi/lease-end.txt")[2] == 2
    # the trained model's download runs the kit's own module: no kit, no module
    out, err, code = node.run("cd ~/serve-system-chi && python3 -m servelab.node.weights fetch")
    assert code == 1 and "No module named 'servelab'" in err and st["weights_fetches"] == []
    assert node.run("echo 2026-11-26T10:55:00Z > ~/lease-end.txt; rm -rf ~")[2] == 127


def test_kit_archive_holds_the_tracked_files_only(tmp_path):
    """`make kit-archive`: what an instructor publishes on Trovi."""
    archive = tmp_path / "kit.tar.gz"
    out = subprocess.run(["make", "-s", "-C", str(REPO_ROOT), "kit-archive", f"KIT_ARCHIVE={archive}",
                          f"PYTHON={sys.executable}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with tarfile.open(archive) as tar:
        names = {m.name for m in tar.getmembers() if m.isfile()}
    assert names == {f"{chameleon.KIT_DIR}/{rel}" for rel in _git_ls_files()}
    for needed in ("notebooks/1_create_lease.ipynb", "notebooks/2_create_server_nvidia.ipynb",
                   "notebooks/7_delete_resources.ipynb", "servelab/node/chameleon.py",
                   "docker/docker-compose-models.yaml", "README.md"):
        assert f"{chameleon.KIT_DIR}/{needed}" in names, needed
    for rel in names:
        rel = rel.split("/", 1)[1]
        assert not rel.startswith((".venv/", "build/", "results/", ".git/")), rel
        assert rel not in ("docker/.env",) and not rel.endswith((".pth", ".onnx", ".pyc")), rel


def test_kit_archive_of_a_copy_without_git(tmp_path):
    """A Trovi copy has no .git: the same exclusions apply."""
    root = tmp_path / "kit"
    for rel in ("README.md", "notebooks/2_create_server_nvidia.ipynb", "docker/.env", ".venv/bin/python",
                "build/models/food11.onnx", "results/run/report.md", "servelab/__pycache__/x.pyc",
                "fastapi_pt/food11.pth", "models_staging/food_classifier_onnx/1/model.onnx",
                "models_staging/food_classifier_onnx/config.pbtxt", "notebooks/.ipynb_checkpoints/a.ipynb"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    archive, files = chameleon.pack_kit(root, tmp_path / "out.tar.gz")
    assert files == ["README.md", "models_staging/food_classifier_onnx/config.pbtxt",
                     "notebooks/2_create_server_nvidia.ipynb"]
    dest = tmp_path / "unpacked"
    assert sorted(chameleon.unpack(archive, dest)) == sorted(f"{chameleon.KIT_DIR}/{f}" for f in files)


def test_every_chameleon_call_binds_to_the_real_clients(site):
    """Each call python-chi made to a fake would bind to the real client method too."""
    from blazarclient.v1.leases import LeaseClientManager
    from glanceclient.v2.images import Controller as GlanceImages
    from neutronclient.v2_0.client import Client as NeutronClient
    from novaclient.v2.flavors import FlavorManager
    from novaclient.v2.keypairs import KeypairManager
    from novaclient.v2.servers import ServerManager
    from openstack.compute.v2._proxy import Proxy as ComputeProxy
    from openstack.network.v2._proxy import Proxy as NetworkProxy

    real = {
        ("blazar", "lease"): LeaseClientManager, ("nova", "servers"): ServerManager,
        ("nova", "keypairs"): KeypairManager, ("nova", "flavors"): FlavorManager,
        ("glance", "images"): GlanceImages, ("sdk", "compute"): ComputeProxy, ("sdk", "network"): NetworkProxy,
    }
    calls = site["cloud"].load()["calls"]
    assert calls
    for call in calls:
        if call["client"] == "neutron":
            cls, method = NeutronClient, call["method"]
        else:
            group, method = call["method"].split(".")
            cls = real[(call["client"], group)]
        func = getattr(cls, method)
        if call["method"] in ("keypairs.create",):  # the fake does not log the key itself
            call["kwargs"]["public_key"] = "ssh-ed25519 AAAA"
        inspect.signature(func).bind(object(), *call["args"], **call["kwargs"])


# --------------------------------------------------------------------------
# Static checks on the notebooks' python-chi code (every code path, run or not)


def _code_cells(name):
    nb = nbformat.read(NOTEBOOKS_DIR / f"{name}.ipynb", as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def _chi_class_in(annotation):
    """The python-chi class an annotation names (directly, Optional/Union, or List of)."""
    if inspect.isclass(annotation) and annotation.__module__.startswith("chi."):
        return annotation
    for arg in typing.get_args(annotation):
        found = _chi_class_in(arg)
        if found is not None:
            return found
    return None


class _ChiCallChecker(ast.NodeVisitor):
    """Bind every call on a python-chi module or object to the installed signature."""

    def __init__(self):
        self.modules = {}   # local name -> chi module
        self.types = {}     # variable -> chi class
        self.checked = []   # "module.func" / "Class.method" names bound
        self.errors = []

    def _returns(self, func):
        if inspect.isclass(func):
            return func
        try:
            hints = typing.get_type_hints(func)
        except Exception:
            return None
        return _chi_class_in(hints.get("return"))

    def _bind(self, label, func, node, is_method):
        args = [object()] * len(node.args)
        kwargs = {kw.arg: object() for kw in node.keywords if kw.arg is not None}
        target = func.__init__ if inspect.isclass(func) else func
        try:
            sig = inspect.signature(target)
            if is_method or inspect.isclass(func):
                bound = sig.bind(object(), *args, **kwargs)
            else:
                bound = sig.bind(*args, **kwargs)
            # A keyword only a **kwargs catch-all takes is a typo waiting to
            # be sent to the cloud (Server.submit passes **kwargs to Nova).
            for param in sig.parameters.values():
                if param.kind is param.VAR_KEYWORD and bound.arguments.get(param.name):
                    raise TypeError(f"{sorted(bound.arguments[param.name])} only match **{param.name}")
            self.checked.append(label)
        except TypeError as err:
            self.errors.append(f"{label}({ast.unparse(node)}): {err}")

    def visit_ImportFrom(self, node):
        if node.module == "chi":
            import importlib

            for alias in node.names:
                self.modules[alias.asname or alias.name] = importlib.import_module(f"chi.{alias.name}")
        self.generic_visit(node)

    def _resolve_call(self, node):
        """(label, callable, is_method, return class) for a chi call, else None."""
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner in self.modules:
                module = self.modules[owner]
                if not hasattr(module, func.attr):
                    self.errors.append(f"chi.{module.__name__.split('.')[-1]} has no {func.attr}")
                    return None
                obj = getattr(module, func.attr)
                return f"{module.__name__}.{func.attr}", obj, False, self._returns(obj)
            if owner in self.types:
                cls = self.types[owner]
                if not hasattr(cls, func.attr):
                    self.errors.append(f"{cls.__name__} has no method {func.attr}")
                    return None
                meth = getattr(cls, func.attr)
                return f"{cls.__name__}.{func.attr}", meth, True, self._returns(meth)
        return None

    def visit_Call(self, node):
        resolved = self._resolve_call(node)
        if resolved:
            label, obj, is_method, _ = resolved
            self._bind(label, obj, node, is_method)
        self.generic_visit(node)

    def _type_of(self, value):
        if isinstance(value, ast.Call):
            resolved = self._resolve_call(value)
            return resolved[3] if resolved else None
        if isinstance(value, ast.Name):
            return self.types.get(value.id)
        return None

    def visit_Assign(self, node):
        self.visit(node.value)
        cls = self._type_of(node.value)
        if cls is None and isinstance(node.value, ast.BoolOp):
            cls = next((c for c in map(self._type_of, node.value.values) if c), None)
        for target in node.targets:
            if isinstance(target, ast.Name) and cls is not None:
                self.types[target.id] = cls

    def _visit_loop_target(self, target, iterable):
        cls = self._type_of(iterable)
        if isinstance(target, ast.Name) and cls is not None:
            self.types[target.id] = cls

    def visit_For(self, node):
        self._visit_loop_target(node.target, node.iter)
        self.generic_visit(node)

    def visit_comprehension(self, node):
        self._visit_loop_target(node.target, node.iter)
        self.generic_visit(node)

    def visit_ListComp(self, node):
        for gen in node.generators:  # targets first, so the element expression knows them
            self.visit(gen)
        self.visit(node.elt)


EXPECTED_CHI_CALLS = {
    "1_create_lease": ["chi.context.choose_project", "chi.context.use_site", "chi.lease.list_leases",
                       "Lease.delete", "chi.lease.Lease", "Lease.add_node_reservation", "Lease.submit"],
    "2_create_server_nvidia": ["chi.lease.get_lease", "chi.server.Server", "Server.submit",
                               "Server.get_floating_ip", "Server.associate_floating_ip",
                               "Server.check_connectivity", "Server.refresh", "Server.show", "Server.execute",
                               "Server.upload"],
    "7_delete_resources": ["chi.server.get_server_id", "chi.server.get_server", "Server.execute",
                           "Server.ssh_connection", "Server.get_all_floating_ips",
                           "Server.delete", "chi.network.deallocate_floating_ip", "chi.lease.list_leases",
                           "Lease.delete"],
}


@pytest.mark.parametrize("name", CHI_NOTEBOOKS)
def test_every_chi_call_exists_with_these_arguments(name):
    checker = _ChiCallChecker()
    for source in _code_cells(name):
        checker.visit(ast.parse(source))
    assert not checker.errors, checker.errors
    assert set(EXPECTED_CHI_CALLS.get(name, ())) <= set(checker.checked), sorted(set(checker.checked))
    # Widgets are not available everywhere: the notebooks ask for text output.
    for source in _code_cells(name):
        assert 'show="widget"' not in source and "type=\"widget\"" not in source


def test_static_checker_catches_a_wrong_argument():
    checker = _ChiCallChecker()
    checker.visit(ast.parse(
        "from chi import lease, server\n"
        "l = lease.Lease('x', hours=3)\n"
        "s = server.Server('n', reservation='r')\n"
        "s.submit(show_text=True)\n"
        "s.associate_floating_ip(ip='x')\n"
        "lease.no_such_function()\n"
    ))
    assert len(checker.errors) == 5, checker.errors


def test_server_submit_in_notebooks_passes_show():
    """Server.submit defaults to show="widget", which raises outside Jupyter after creating the server."""
    for name in CHI_NOTEBOOKS:
        for source in _code_cells(name):
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr == "submit":
                    assert any(kw.arg == "show" for kw in node.keywords), ast.unparse(node)


def test_notebooks_use_the_kits_names_and_settings():
    """The notebooks and servelab.node.chameleon name the same lease, server, site, image and kit."""
    src1 = "\n".join(_code_cells("1_create_lease"))
    src2 = "\n".join(_code_cells("2_create_server_nvidia"))
    src7 = "\n".join(_code_cells("7_delete_resources"))
    for src in (src1, src2, src7):
        assert f'context.use_site("{chameleon.SITE}")' in src
        assert 'LEASE_NAME = f"serve-system-{username}"' in src
    assert f'NODE_TYPE = "{chameleon.NODE_TYPE}"' in src1
    assert f"LEASE_HOURS = {chameleon.LEASE_HOURS}" in src1
    assert f'IMAGE = "{chameleon.IMAGE}"' in src2
    assert f'KIT_REPO_URL = os.environ.get("{chameleon.KIT_REPO_URL_ENV}", "")' in src2
    assert f'KIT_DIR = "{chameleon.KIT_DIR}"' in src2
    for src in (src2, src7):
        assert 'SERVER_NAME = f"node-serve-system-{username}"' in src
    assert chameleon.lease_name("u") == "serve-system-u"
    assert chameleon.server_name("u") == "node-serve-system-u"


# --------------------------------------------------------------------------
# servelab.node.chameleon against the same fake, in this process


def test_chameleon_cleanup_helper(tmp_path, monkeypatch, capsys):
    import chi.context

    local = fake.Cloud(tmp_path / "cloud.json")
    patchers = fake.install(local.path, REPO_ROOT)
    try:
        monkeypatch.setenv("USER", "helperuser")
        lease_json = local.seed_lease(chameleon.lease_name("helperuser"), "ACTIVE")
        other = local.seed_lease(chameleon.lease_name("someoneelse"), "ACTIVE")
        # A server with a floating IP, made through python-chi like the notebook does.
        from chi import server as chi_server

        key = tmp_path / "k.pub"
        key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHl0ZXN0a2V5Zm9yc2VydmVsYWJub3RlYm9va3M= x\n")
        chi.context.set("keypair_public_key", str(key))
        chi.context.set("keypair_name", "helperuser-jupyter")
        node = chi_server.Server(chameleon.server_name("helperuser"),
                                 reservation_id=lease_json["reservations"][0]["id"], image_name=chameleon.IMAGE)
        fake.SERVER_BUILD_POLLS = 0
        node.submit(show="text")
        ip = node.associate_floating_ip()

        import argparse

        parser = argparse.ArgumentParser()
        chameleon.add_parser(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["chameleon", "status", "--user", "helperuser"])
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert f"server node-serve-system-helperuser: ACTIVE, {ip}" in out
        assert "lease serve-system-helperuser: ACTIVE" in out

        args = parser.parse_args(["chameleon", "cleanup", "--user", "helperuser"])
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert f"floating IPs released: {ip}" in out
        state = local.load()
        assert state["servers"] == {} and state["floatingips"] == {}
        assert [x["id"] for x in state["leases"].values()] == [other["id"]]

        # Twice is harmless.
        report = chameleon.cleanup("helperuser")
        assert report.lines() == ["server: none found", "floating IPs released: none", "leases deleted: none"]
        assert chameleon.release_floating_ips([ip]) == []
    finally:
        fake.SERVER_BUILD_POLLS = 2
        for p in patchers:
            p.stop()
        chi.context.reset()
