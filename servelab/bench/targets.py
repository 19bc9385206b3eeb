"""What the load generator sends: one target per kind of endpoint.

A target turns request number ``i`` into one call and says whether it
succeeded. Payloads are encoded once, up front, and sent in rotation, so the
client spends its CPU time on sending, not on JSON or base64.

* ``FastAPITarget``: ``POST /predict`` with ``{"image": "<base64>"}``.
* ``TritonHTTPTarget``: Triton's HTTP/REST v2 ``/v2/models/<m>/infer``, with
  the binary-data extension (what perf_analyzer sends) or plain JSON. Use
  ``triton_image_target`` for a BYTES model that takes an encoded image
  (``food_classifier``), ``triton_tensor_target`` for an FP32 tensor model
  (``food_classifier_onnx``), or ``triton_target`` to pick from the model's
  metadata.
* ``TritonGRPCTarget``: the same over gRPC, through tritonclient's asyncio client.
* ``HTTPTarget``: any method/path/body, for tests and trivial endpoints.

``call`` returns ``None`` on success or a short error kind such as
``"HTTP 400"``, ``"timeout"``, ``"connection refused"``.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from servelab.bench import http
from servelab.core.triton_inputs import check_input

Check = Callable[[http.Response], bool]


class Target:
    """Base class: ``open`` a session per concurrent sender, ``call`` it."""

    name = "target"
    kind = "generic"

    async def open(self):
        raise NotImplementedError

    async def call(self, session, i: int) -> str | None:
        raise NotImplementedError

    async def close(self, session) -> None:
        pass

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind}


class HTTPTarget(Target):
    """Send pre-encoded HTTP/1.1 requests over keep-alive connections."""

    kind = "http"

    def __init__(self, url: str, path: str = "/", method: str = "GET",
                 bodies: Sequence[bytes] = (b"",), headers: dict[str, str] | None = None,
                 check: Check | None = None, name: str | None = None, timeout: float = 30.0):
        self.host, self.port, base = http.split_url(url)
        self.url = url
        self.path = base + path
        self.method = method
        self.timeout = timeout
        self.check = check
        self.name = name or f"{method} {url.rstrip('/')}{path}"
        if not bodies:
            raise ValueError("at least one request body is needed")
        self.requests = [http.build_request(method, self.host, self.port, self.path, b, headers)
                         for b in bodies]

    async def open(self) -> http.Connection:
        conn = http.Connection(self.host, self.port, self.timeout)
        try:
            await conn.connect()  # connect now so set-up is not timed as a request
        except http.HTTPError:
            pass  # the first request will retry and report the error
        return conn

    async def call(self, session: http.Connection, i: int) -> str | None:
        resp = await session.request(self.requests[i % len(self.requests)])
        if resp.status >= 400:
            return f"HTTP {resp.status}"
        if self.check is not None and not self.check(resp):
            return "bad response"
        return None

    async def close(self, session: http.Connection) -> None:
        session.close()

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "url": self.url, "path": self.path,
                "payloads": len(self.requests)}


def default_images() -> list[bytes]:
    """The kit's bundled sample images, as encoded bytes."""
    from servelab.core.paths import sample_images
    images = [p.read_bytes() for p in sample_images()]
    if not images:
        raise FileNotFoundError("no sample images in servelab/samples/")
    return images


def _read_image_file(path: str | Path) -> bytes:
    """A regular file of at most food11.MAX_IMAGE_BYTES (what the servers accept):
    never /dev/zero, a FIFO or a multi-GB file read whole into memory."""
    from servelab.core import food11

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: not a regular file")
    size = p.stat().st_size
    if size > food11.MAX_IMAGE_BYTES:
        raise ValueError(f"{p}: {size} bytes is over the {food11.MAX_IMAGE_BYTES} byte image limit")
    with open(p, "rb") as f:
        return f.read(food11.MAX_IMAGE_BYTES + 1)[: food11.MAX_IMAGE_BYTES]


def _read_images(images: Sequence[bytes | str | Path] | None) -> list[bytes]:
    if images is None:
        return default_images()
    return [_read_image_file(x) if isinstance(x, (str, Path)) else bytes(x) for x in images]


class FastAPITarget(HTTPTarget):
    """The lab's FastAPI services: ``POST /predict {"image": b64}``."""

    kind = "fastapi"

    def __init__(self, url: str, images: Sequence[bytes | str | Path] | None = None,
                 path: str = "/predict", timeout: float = 30.0, name: str | None = None):
        bodies = [json.dumps({"image": base64.b64encode(b).decode("ascii")}).encode()
                  for b in _read_images(images)]
        super().__init__(url, path, "POST", bodies, {"Content-Type": "application/json"},
                         check=lambda r: b'"prediction"' in r.body, timeout=timeout,
                         name=name or f"FastAPI {url.rstrip('/')}{path}")


# --- Triton HTTP/REST v2 -------------------------------------------------

_NP_TO_TRITON = {np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16",
                 np.dtype(np.float64): "FP64", np.dtype(np.int64): "INT64",
                 np.dtype(np.int32): "INT32", np.dtype(np.uint8): "UINT8"}
_TRITON_TO_NP = {v: k for k, v in _NP_TO_TRITON.items()}


def serialize_bytes_tensor(items: Sequence[bytes]) -> bytes:
    """Triton's BYTES wire format: each element as 4-byte little-endian length + bytes."""
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def triton_infer_body(inputs: Sequence[tuple[str, str, Sequence[int], object]],
                      outputs: Sequence[str] = (), binary: bool = True,
                      parameters: dict | None = None) -> tuple[bytes, dict[str, str]]:
    """Encode one v2 inference request.

    ``inputs``: ``(name, datatype, shape, data)`` where data is a numpy array
    (numeric) or a list of bytes (BYTES). ``parameters``: the request's own
    (e.g. ``{"priority": 1}``). Returns ``(body, headers)``.
    Each input is checked first (``servelab.core.triton_inputs.check_input``): a
    request Triton would answer with a 500 is never built.
    """
    head_inputs, blobs = [], []
    for name, dtype, shape, data in inputs:
        check_input(name, dtype, shape, data)
        entry = {"name": name, "shape": list(shape), "datatype": dtype}
        if dtype == "BYTES":
            items = [bytes(x) for x in data]
            if binary:
                blob = serialize_bytes_tensor(items)
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                entry["data"] = [x.decode("utf-8") for x in items]
        else:
            arr = np.ascontiguousarray(data, dtype=_TRITON_TO_NP[dtype])
            if binary:
                blob = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                entry["data"] = arr.ravel().tolist()
        head_inputs.append(entry)
    header: dict = {"inputs": head_inputs}
    if parameters:
        priority = parameters.get("priority")
        # Triton 2.51 answers a priority that is not an unsigned integer with a 500 ("Unable to parse
        # 'priority'"); a level the model does not have (0, or above priority_levels) is served.
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int) or priority < 0):
            raise ValueError(f"priority must be an unsigned integer (a level, 1 = first), got {priority!r}")
        header["parameters"] = dict(parameters)
    if outputs:
        header["outputs"] = [{"name": o, "parameters": {"binary_data": binary}} for o in outputs]
    head = json.dumps(header, separators=(",", ":")).encode()
    if not binary:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(blobs), {"Content-Type": "application/octet-stream",
                                    "Inference-Header-Content-Length": str(len(head))}


def parse_infer_response(resp: http.Response) -> dict[str, np.ndarray | list]:
    """Decode a v2 inference response (JSON or binary-data) into {name: array}."""
    n = int(resp.headers.get("inference-header-content-length", len(resp.body)))
    head = json.loads(resp.body[:n])
    blob, pos, out = resp.body[n:], 0, {}
    for o in head.get("outputs", []):
        shape, dtype = o["shape"], o["datatype"]
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is None:
            data = o["data"]
            out[o["name"]] = data if dtype == "BYTES" else np.asarray(data, _TRITON_TO_NP[dtype]).reshape(shape)
            continue
        raw = blob[pos:pos + size]
        pos += size
        if dtype == "BYTES":
            items, p = [], 0
            while p < len(raw):
                (ln,) = struct.unpack_from("<I", raw, p)
                items.append(raw[p + 4:p + 4 + ln])
                p += 4 + ln
            out[o["name"]] = items
        else:
            out[o["name"]] = np.frombuffer(raw, dtype=_TRITON_TO_NP[dtype]).reshape(shape)
    return out


def _infer_path(model: str, version: str | int | None) -> str:
    v = f"/versions/{version}" if version not in (None, "") else ""
    return f"/v2/models/{model}{v}/infer"


class TritonHTTPTarget(HTTPTarget):
    """Triton ``/v2/models/<model>/infer`` with pre-encoded requests."""

    kind = "triton-http"

    def __init__(self, url: str, model: str, requests: Sequence[tuple[bytes, dict[str, str]]],
                 version: str | int | None = None, timeout: float = 30.0, name: str | None = None,
                 protocol_note: str = ""):
        self.model, self.version = model, version
        host, port, _ = http.split_url(url)
        super().__init__(url, _infer_path(model, version), "POST", [b for b, _ in requests],
                         timeout=timeout, name=name or f"Triton {model} (HTTP)")
        # Headers differ per request (binary header length), so encode each.
        self.bodies = list(requests)   # (body, headers) as built: servelab.bench.breakdown adds an id to each
        self.requests = [http.build_request("POST", host, port, self.path, b, h) for b, h in requests]
        self.protocol_note = protocol_note

    def describe(self) -> dict:
        d = super().describe()
        d.update(model=self.model, version=self.version, encoding=self.protocol_note)
        return d


RAW_IMAGE_INPUT = "IMAGE_BYTES"  # the ensemble's input: encoded image bytes, no base64


def triton_image_target(url: str, model: str = "food_classifier",
                        images: Sequence[bytes | str | Path] | None = None,
                        input_name: str = "INPUT_IMAGE", outputs: Sequence[str] = ("FOOD_LABEL", "PROBABILITY"),
                        version: str | int | None = None, binary: bool = True,
                        timeout: float = 30.0, batch: int = 1, raw: bool = False) -> TritonHTTPTarget:
    """A BYTES model taking base64-encoded images (``raw``: the files' own
    bytes, as the food_pipeline ensemble takes them), shape [batch, 1]: one
    image per request, or ``batch`` copies of it (a client-side batch)."""
    reqs = [triton_infer_body([(input_name, "BYTES", [batch, 1], [b if raw else base64.b64encode(b)] * batch)],
                              outputs, binary)
            for b in _read_images(images)]
    return TritonHTTPTarget(url, model, reqs, version, timeout,
                            protocol_note="binary" if binary else "json")


def triton_tensor_target(url: str, model: str = "food_classifier_onnx",
                         tensors: Sequence[np.ndarray] | None = None,
                         input_name: str = "input", outputs: Sequence[str] = ("output",),
                         datatype: str = "FP32", version: str | int | None = None,
                         binary: bool = True, timeout: float = 30.0, batch: int = 1) -> TritonHTTPTarget:
    """A tensor model; default tensors are the sample images, preprocessed.
    Each request carries one tensor, or ``batch`` copies of it."""
    if tensors is None:
        from servelab.core import food11
        tensors = [food11.preprocess(b) for b in default_images()]
    reqs = [triton_infer_body([(input_name, datatype, [batch, *np.shape(t)], np.stack([t] * batch))],
                              outputs, binary)
            for t in tensors]
    return TritonHTTPTarget(url, model, reqs, version, timeout,
                            protocol_note="binary" if binary else "json")


def model_metadata(url: str, model: str, timeout: float = 10.0) -> dict:
    """GET /v2/models/<model> (synchronous)."""
    import urllib.request
    host, port, _ = http.split_url(url)
    with urllib.request.urlopen(f"http://{host}:{port}/v2/models/{model}", timeout=timeout) as r:
        return json.loads(r.read())


def triton_target(url: str, model: str, version: str | int | None = None, binary: bool = True,
                  images: Sequence[bytes | str | Path] | None = None, timeout: float = 30.0,
                  seed: int = 0, batch: int = 1) -> TritonHTTPTarget:
    """Pick the payload from the model's metadata: images for a single BYTES
    input, preprocessed samples for FP32 [3,224,224], random data otherwise;
    ``batch`` items per request (a model with a batch dimension)."""
    meta = model_metadata(url, model)
    ins, outs = meta["inputs"], [o["name"] for o in meta.get("outputs", [])]
    if len(ins) != 1:
        raise ValueError(f"{model} has {len(ins)} inputs; build the requests with triton_infer_body")
    spec = ins[0]
    dims = [d for d in spec["shape"][1:]] if spec["shape"] and spec["shape"][0] == -1 else spec["shape"]
    if spec["datatype"] == "BYTES":  # IMAGE_BYTES (food_pipeline): the file's bytes; otherwise base64
        return triton_image_target(url, model, images, spec["name"], outs, version, binary, timeout, batch,
                                   raw=spec["name"] == RAW_IMAGE_INPUT)
    if spec["datatype"] == "FP32" and list(dims) == [3, 224, 224]:
        return triton_tensor_target(url, model, None, spec["name"], outs, "FP32", version, binary, timeout, batch)
    if any(d < 0 for d in dims):
        raise ValueError(f"{model} input {spec['name']} has variable dims {dims}; pass tensors explicitly")
    rng = np.random.default_rng(seed)
    dtype = _TRITON_TO_NP.get(spec["datatype"])
    if dtype is None:
        raise ValueError(f"unsupported input datatype {spec['datatype']}")
    tensors = [rng.random(dims).astype(dtype) for _ in range(4)]
    return triton_tensor_target(url, model, tensors, spec["name"], outs, spec["datatype"], version,
                                binary, timeout, batch)


# --- Triton gRPC -----------------------------------------------------------

class TritonGRPCTarget(Target):
    """Triton over gRPC with tritonclient's asyncio client (one channel per sender)."""

    kind = "triton-grpc"

    def __init__(self, url: str, model: str, inputs: Sequence[Sequence[tuple[str, str, Sequence[int], object]]],
                 outputs: Sequence[str] = (), version: str | int | None = None,
                 timeout: float = 30.0, name: str | None = None):
        self.url, self.model = url, model
        self.version = "" if version is None else str(version)
        self.timeout = timeout
        self.payloads = inputs
        self.outputs = list(outputs)
        self.name = name or f"Triton {model} (gRPC)"

    @classmethod
    def for_images(cls, url: str, model: str = "food_classifier", images=None,
                   input_name: str = "INPUT_IMAGE", outputs=("FOOD_LABEL", "PROBABILITY"), **kw):
        payloads = [[(input_name, "BYTES", [1, 1], [base64.b64encode(b)])] for b in _read_images(images)]
        return cls(url, model, payloads, outputs, **kw)

    @classmethod
    def for_tensors(cls, url: str, model: str = "food_classifier_onnx", tensors=None,
                    input_name: str = "input", outputs=("output",), **kw):
        if tensors is None:
            from servelab.core import food11
            tensors = [food11.preprocess(b) for b in default_images()]
        payloads = [[(input_name, "FP32", [1, *np.shape(t)], t)] for t in tensors]
        return cls(url, model, payloads, outputs, **kw)

    async def open(self):
        import tritonclient.grpc as grpcclient
        import tritonclient.grpc.aio as aio
        client = aio.InferenceServerClient(self.url)
        reqs = []
        for payload in self.payloads:
            ins = []
            for name, dtype, shape, data in payload:
                inp = grpcclient.InferInput(name, list(shape), dtype)
                arr = (np.array(list(data), dtype=np.object_).reshape(shape) if dtype == "BYTES"
                       else np.asarray(data, dtype=_TRITON_TO_NP[dtype]).reshape(shape))
                inp.set_data_from_numpy(arr)
                ins.append(inp)
            outs = [grpcclient.InferRequestedOutput(o) for o in self.outputs]
            reqs.append((ins, outs))
        return client, reqs

    async def call(self, session, i: int) -> str | None:
        from tritonclient.utils import InferenceServerException
        client, reqs = session
        ins, outs = reqs[i % len(reqs)]
        try:
            await client.infer(self.model, ins, model_version=self.version, outputs=outs,
                               client_timeout=self.timeout)
        except InferenceServerException as e:
            status = e.status() or "error"
            return f"gRPC {status}".replace("StatusCode.", "")
        return None

    async def close(self, session) -> None:
        await session[0].close()

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "url": self.url, "model": self.model,
                "version": self.version, "payloads": len(self.payloads)}


def grpc_target(url: str, model: str, version: str | int | None = None,
                images: Sequence[bytes | str | Path] | None = None, timeout: float = 30.0,
                seed: int = 0) -> TritonGRPCTarget:
    """Like ``triton_target`` over gRPC; the metadata comes from the gRPC API."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url)
    try:
        meta = client.get_model_metadata(model, "" if version is None else str(version), as_json=True)
    finally:
        client.close()
    ins, outs = meta["inputs"], [o["name"] for o in meta.get("outputs", [])]
    if len(ins) != 1:
        raise ValueError(f"{model} has {len(ins)} inputs; build the payloads yourself")
    spec = ins[0]
    shape = [int(d) for d in spec["shape"]]
    dims = shape[1:] if shape and shape[0] == -1 else shape
    kw = dict(version=version, timeout=timeout)
    if spec["datatype"] == "BYTES":
        return TritonGRPCTarget.for_images(url, model, images, spec["name"], outs, **kw)
    if spec["datatype"] == "FP32" and dims == [3, 224, 224]:
        return TritonGRPCTarget.for_tensors(url, model, None, spec["name"], outs, **kw)
    dtype = _TRITON_TO_NP.get(spec["datatype"])
    if dtype is None or any(d < 0 for d in dims):
        raise ValueError(f"cannot make data for input {spec['name']} {spec['datatype']} {dims}")
    rng = np.random.default_rng(seed)
    payloads = [[(spec["name"], spec["datatype"], [1, *dims], rng.random(dims).astype(dtype))] for _ in range(4)]
    return TritonGRPCTarget(url, model, payloads, outs, **kw)
