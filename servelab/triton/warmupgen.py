"""The lab's ``model_warmup`` blocks and ``servelab/pristine/``, written by one command.

Triton's config.pbtxt has no includes. A warm-up at every batch size the dynamic batcher can form is
one entry per size, 1 .. max_batch_size, in each config that batches (food_classifier_onnx,
food_preprocess, food_postprocess). Their one source is each block's first entry (which input, which
data); this module writes the other entries from it and the config's ``max_batch_size``, then copies
every config of models_staging/ into servelab/pristine/ (the copies ``servelab.node.configs`` restores
a broken config from). Nobody edits those entries or copies by hand:

    python -m servelab.triton.warmupgen          # rewrite what differs, and say which files
    python -m servelab.triton.warmupgen --check  # exit 1 when a file differs (the fast tier runs it)
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from servelab.core import paths
from servelab.node.configs import PRISTINE

BLOCK = re.compile(r"^model_warmup \[\n(.*?)\n\]", re.M | re.S)
FIRST = re.compile(r'^ *\{ name: "batch 1" batch_size: 1 (inputs .*) \},?$')
MAX_BATCH = re.compile(r"^max_batch_size: *(\d+)", re.M)


def warmup_block(text: str) -> str:
    """``text`` (a config.pbtxt) with its model_warmup entries written from the first one: one per
    batch size 1 .. max_batch_size. A config without a block, or without batching, is returned as is."""
    block, batch = BLOCK.search(text), MAX_BATCH.search(text)
    if not block or not batch or int(batch.group(1)) < 1:
        return text
    first = FIRST.match(block.group(1).splitlines()[0])
    if not first:
        raise ValueError('the first model_warmup entry must read { name: "batch 1" batch_size: 1 inputs ... }')
    sizes = range(1, int(batch.group(1)) + 1)
    entries = ",\n".join(f'  {{ name: "batch {b}" batch_size: {b} {first.group(1)} }}' for b in sizes)
    return text[:block.start(1)] + entries + text[block.end(1):]


def sync(repo: Path = paths.MODELS_STAGING, pristine: Path = PRISTINE, write: bool = True) -> list[Path]:
    """The files that differ from what they should be (rewritten when ``write``)."""
    changed = []
    for config in sorted(repo.glob("*/config.pbtxt")):
        text = config.read_text()
        wanted = warmup_block(text)
        copy = pristine / config.parent.name / "config.pbtxt"
        for path, content in ((config, wanted), (copy, wanted)):
            if not path.is_file() or path.read_text() != content:
                changed.append(path)
                if write:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(content)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.triton.warmupgen", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a file differs")
    args = parser.parse_args(argv)
    changed = sync(write=not args.check)
    for path in changed:
        print(f"{'differs' if args.check else 'written'}: {path.relative_to(paths.REPO_ROOT)}")
    if args.check and changed:
        print("run: python -m servelab.triton.warmupgen")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
