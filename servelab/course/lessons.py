"""The one list of the lab's lessons (notebooks), in order.

Everything that needs the list reads it from here: the notebook builder
(:mod:`servelab.course.notebooks`), the site (:mod:`servelab.course.site`), the tests
(``tests/notebooks/``) and the lesson tables in README.md and
``notebooks/src/0_intro.md`` (rewritten by ``python -m servelab notebooks build``
between their ``<!-- lessons:start -->`` / ``<!-- lessons:end -->`` markers).

To add a lesson: write ``notebooks/src/<number>_<name>.md`` and add one
``Lesson`` line below, then ``make notebooks``. Numbers are strings ordered by
their leading integer, then their suffix, so "6b" goes after "6" and before
"7" without renaming the others.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from servelab.core import paths

# The comment every code cell (and every shell block in a markdown cell) starts with.
RUNS_CHAMELEON_JUPYTER = "# runs in Chameleon Jupyter environment"
RUNS_NODE = "# runs on node-serve-system"
RUNS_JUPYTER_CONTAINER = "# runs inside the Jupyter container"
RUNS_LABELS = (RUNS_CHAMELEON_JUPYTER, RUNS_NODE, RUNS_JUPYTER_CONTAINER)


@dataclass(frozen=True)
class Place:
    """Where a lesson's code runs."""

    key: str      # short id (also the site's CSS class)
    label: str    # the comment its code cells start with
    short: str    # for tables
    long: str     # for the site's label above each code block


PLACES = {p.key: p for p in (
    Place("chameleon", RUNS_CHAMELEON_JUPYTER, "Chameleon Jupyter environment",
          "Runs in the Chameleon Jupyter environment"),
    Place("node", RUNS_NODE, "node-serve-system", "Runs on node-serve-system (a terminal on the GPU server)"),
    Place("container", RUNS_JUPYTER_CONTAINER, "inside the Jupyter container",
          "Runs inside the Jupyter container (or the local Jupyter)"),
)}
PLACE_BY_LABEL = {p.label: p for p in PLACES.values()}

_NUMBER = re.compile(r"(\d+)([a-z]*)")


@dataclass(frozen=True)
class Session:
    """A block of lessons that fits one sitting: the core lab in one 3-hour lease, or an extension
    on a second lease (its set-up counted again) or on a laptop."""

    key: str
    title: str
    limit: int            # minutes the session may take (a lease is 180; the core plans for at most 120)
    setup: int = 0        # minutes of set-up on a fresh lease before its lessons (0: the core's own lessons)
    setup_source: str = ""
    where: str = ""       # where it teaches well: the GPU node, a laptop, or both (and why)


# A second lease repeats notebooks 1, 2, 5 and 7 without the FastAPI part: lease 1, boot 20, install 5,
# Triton stack 5, delete 2 (0_intro's budget rows), plus the background downloads (20-40, the same table's
# estimate), which no FastAPI work overlaps now: 33 + 40 = 73 at most.
SECOND_LEASE_SETUP = 73

SESSIONS = {s.key: s for s in (
    Session("core", "core lab: one 3-hour lease", limit=120,
            where="the GPU node (locally, notebooks 4 and 6 run on a laptop too)"),
    Session("ext-pipeline", "extension A: inside Triton", limit=180, setup=SECOND_LEASE_SETUP,
            setup_source="a second lease: notebooks 1, 2, 5 and 7 again (0_intro's rows) and the downloads",
            where="a laptop teaches 6a as well; 6b is best on the GPU node (on a CPU every configuration ties)"),
    Session("ext-scale", "extension B: scale out and accelerate", limit=180, setup=SECOND_LEASE_SETUP,
            setup_source="a second lease: notebooks 1, 2, 5 and 7 again (0_intro's rows) and the downloads",
            where="a laptop runs 6c and 6e's CPU accelerators; 6d needs the node (k3s), 6e's GPU rows a GPU"),
    Session("ext-streams", "extension C: token streams", limit=180, setup=SECOND_LEASE_SETUP,
            setup_source="a second lease: notebooks 1, 2, 5 and 7 again (0_intro's rows) and the downloads",
            where="a laptop teaches it as well (its CPU decodes a small model, with no lease: no set-up); "
                  "on the node the decoder is GPT-2 small's shape in FP16"),
)}


def order_key(number: str) -> tuple[int, str]:
    """"6" < "6b" < "7" < "10": the leading integer, then the suffix."""
    m = _NUMBER.fullmatch(number)
    if not m:
        raise ValueError(f"lesson number {number!r}: digits, then optional lowercase letters (e.g. 6b)")
    return int(m.group(1)), m.group(2)


@dataclass(frozen=True)
class Lesson:
    number: str        # "0" .. "7"; "6b" to insert one
    slug: str          # file stem: notebooks/src/<slug>.md -> notebooks/<slug>.ipynb
    runs: str | None   # a PLACES key; None: reading only (no code)
    title: str         # one line for the lesson tables
    local: bool = False  # also done without Chameleon (`make up` and the local Jupyter)
    session: str = "core"   # a SESSIONS key
    minutes: int = 0        # its share of the session's budget
    source: str = ""        # where the minutes come from: published / computed / estimate, and why

    def __post_init__(self):
        order_key(self.number)
        if not re.fullmatch(rf"{re.escape(self.number)}_[a-z0-9_]+", self.slug):
            raise ValueError(f"lesson {self.number}: slug {self.slug!r} must be '{self.number}_name'")
        if self.runs is not None and self.runs not in PLACES:
            raise ValueError(f"lesson {self.slug}: runs={self.runs!r}, not one of {sorted(PLACES)}")
        if self.session not in SESSIONS:
            raise ValueError(f"lesson {self.slug}: session={self.session!r}, not one of {sorted(SESSIONS)}")
        if self.minutes and not re.match(r"(published|computed|estimate)\b", self.source):
            raise ValueError(f"lesson {self.slug}: its minutes need a source starting published/computed/estimate")

    @property
    def place(self) -> Place | None:
        return PLACES.get(self.runs) if self.runs else None

    @property
    def where(self) -> str:
        return self.place.short if self.place else "read only"


_CORE = "0_intro's budget table: "
_LESSONS = (
    Lesson("0", "0_intro", None, "what you will learn, and how the lab runs on Chameleon or locally", local=True,
           source="estimate: read before the lease (about 45 minutes, not on the lease's clock)"),
    Lesson("1", "1_create_lease", "chameleon", "reserve one `gpu_p100` node at CHI@TACC for 3 hours with python-chi",
           minutes=1, source="estimate: " + _CORE + "Blazar activates a lease that starts now"),
    Lesson("2", "2_create_server_nvidia", "chameleon",
           "start the server, give it a public IP, install Docker and the NVIDIA container toolkit",
           minutes=25, source="published: " + _CORE + "a bare-metal boot of up to 20 (python-chi 1.2.10), "
           "and 5 for the installs (estimate)"),
    Lesson("3", "3_fastapi_setup", "node", "start the FastAPI stack (inference service, web page, Jupyter)",
           minutes=10, source="estimate: " + _CORE + "the wait for the background builds, doctor, up"),
    Lesson("4", "4_fastapi", "container", "Swagger, sequential vs 16 concurrent clients, PyTorch vs ONNX", local=True,
           minutes=20, source="computed: " + _CORE + "1,700 timed requests per backend, and reading"),
    Lesson("5", "5_triton_setup", "node", "switch to the Triton stack",
           minutes=5, source="estimate: " + _CORE + "model load and health checks"),
    Lesson("6", "6_triton", "container",
           "perf_analyzer, instance groups, ONNX backend, dynamic batching, queueing model", local=True,
           minutes=45, source="computed: " + _CORE + "about 10 minutes of measuring from its settings, and reading"),
    Lesson("6a", "6a_triton_pipeline", "container",
           "preprocessing on the server (ensemble), warm-up in the config, model versions, BLS", local=True,
           session="ext-pipeline", minutes=30,
           source="computed from its settings: 9 closed-loop runs of 200 requests (at 50 requests/s or more on "
                  "the node: estimate), a Poisson sweep of 9 x 10 s, 5 warm-up rounds of two reloads (5 s each: "
                  "estimate), a 30 s rollout and 8 closed-loop runs of 60 requests for the BLS cascade (at 10 "
                  "requests/s or more: 1 minute), about 5 minutes of measuring; the rest is reading (estimate)"),
    Lesson("6b", "6b_model_analyzer", "container",
           "Model Analyzer searches the configurations; the queueing model ranks them too, side by side", local=True,
           session="ext-pipeline", minutes=25,
           source="computed: Model Analyzer measured 7 configurations at 3 concurrencies in 155 s in this kit's "
                  "issue 32, so the node's 9 take about 200 s; S(b) and the final sweep (3 x 200 requests) a minute "
                  "more; the rest is reading (estimate)"),
    Lesson("6f", "6f_token_streaming", "container",
           "token streams from a small decoder: request-level against iteration-level batching", local=True,
           session="ext-streams", minutes=20,
           source="computed from its settings: 3 rates x 2 schedulers x 30 s of arrivals, each run draining "
                  "its last 256-token requests (a few seconds), and two 6 s waits in the disconnect part: about "
                  "4 minutes of measuring; the rest is reading (estimate)"),
    Lesson("6c", "6c_scale_out", "container",
           "Triton replicas behind HAProxy, Prometheus, one queue vs many, the autoscaler's rule", local=True,
           session="ext-scale", minutes=30,
           source="computed: 4 loads x 3 setups x 30 s (twice when a busy machine spoils a run) and a ramp of "
                  "4 x 30 s: 8 to 14 minutes of measuring; starting the replicas and reading (estimate)"),
    Lesson("6d", "6d_kubernetes", "node", "optional: the same service on k3s, with an autoscaler on queue time",
           session="ext-scale", minutes=30,
           source="estimate: installing k3s, importing the image and the rollout; no k3s cluster has run the "
                  "lesson for this kit (tests validate its manifests only)"),
    Lesson("6e", "6e_accelerate", "container",
           "each request cheaper: torch.compile, ONNX Runtime, OpenVINO, INT8, and Triton's execution accelerators",
           local=True, session="ext-scale", minutes=25,
           source="computed: 12 rounds x 20 requests for each of its 5 variants (1,200 batch-1 requests) and "
                  "torch.compile's compile (20-40 s on 2 cores, servelab/course/reference.py), then the Triton "
                  "part's perf_analyzer runs; the rest is reading (estimate)"),
    Lesson("7", "7_delete_resources", "chameleon", "delete the server, release its IP, end the lease",
           minutes=2, source="estimate: " + _CORE + "copy the work back, delete"),
)

LESSONS: tuple[Lesson, ...] = tuple(sorted(_LESSONS, key=lambda les: order_key(les.number)))
BY_SLUG = {les.slug: les for les in LESSONS}
if len(BY_SLUG) != len(LESSONS) or len({les.number for les in LESSONS}) != len(LESSONS):
    raise ValueError("servelab.course.lessons: two lessons share a number or a slug")


def slugs(runs: str | None = "any") -> list[str]:
    """Lesson slugs in order; only those whose code runs at ``runs`` (a PLACES key, None) when given."""
    return [les.slug for les in LESSONS if runs == "any" or les.runs == runs]


# --------------------------------------------------------------------------
# The lesson tables in README.md and 0_intro (generated from LESSONS)

TABLE_START = "<!-- lessons:start (generated from servelab/course/lessons.py by `make notebooks`) -->"
TABLE_END = "<!-- lessons:end -->"


def table(link_prefix: str = "", numbered: bool = False) -> str:
    """The lesson table in markdown (links are ``<link_prefix><slug>.ipynb``), then the sessions."""
    head = ["| # | notebook | what it does | runs where | session, minutes |", "|---|---|---|---|---|"] if numbered \
        else ["| notebook | what it does | runs where | session, minutes |", "|---|---|---|---|"]
    rows = [(f"| {les.number} " if numbered else "") +
            f"| [{les.slug}]({link_prefix}{les.slug}.ipynb) | {les.title} | {les.where} | "
            f"{SESSIONS[les.session].title.split(':')[0]}, {les.minutes} |" for les in LESSONS]
    measured = measured_table()
    return "\n".join(head + rows + ["", session_table(), "", extension_sources()] + (["", measured] if measured else []))


def session_minutes(key: str) -> int:
    """A session's budget: its set-up on a fresh lease and its lessons' minutes."""
    return SESSIONS[key].setup + sum(les.minutes for les in LESSONS if les.session == key)


def session_table() -> str:
    """One row per session: its lessons, its minutes against its limit, where it teaches well."""
    out = ["| session | lessons | minutes (limit) | where it teaches well |", "|---|---|---|---|"]
    for s in SESSIONS.values():
        numbers = ", ".join(les.number for les in LESSONS if les.session == s.key and les.minutes)
        setup = f" (set-up {s.setup}: {s.setup_source})" if s.setup else ""
        out.append(f"| {s.title} | {numbers} | {session_minutes(s.key)} ({s.limit}){setup} | {s.where} |")
    return "\n".join(out)


def extension_sources() -> str:
    """Where each extension's minutes come from (the core's rows are 0_intro's budget table)."""
    out = ["| extension notebook | minutes | where they come from |", "|---|---|---|"]
    out += [f"| {les.slug} | {les.minutes} | {les.source} |" for les in LESSONS if les.session != "core"]
    return "\n".join(out)


def measured_minutes(bundle: Path | None = None) -> dict[str, tuple[float, str]]:
    """Minutes per notebook measured by the node's reference run (``docs/reference-node/manifest.json``,
    written by ``python3 -m servelab.node.reference``), each with its citation "measured on <label>, <date>";
    {} when no run is committed. Headless: no reading time, unlike the lessons' budgets."""
    path = (paths.NODE_REFERENCE_DIR if bundle is None else bundle) / "manifest.json"
    if not path.is_file():
        return {}
    manifest = json.loads(path.read_text(encoding="utf-8"))
    cite = f"measured on {manifest.get('label', '?')}, {str(manifest.get('date', '?'))[:10]}"
    minutes, errors = manifest.get("minutes", {}), manifest.get("errors", {})
    return {les.slug: (float(minutes[les.slug]), cite) for les in LESSONS
            if les.slug in minutes and les.slug not in errors}


def measured_table(bundle: Path | None = None) -> str:
    """The budgets beside the node's measured minutes ("" without a committed run)."""
    measured = measured_minutes(bundle)
    if not measured:
        return ""
    out = ["| notebook | minutes budgeted | minutes run headless | source |", "|---|---|---|---|"]
    out += [f"| {slug} | {BY_SLUG[slug].minutes} | {minutes:g} | {cite} (docs/reference-node/: the notebook and its "
            "node commands, no reading) |" for slug, (minutes, cite) in measured.items()]
    return "\n".join(out)


def header(les: Lesson) -> str:
    """The line under each notebook's title: its session and its minutes."""
    s = SESSIONS[les.session]
    if not les.minutes:
        return f"*Session: {s.title}. Read before the lease; not on its clock.*"
    return (f"*Session: {s.title} ({session_minutes(s.key)} of its {s.limit} minutes in all). This notebook: "
            f"about {les.minutes} minutes ({les.source.split(':')[0]}; 0_intro and README list every session).*")


def with_table(text: str, link_prefix: str = "", numbered: bool = False) -> str:
    """``text`` with the part between the table markers replaced by :func:`table`."""
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"no lesson table markers ({TABLE_START} ... {TABLE_END})")
    return text[:start + len(TABLE_START)] + "\n" + table(link_prefix, numbered) + "\n" + text[end:]
