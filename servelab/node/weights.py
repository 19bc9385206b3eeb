"""Download the earlier lab's trained model (its fastapi_pt/food11.pth) onto the node, checked before use.

    python3 -m servelab.node.weights fetch      # notebook 2 runs it in the kit's folder

The earlier lab published that file in its repository (teaching-on-testbeds/serve-system-chi, MIT licence,
its fastapi_pt/food11.pth); it is fetched at a pinned commit. It is kept (as
``build/trained/food11.pth``, git-ignored) only when its git blob id, sha1 of
``blob <size>\\0`` + content, is the one recorded from that commit's tree
(``git ls-tree``); otherwise nothing is kept. Then the models container
(``docker compose ... run --rm models``: ``servelab models build --prefer-weights``)
loads it, checks that it is a MobileNetV2 with 11 classes and builds with it, or
builds the demo weights, with one line saying why. Each outcome here is one line;
the exit status is 0 in each case (the demo weights are the fallback, not an error).

Standard library only: it runs with the node's own ``python3``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import urllib.request
from pathlib import Path

from servelab.core import paths

# Read with `git ls-tree -r` at this commit, the head of main when read (dated 2025-03-18): there
# fastapi_pt/food11.pth and models_staging/food_classifier/1/food11.pth are the same blob. That repository has
# no .gitattributes (no Git LFS): the blob is the file itself, so raw.githubusercontent.com serves these bytes.
SOURCE_REPO = "teaching-on-testbeds/serve-system-chi"
SOURCE_COMMIT = "012a8b946b432f62e120d315ae974c54c303e9da"
SOURCE_PATH = "fastapi_pt/food11.pth"
RECORDED_BLOB = "b550214474f469ca65c2eb6c30f383ef4e7e8c7a"
URL = f"https://raw.githubusercontent.com/{SOURCE_REPO}/{SOURCE_COMMIT}/{SOURCE_PATH}"
# A MobileNetV2 is about 9 MB pickled; anything far larger is not the file we want.
MAX_BYTES = 64 * 2**20
TIMEOUT_S = 60
FALLBACK = "the models build uses the demo weights"


def blob_id(path: str | os.PathLike) -> str:
    """Git's id of a file's content (``git hash-object --no-filters PATH``)."""
    h = hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(url: str, dest: Path, max_bytes: int) -> None:
    """``url`` into ``dest``; ValueError past ``max_bytes``."""
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r, open(dest, "wb") as f:
        got = 0
        for chunk in iter(lambda: r.read(1 << 20), b""):
            got += len(chunk)
            if got > max_bytes:
                raise ValueError(f"larger than {max_bytes // 2**20} MiB")
            f.write(chunk)


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(paths.REPO_ROOT))
    except ValueError:
        return str(p)


def fetch(url: str = URL, blob: str = RECORDED_BLOB, dest: str | os.PathLike | None = None,
          max_bytes: int = MAX_BYTES) -> tuple[bool, str]:
    """(kept, the one line to print). ``dest`` is written only with content whose git blob id is ``blob``;
    a file already there with that id is kept without a download."""
    dest = Path(dest or paths.TRAINED_WEIGHTS)
    short = blob[:12]
    origin = f"{SOURCE_REPO}@{SOURCE_COMMIT[:7]} {SOURCE_PATH}" if url == URL else url
    if dest.is_file():
        if blob_id(dest) == blob:
            return True, (f"trained weights: {_rel(dest)} is already here, git blob {short} as recorded "
                          f"({origin}); the models build loads them")
        dest.unlink()  # not the recorded file: fetch it again
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        try:
            _download(url, part, max_bytes)
        except (OSError, ValueError) as err:  # URLError and timeouts are OSErrors
            return False, f"trained weights not downloaded ({type(err).__name__}: {err}); {FALLBACK}"
        got = blob_id(part)
        if got != blob:
            return False, (f"trained weights refused: the download's git blob is {got[:12]}, not the recorded "
                           f"{short} ({origin}); {FALLBACK}")
        size = part.stat().st_size
        part.replace(dest)
    finally:
        part.unlink(missing_ok=True)
    return True, (f"trained weights: downloaded {_rel(dest)} ({size / 1e6:.1f} MB), git blob {short} as recorded "
                  f"({origin}); the models build loads them")


def _cmd(args) -> int:
    _kept, line = fetch(args.url, args.blob)
    print(line)
    return 0


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("fetch",))
    p.add_argument("--url", default=URL, help="where to download from (default: the earlier lab's fastapi_pt/food11.pth, pinned)")
    p.add_argument("--blob", default=RECORDED_BLOB,
                   help="the git blob id the file must have (default: the one recorded from the earlier lab's tree)")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("weights", help="download the earlier lab's fastapi_pt/food11.pth, checked by its git blob id")
    _arguments(p)
    p.set_defaults(func=_cmd)
    return p


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m servelab.node.weights", description=__doc__.splitlines()[0])
    _arguments(parser)
    return _cmd(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
