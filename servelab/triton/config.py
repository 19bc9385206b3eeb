"""Model configs on Triton's own protobuf schema
(``tritonclient.grpc.model_config_pb2``): parse, convert, edit, adapt to
this machine, describe in one line."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Callable, Mapping, Union

from servelab.triton.install import gpu_count

# Set to 1 to keep every model_warmup entry on the CPU too (see _localize_warmup).
FULL_WARMUP_ENV = "SERVELAB_FULL_WARMUP"

RUNNER_PARAMETER = "servelab_runner"
ONNX_FILE_PARAMETER = "servelab_onnx_file"
RUNNER_NOTE = (
    "{name}: this Triton binary has no onnxruntime backend, so locally it runs on the Python backend "
    "through servelab's onnxruntime runner (same IO names, max_batch_size, instance_group, dynamic_batching); "
    "the lab's container uses the real onnxruntime backend with the same config.pbtxt."
)

Edit = Union[None, Mapping, str, Callable[[dict], Union[dict, None]]]


def _pb():
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2


def parse_config_text(text: str, where: str = "config.pbtxt"):
    """pbtxt text → ``ModelConfig`` (raises ValueError naming the problem)."""
    from google.protobuf import text_format

    cfg = _pb().ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as err:
        raise ValueError(f"{where}: {err}") from None
    return cfg


def load_config(path: str | os.PathLike):
    """A ``config.pbtxt`` (or its model folder) → ``ModelConfig``."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.pbtxt"
    return parse_config_text(path.read_text(), str(path))


def config_to_dict(cfg) -> dict:
    from google.protobuf import json_format

    return json_format.MessageToDict(cfg, preserving_proto_field_name=True)


def dict_to_config(data: Mapping, where: str = "config"):
    """A config dict (Triton's JSON form) → ``ModelConfig``; unknown fields
    or wrong types raise ValueError before anything reaches the server."""
    from google.protobuf import json_format

    cfg = _pb().ModelConfig()
    try:
        json_format.ParseDict(dict(data), cfg)
    except json_format.ParseError as err:
        raise ValueError(f"{where}: {err}") from None
    return cfg


def config_to_text(cfg, header: str = "") -> str:
    from google.protobuf import text_format

    lines = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    return lines + text_format.MessageToString(cfg)


def fragment_to_edit(text: str, where: str = "edit") -> dict:
    """A pbtxt fragment → the top-level fields it sets, as a dict edit."""
    fragment = parse_config_text(text, where)
    edit = config_to_dict(fragment)
    # An empty block such as "dynamic_batching { }" is present but has no fields.
    for desc, _ in fragment.ListFields():
        edit.setdefault(desc.name, {})
    return edit


def apply_edit(config: Mapping, edit: Edit) -> dict:
    """Return a new config dict with ``edit`` applied: a dict replaces
    top-level fields (``None`` removes one), a pbtxt fragment does the same,
    a callable gets the config dict and returns the new one."""
    new = copy.deepcopy(dict(config))
    if edit is None:
        return new
    if callable(edit):
        result = edit(new)
        return dict(result if result is not None else new)
    if isinstance(edit, str):
        edit = fragment_to_edit(edit, "edit")
    for key, value in dict(edit).items():
        if value is None:
            new.pop(key, None)
        else:
            new[key] = copy.deepcopy(value)
    dict_to_config(new, "edited config")  # validate now, with a clear message
    return new


def is_onnx_config(cfg) -> bool:
    return cfg.backend == "onnxruntime" or cfg.platform == "onnxruntime_onnx"


def is_runner_config(cfg) -> bool:
    return RUNNER_PARAMETER in cfg.parameters


def _to_runner(cfg, name: str) -> str:
    """An onnxruntime config → the Python backend with servelab's runner."""
    cfg.backend = "python"
    cfg.platform = ""
    cfg.parameters[RUNNER_PARAMETER].string_value = "onnxruntime"
    # The Python backend wants default_model_filename to be model.py.
    cfg.parameters[ONNX_FILE_PARAMETER].string_value = cfg.default_model_filename or "model.onnx"
    cfg.default_model_filename = ""
    return RUNNER_NOTE.format(name=name)


def _localize_group(group, gpus: int, name: str, pb) -> str | None:
    """KIND_GPU → KIND_CPU without a GPU; GPU ids this machine lacks → the ones it has."""
    if group.kind != pb.ModelInstanceGroup.KIND_GPU:
        return None
    if gpus == 0:
        group.kind = pb.ModelInstanceGroup.KIND_CPU
        del group.gpus[:]
        return (f"{name}: no GPU on this machine, instance_group KIND_GPU runs as KIND_CPU "
                f"(count {group.count or 1}).")
    if any(g >= gpus for g in group.gpus):
        keep = [g for g in group.gpus if g < gpus] or [0]
        note = f"{name}: only {gpus} GPU(s) here, gpus {list(group.gpus)} -> {keep}."
        del group.gpus[:]
        group.gpus.extend(keep)
        return note
    return None


def localize_config(cfg, gpus: int | None = None, name: str | None = None):
    """Adapt a lab config to this machine; returns ``(new_cfg, notes)``.
    Idempotent: applying it to its own output changes nothing."""
    pb = _pb()
    gpus = gpu_count() if gpus is None else gpus
    new = pb.ModelConfig()
    new.CopyFrom(cfg)
    name = name or new.name or "model"
    notes: list[str] = []
    if is_onnx_config(new):
        notes.append(_to_runner(new, name))
    for group in new.instance_group:
        note = _localize_group(group, gpus, name, pb)
        if note:
            notes.append(note)
    note = _localize_warmup(new, gpus, name)
    if note:
        notes.append(note)
    return new, notes


def warmed_sizes(config: Mapping) -> set[int]:
    """Batch sizes a config's ``model_warmup`` runs (Triton runs each entry on
    every instance while the model loads, before it is READY)."""
    return {max(1, int(w.get("batch_size", 0) or 0)) for w in config.get("model_warmup") or []}


def _localize_warmup(cfg, gpus: int, name: str) -> str | None:
    """On the CPU, model_warmup keeps the sizes :func:`batch_sizes_to_warm`
    names (batch 1 and the preferred sizes): the GPU node's config warms every
    size the dynamic batcher can form, for kernel selection, which the CPU does
    not do; 16 sizes of MobileNetV2 here would add seconds to every load.
    ``SERVELAB_FULL_WARMUP=1`` keeps them all."""
    if not cfg.model_warmup or os.environ.get(FULL_WARMUP_ENV) == "1":
        return None
    data = config_to_dict(cfg)
    if any(_on_gpu(g, gpus) for g in data.get("instance_group") or [{}]):
        return None
    keep = set(batch_sizes_to_warm(data, gpus))
    sizes = sorted(warmed_sizes(data))
    kept = [w for w in cfg.model_warmup if max(1, w.batch_size) in keep]
    if len(kept) == len(cfg.model_warmup):
        return None
    del cfg.model_warmup[:]
    cfg.model_warmup.extend(kept)
    return (f"{name}: model_warmup runs batch sizes {sorted(keep & set(sizes))} of {sizes[0]}..{sizes[-1]} on the CPU "
            f"(a new size costs a GPU kernel selection, not a CPU; {FULL_WARMUP_ENV}=1 keeps them all).")


def set_instances(count: int | None = None, kind: str | None = None, gpus: list | None = None):
    """An edit (for :func:`apply_edit`) that sets the model's one instance
    group: ``count`` copies (default: the config's), of ``kind`` (default: the
    config's, so a GPU model stays on the GPU), on ``gpus`` (default: the
    config's, dropped when the kind becomes something other than KIND_GPU)."""
    def edit(cfg: dict) -> dict:
        old = (cfg.get("instance_group") or [{}])[0]
        group = {"count": int(count if count is not None else old.get("count", 1)),
                 "kind": kind or old.get("kind", "KIND_AUTO")}
        listed = gpus if gpus is not None else old.get("gpus")
        if listed and group["kind"] in ("KIND_GPU", "KIND_AUTO"):
            group["gpus"] = [int(g) for g in listed]
        cfg["instance_group"] = [group]
        dict_to_config(cfg, "edited config")  # validate now, with a clear message
        return cfg

    return edit


def _on_gpu(group: Mapping, gpus: int | None = None) -> bool:
    """Whether an instance group's copies run on GPUs (KIND_AUTO: where there is one)."""
    kind = group.get("kind", "KIND_AUTO")
    if kind == "KIND_GPU":
        return True
    return kind == "KIND_AUTO" and bool(group.get("gpus") or (gpu_count() if gpus is None else gpus))


def instance_count(config: Mapping, gpus: int | None = None) -> int:
    """Model copies a config asks for: ``count`` per group, times the GPUs a
    GPU group runs on: those it lists, or, listing none, every GPU here
    (``gpus``: how many; default :func:`gpu_count`). KIND_AUTO is a GPU
    group where there is a GPU."""
    groups = config.get("instance_group") or [{"count": 1}]
    total = 0
    for g in groups:
        count = int(g.get("count", 1) or 1)
        if _on_gpu(g, gpus):
            total += count * (len(g.get("gpus") or []) or max(1, gpu_count() if gpus is None else gpus))
        else:
            total += count
    return max(1, total)


def batch_sizes_to_warm(config: Mapping, gpus: int | None = None) -> list[int]:
    """Batch sizes a warm-up should run before anything is timed.

    On a GPU the first batch of each new size pays for kernel selection (and
    memory), and the dynamic batcher can form any size up to
    ``max_batch_size`` (a preferred size, or whatever has gathered when the
    delay runs out): every size. On the CPU a new size costs little more than
    any run: batch 1 and the preferred sizes, so the warm-up stays cheap."""
    max_batch = int(config.get("max_batch_size", 0) or 0)
    batching = config.get("dynamic_batching")
    if max_batch <= 1 or batching is None:
        return [1]
    if any(_on_gpu(g, gpus) for g in config.get("instance_group") or [{}]):
        return list(range(1, max_batch + 1))
    preferred = [int(b) for b in (batching or {}).get("preferred_batch_size") or [] if 1 < int(b) <= max_batch]
    return sorted({1, *preferred})


def describe_config(config) -> str:
    """One line a student can read: batching, instances, backend."""
    data = config if isinstance(config, Mapping) else config_to_dict(config)
    groups = data.get("instance_group") or []
    inst = ", ".join(
        f"{g.get('count', 1)} x {g.get('kind', 'KIND_AUTO')}" + (f" gpus {g['gpus']}" if g.get("gpus") else "")
        for g in groups
    ) or "default"
    db = data.get("dynamic_batching")
    if db is None:
        batching = "dynamic_batching off"
    else:
        delay = int(db.get("max_queue_delay_microseconds", 0))
        preferred = db.get("preferred_batch_size") or []
        batching = f"dynamic_batching on (max_queue_delay {delay} us, preferred {list(map(int, preferred))})"
    backend = data.get("backend") or data.get("platform") or "?"
    if RUNNER_PARAMETER in (data.get("parameters") or {}):
        backend += " (servelab onnxruntime runner)"
    return (f"{data.get('name', '?')}: backend {backend}; max_batch_size {data.get('max_batch_size', 0)}; "
            f"instance_group {inst}; {batching}")
