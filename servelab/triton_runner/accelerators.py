"""``optimization { execution_accelerators { ... } }`` for the kit's ONNX runner.

What Triton 24.10's onnxruntime backend accepts (``triton-inference-server/onnxruntime_backend``,
branch r24.10, ``src/onnxruntime.cc``, ``ModelInstanceState``'s session set-up; the names are
``kOpenVINOExecutionAccelerator`` = "openvino" and ``kTensorRTExecutionAccelerator`` = "tensorrt"
in the backend repository's ``backend_common.h``):

* ``cpu_execution_accelerator``: "openvino" alone, for every instance kind (the backend appends
  ONNX Runtime's OpenVINO execution provider with ``device_type = "CPU"`` and reads no
  parameters); any other name fails the load with "unknown Execution Accelerator '<name>' is
  requested". NGC 24.10 builds the backend with it on x86-64 (``server``'s ``build.py``, r24.10:
  ORT 1.19.2, ORT OpenVINO 2024.4.0).
* ``gpu_execution_accelerator``: read only for KIND_GPU / KIND_AUTO instances: "tensorrt" (its
  parameters: ``precision_mode`` FP32 / FP16 / INT8, ``max_workspace_size_bytes`` and ``trt_*``
  options) and "cuda" (CUDA provider options); any other name fails the same way. On a KIND_CPU
  instance the backend never looks at this list.

The runner honours what it can run and refuses the rest when the model loads, with a message that
names the accelerator; it never ignores one. Stricter than the backend where the backend ignores
something (parameters of "openvino", a GPU accelerator on a CPU instance): a learner who asked for
an accelerator is told it did not run. Runs on Python 3.8+ inside Triton's stub (no newer syntax).
"""

from __future__ import annotations

import collections

CPU_FIELD = "cpu_execution_accelerator"
GPU_FIELD = "gpu_execution_accelerator"
OPENVINO = "openvino"
BACKEND_CPU_NAMES = (OPENVINO,)             # r24.10 src/onnxruntime.cc, CPU execution providers
BACKEND_GPU_NAMES = ("tensorrt", "cuda")    # r24.10 src/onnxruntime.cc, GPU execution providers
OPENVINO_PIN = "openvino==2026.4.1"         # pyproject.toml's [onnx] extra
TRT_PRECISIONS = {"FP32": None, "FP16": "trt_fp16_enable", "INT8": "trt_int8_enable"}
TRT_RENAMED = {"max_workspace_size_bytes": "trt_max_workspace_size",
               "int8_calibration_table_name": "trt_int8_calibration_table_name",
               "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table"}

# cpu: "openvino" or None; gpu: (ONNX Runtime provider name, its options) or None.
Plan = collections.namedtuple("Plan", "cpu gpu")


class AcceleratorError(ValueError):
    """An accelerator the runner cannot honour: the model must not load."""


def requested(config):
    """``[(field, name, parameters)]`` in the config's order (Triton's JSON form of the config)."""
    eas = ((config.get("optimization") or {}).get("execution_accelerators") or {})
    found = []
    for field in (GPU_FIELD, CPU_FIELD):
        for entry in eas.get(field) or []:
            found.append((field, entry.get("name", ""), dict(entry.get("parameters") or {})))
    return found


def _unknown(model, field, name):
    known = BACKEND_CPU_NAMES if field == CPU_FIELD else BACKEND_GPU_NAMES
    return AcceleratorError(
        "{}: unknown Execution Accelerator '{}' is requested in {} (Triton 24.10's onnxruntime backend "
        "accepts {} there and fails the load on any other name); the model is not loaded".format(
            model, name, field, " or ".join("'{}'".format(k) for k in known)))


def _openvino(model, params, on_gpu, openvino_version):
    if params:
        raise AcceleratorError(
            "{}: cpu_execution_accelerator 'openvino' takes no parameters (Triton 24.10's onnxruntime backend "
            "reads none: it runs OpenVINO on device CPU); remove {}".format(model, sorted(params)))
    if on_gpu:
        raise AcceleratorError(
            "{}: cpu_execution_accelerator 'openvino' on a GPU instance: the kit's runner runs OpenVINO in place "
            "of ONNX Runtime, on the CPU only; give the model kind: KIND_CPU".format(model))
    if not openvino_version:
        raise AcceleratorError(
            "{}: cpu_execution_accelerator 'openvino' is requested but OpenVINO is not installed beside this "
            "runner (pip install {}); the model is not loaded".format(model, OPENVINO_PIN))
    return OPENVINO


def _tensorrt_options(model, params):
    options = {}
    for key, value in sorted(params.items()):
        if key == "precision_mode":
            if value not in TRT_PRECISIONS:
                raise AcceleratorError("{}: unsupported precision mode '{}' is requested for 'tensorrt' "
                                       "(FP32, FP16 or INT8)".format(model, value))
            if TRT_PRECISIONS[value]:
                options[TRT_PRECISIONS[value]] = "True"
        elif key in TRT_RENAMED or key.startswith("trt_"):
            options[TRT_RENAMED.get(key, key)] = str(value)
        else:
            raise AcceleratorError("{}: unknown parameter '{}' is requested for 'tensorrt'".format(model, key))
    return options


def _gpu(model, name, params, on_gpu, providers):
    if not on_gpu:
        raise AcceleratorError(
            "{}: gpu_execution_accelerator '{}' needs a GPU instance, and this one runs on the CPU (no GPU "
            "here, or kind: KIND_CPU). Triton 24.10's onnxruntime backend would skip the list on a CPU "
            "instance; the kit's runner refuses it instead of ignoring it: take it out, or run on a GPU".format(
                model, name))
    if name == "cuda":
        return ("CUDAExecutionProvider", dict((k, str(v)) for k, v in params.items()))
    if "TensorrtExecutionProvider" not in providers:
        raise AcceleratorError(
            "{}: gpu_execution_accelerator 'tensorrt' is requested but this onnxruntime has no TensorRT "
            "provider (it has {})".format(model, list(providers)))
    return ("TensorrtExecutionProvider", _tensorrt_options(model, params))


def plan(config, model, on_gpu=False, openvino_version=None, providers=()):
    """What the runner runs for ``config``'s accelerators, or AcceleratorError naming the one it cannot.

    ``on_gpu``: the instance runs on ONNX Runtime's CUDA provider; ``openvino_version``: the installed
    OpenVINO's (None: not installed); ``providers``: ``onnxruntime.get_available_providers()``."""
    cpu = gpu = None
    for field, name, params in requested(config):
        if field == CPU_FIELD:
            if name not in BACKEND_CPU_NAMES:
                raise _unknown(model, field, name)
            cpu = _openvino(model, params, on_gpu, openvino_version)
        else:
            if name not in BACKEND_GPU_NAMES:
                raise _unknown(model, field, name)
            gpu = _gpu(model, name, params, on_gpu, providers)
    return Plan(cpu, gpu)


def openvino_version():
    """The installed OpenVINO's version (e.g. "2026.4.1"), None where it is not installed."""
    try:
        import openvino
    except ImportError:
        return None
    return openvino.get_version().split("-")[0]


class _Named:
    def __init__(self, name):
        self.name = name


class OpenVINOSession:
    """The part of ``onnxruntime.InferenceSession`` the runner uses (``run``, ``get_inputs``,
    ``get_outputs``, ``get_providers``), on the OpenVINO runtime's CPU plugin.

    The OpenVINO runtime reads the ONNX file itself: the backend's OpenVINO execution provider hands
    this graph whole to the same runtime's CPU plugin, and ``onnxruntime-openvino`` cannot sit beside
    the kit's pinned ``onnxruntime`` (both install the ``onnxruntime`` package)."""

    def __init__(self, path, threads):
        import openvino as ov

        core = ov.Core()
        # f32: ONNX Runtime's OpenVINO provider runs the CPU at FP32; the plugin's own default on CPUs
        # with bf16 units would be bf16, and the logits would move. One request at a time per instance.
        compiled = core.compile_model(core.read_model(path), "CPU", {
            "INFERENCE_NUM_THREADS": int(threads), "INFERENCE_PRECISION_HINT": "f32",
            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
        self._request = compiled.create_infer_request()
        self._inputs = [_Named(i.get_any_name()) for i in compiled.inputs]
        self._outputs = [_Named(o.get_any_name()) for o in compiled.outputs]

    def get_inputs(self):
        return self._inputs

    def get_outputs(self):
        return self._outputs

    def get_providers(self):
        return ["OpenVINO CPU plugin"]

    def run(self, output_names, feeds):
        self._request.infer(feeds)  # the outputs stay in the request until the next run: copy them
        return [self._request.get_tensor(name).data.copy() for name in output_names]
