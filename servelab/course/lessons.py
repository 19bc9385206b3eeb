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

import re
from dataclasses import dataclass

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

    def __post_init__(self):
        order_key(self.number)
        if not re.fullmatch(rf"{re.escape(self.number)}_[a-z0-9_]+", self.slug):
            raise ValueError(f"lesson {self.number}: slug {self.slug!r} must be '{self.number}_name'")
        if self.runs is not None and self.runs not in PLACES:
            raise ValueError(f"lesson {self.slug}: runs={self.runs!r}, not one of {sorted(PLACES)}")

    @property
    def place(self) -> Place | None:
        return PLACES.get(self.runs) if self.runs else None

    @property
    def where(self) -> str:
        return self.place.short if self.place else "read only"


_LESSONS = (
    Lesson("0", "0_intro", None, "what you will learn, and how the lab runs on Chameleon or locally", local=True),
    Lesson("1", "1_create_lease", "chameleon", "reserve one `gpu_p100` node at CHI@TACC for 3 hours with python-chi"),
    Lesson("2", "2_create_server_nvidia", "chameleon",
           "start the server, give it a public IP, install Docker and the NVIDIA container toolkit"),
    Lesson("3", "3_fastapi_setup", "node", "start the FastAPI stack (inference service, web page, Jupyter)"),
    Lesson("4", "4_fastapi", "container", "Swagger, sequential vs 16 concurrent clients, PyTorch vs ONNX", local=True),
    Lesson("5", "5_triton_setup", "node", "switch to the Triton stack"),
    Lesson("6", "6_triton", "container",
           "perf_analyzer, instance groups, ONNX backend, dynamic batching, queueing model", local=True),
    Lesson("6a", "6a_triton_pipeline", "container", "preprocessing on the server (ensemble), warm-up in the config, model versions", local=True),
    Lesson("6b", "6b_model_analyzer", "container",
           "Model Analyzer searches the configurations; the queueing model ranks them too, side by side", local=True),
    Lesson("6c", "6c_scale_out", "container",
           "Triton replicas behind HAProxy, Prometheus, one queue vs many, the autoscaler's rule", local=True),
    Lesson("6d", "6d_kubernetes", "node", "optional: the same service on k3s, with an autoscaler on queue time"),
    Lesson("6e", "6e_accelerate", "container",
           "each request cheaper: torch.compile, ONNX Runtime, OpenVINO, INT8, and Triton's execution accelerators",
           local=True),
    Lesson("7", "7_delete_resources", "chameleon", "delete the server, release its IP, end the lease"),
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
    """The lesson table in markdown; links are ``<link_prefix><slug>.ipynb``."""
    head = ["| # | notebook | what it does | runs where |", "|---|---|---|---|"] if numbered else \
        ["| notebook | what it does | runs where |", "|---|---|---|"]
    rows = [(f"| {les.number} " if numbered else "") +
            f"| [{les.slug}]({link_prefix}{les.slug}.ipynb) | {les.title} | {les.where} |" for les in LESSONS]
    return "\n".join(head + rows)


def with_table(text: str, link_prefix: str = "", numbered: bool = False) -> str:
    """``text`` with the part between the table markers replaced by :func:`table`."""
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"no lesson table markers ({TABLE_START} ... {TABLE_END})")
    return text[:start + len(TABLE_START)] + "\n" + table(link_prefix, numbered) + "\n" + text[end:]
