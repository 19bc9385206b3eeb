"""Check one Triton inference input before it is sent.

Triton 2.51 answers several malformed requests with HTTP 500 instead of a
4xx (docs/SECURITY.md lists them: a negative shape, strings in FP32 data, a
data count that does not match the shape, ...), and a NaN input comes back
as JSON with a bare ``NaN``. The kit's own clients never send such a
request: the load generator (``servelab.bench.targets.triton_infer_body``)
calls ``check_input`` first and raises ``BadTritonInput`` instead; the Flask
page (``flask_app/triton_client.py``) sends only inputs that pass it by
construction (the upload as one BYTES element, or food11.preprocess's finite
float32 tensor), and tests/triton/test_client_inputs.py runs ``check_input``
on what it sends.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# The v2 datatypes the kit sends, and the numpy kinds their data may have.
_KINDS = {"FP32": "f", "FP16": "f", "FP64": "f", "INT64": "iu", "INT32": "iu", "UINT8": "u", "BYTES": None}


class BadTritonInput(ValueError):
    """An input Triton would answer with a 500 (or a bare NaN): never sent."""


def check_input(name: str, datatype: str, shape: Sequence[int], data) -> None:
    """Raise ``BadTritonInput`` unless ``data`` fits ``datatype`` and ``shape``:
    a known datatype, a shape of non-negative integers, exactly prod(shape)
    elements, numbers (finite ones for floats) or bytes for BYTES."""
    if datatype not in _KINDS:
        raise BadTritonInput(f"input {name}: datatype {datatype!r} is not one the kit sends ({', '.join(_KINDS)})")
    dims = list(shape)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise BadTritonInput(f"input {name}: shape {dims} must be non-negative integers")
    count = math.prod(int(d) for d in dims)
    if datatype == "BYTES":
        items = list(np.asarray(data, dtype=object).ravel()) if isinstance(data, np.ndarray) else list(data)
        if len(items) != count:
            raise BadTritonInput(f"input {name}: {len(items)} elements for shape {dims} ({count} expected)")
        if not all(isinstance(x, (bytes, bytearray, np.bytes_)) for x in items):
            raise BadTritonInput(f"input {name}: BYTES elements must be bytes")
        return
    arr = np.asarray(data)
    if arr.dtype.kind not in _KINDS[datatype] + ("iu" if _KINDS[datatype] == "f" else ""):
        raise BadTritonInput(f"input {name}: {datatype} data must be numbers, not {arr.dtype}")
    if arr.size != count:
        raise BadTritonInput(f"input {name}: {arr.size} elements for shape {dims} ({count} expected)")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise BadTritonInput(f"input {name}: {datatype} data holds NaN or infinity")
