"""Fixtures shared by the reliability tests: one local Triton for the whole
session (bad input, reload under load, exposure), started on free loopback
ports through the kit's own launcher (servelab.triton)."""

from __future__ import annotations

import pytest

from servelab.core import procs
from tests.tiers import tier


@pytest.fixture(scope="session")
@tier("integration")
def triton(built_models):
    from servelab.triton import start

    server = start(http_port=procs.free_port(), grpc_port=procs.free_port(),
                   metrics_port=procs.free_port(), write_state=False)
    try:
        yield server
    finally:
        forced = server.stop()
        print(f"\nshared Triton stopped; forced: {forced or 'nothing'}")
