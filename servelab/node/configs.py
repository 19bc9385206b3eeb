"""Put the model repository's configurations back as the kit shipped them, without git.

The kit reaches the node as an archive (no ``.git``), so ``git checkout`` cannot
undo an edit of ``models_staging/*/config.pbtxt``. The kit keeps its own record
instead: a copy of each shipped ``config.pbtxt`` under ``servelab/pristine/``
(a test keeps the two equal).

    python3 -m servelab.node.configs check      # which configurations differ from the kit's
    python3 -m servelab.node.configs restore    # write the kit's back (then reload the models)

Standard library only: it runs with the node's own ``python3``, in the Jupyter
containers and locally.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from servelab.core import paths

PRISTINE = paths.PACKAGE_DIR / "pristine" / "models_staging"


def models() -> list[str]:
    return sorted(p.parent.name for p in PRISTINE.glob("*/config.pbtxt"))


def changed(repository: str | os.PathLike | None = None) -> list[str]:
    """The models whose config.pbtxt differs from (or is missing against) the kit's record."""
    repo = Path(repository or paths.MODELS_STAGING)
    out = []
    for model in models():
        target = repo / model / "config.pbtxt"
        if not target.is_file() or target.read_bytes() != (PRISTINE / model / "config.pbtxt").read_bytes():
            out.append(model)
    return out


def restore(repository: str | os.PathLike | None = None) -> list[str]:
    """Write the kit's config.pbtxt back for every model that differs; return those models."""
    repo = Path(repository or paths.MODELS_STAGING)
    todo = changed(repo)
    for model in todo:
        target = repo / model / "config.pbtxt"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((PRISTINE / model / "config.pbtxt").read_bytes())
    return todo


def _cmd(args) -> int:
    repo = args.repository
    if args.action == "check":
        diff = changed(repo)
        print("configurations as the kit shipped them" if not diff
              else "differ from the kit's: " + ", ".join(diff) + "  (python3 -m servelab.node.configs restore)")
        return 0
    done = restore(repo)
    if done:
        print("restored " + ", ".join(f"{m}/config.pbtxt" for m in done)
              + ". Triton still runs the old ones until each model is loaded again: in 6_triton, run "
              "'Where we start'; or restart Triton: docker compose -f ~/serve-system-chi/docker/"
              "docker-compose-triton.yaml restart triton_server")
    else:
        print("nothing to restore: every config.pbtxt is as the kit shipped it")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("configs", help="check or restore models_staging/*/config.pbtxt without git")
    _arguments(p)
    p.set_defaults(func=_cmd)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("check", "restore"))
    p.add_argument("--repository", default=None, help="the model repository (default: the kit's models_staging/)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m servelab.node.configs", description=__doc__.splitlines()[0])
    _arguments(parser)
    return _cmd(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
