"""servelab's ONNX runner for Triton's Python backend (local target only).

Copied by ``servelab triton`` as ``<model>/1/model.py`` of a model whose
config in models_staging/ asks for ``backend: "onnxruntime"``, which the
Triton binary inside nvidia-pytriton does not have. In the lab's container
the real onnxruntime backend serves the same model from the same config.

Everything comes from the model config Triton passes in: input/output names
and dtypes, ``max_batch_size``, the instance (one ONNX Runtime session per
instance; Triton starts one stub process per instance) and its device.
Dynamic batching is Triton's own scheduler: ``execute`` receives the
requests it grouped and runs them as ONE ``session.run``.
``optimization { execution_accelerators { ... } }`` is honoured as the real
backend does, or the load fails naming the accelerator (accelerators.py):
``cpu_execution_accelerator [ { name: "openvino" } ]`` runs the file on the
OpenVINO runtime instead of ONNX Runtime.
Runs on Python 3.8+ (no newer syntax).
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

from servelab.serve import (
    threads,  # the kit's thread rule (servelab/ is on the stub's PYTHONPATH)
)
from servelab.triton_runner import accelerators  # optimization.execution_accelerators


def _instances(config):
    """Total model instances in the config (count per listed GPU, if any).
    Triton hands the backend its normalized config, where a KIND_GPU group
    lists every GPU it runs on (triton.instance_count counts any config)."""
    total = 0
    for group in config.get("instance_group", []) or [{"count": 1}]:
        total += int(group.get("count", 1)) * max(1, len(group.get("gpus", []) or []))
    return max(1, total)


def _onnx_file(config):
    """servelab records the ONNX file name in the config (default_model_filename is model.py)."""
    parameters = config.get("parameters") or {}
    return (parameters.get("servelab_onnx_file") or {}).get("string_value") or "model.onnx"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.inputs = [(i["name"], pb_utils.triton_string_to_numpy(i["data_type"])) for i in config["input"]]
        self.outputs = [(o["name"], pb_utils.triton_string_to_numpy(o["data_type"])) for o in config["output"]]

        filename = _onnx_file(config)
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        self._open_sessions(args, config, path)
        self._check_names(filename)
        self._warm_up(config)
        if self.plan.cpu == accelerators.OPENVINO:  # the accelerator that ran, by name, in Triton's log
            pb_utils.Logger.log_info(
                "{}: cpu_execution_accelerator openvino (OpenVINO {}), instance {}, sessions with {} thread(s)".format(
                    self.name, accelerators.openvino_version(), args["model_instance_name"], sorted(self.sessions)))
            return
        pb_utils.Logger.log_info(
            "{}: onnxruntime {} runner, sessions with {} thread(s), providers {}".format(
                args["model_instance_name"], ort.__version__, sorted(self.sessions), self.session.get_providers()))

    def _open_sessions(self, args, config, path):
        # Instances share the CPU cores (servelab/serve/threads.py): an instance
        # running alone gets every core, busy instances an equal share each.
        # A session's thread count is fixed, so one session per possible share
        # (2 on a 2-core machine). ONNX Runtime keeps its default wait (spin
        # briefly, then sleep): without spinning a lone batch-1 run was slower.
        self.cores = threads.CoreShare(group=self.name)
        shares = sorted({threads.share_of(self.cores.cores, busy) for busy in range(1, _instances(config) + 1)})
        providers = ["CPUExecutionProvider"]
        on_gpu = args["model_instance_kind"] == "GPU" and "CUDAExecutionProvider" in ort.get_available_providers()
        try:  # an accelerator the runner cannot run fails the load, naming it (never ignored)
            openvino = accelerators.openvino_version() if accelerators.requested(config) else None
            self.plan = accelerators.plan(config, self.name, on_gpu, openvino, ort.get_available_providers())
        except accelerators.AcceleratorError as err:
            raise pb_utils.TritonModelException(str(err))
        if on_gpu:
            device = {"device_id": int(args["model_instance_device_id"])}
            providers.insert(0, ("CUDAExecutionProvider", device))
            if self.plan.gpu:  # "cuda" with its options, or "tensorrt" in front of CUDA
                name, options = self.plan.gpu
                options = dict(options, **device)
                if name == "CUDAExecutionProvider":
                    providers[0] = (name, options)
                else:
                    providers.insert(0, (name, options))
            shares = [self.cores.cores]
        self.sessions = {}
        for n in shares:
            if self.plan.cpu == accelerators.OPENVINO:
                self.sessions[n] = accelerators.OpenVINOSession(path, n)
                continue
            options = ort.SessionOptions()
            options.intra_op_num_threads = n
            options.inter_op_num_threads = 1
            self.sessions[n] = ort.InferenceSession(path, options, providers=providers)
        self.session = self.sessions[shares[-1]]

    def _check_names(self, filename):
        # The config must describe the real model: fail the load, not a request.
        model_inputs = {i.name for i in self.session.get_inputs()}
        model_outputs = {o.name for o in self.session.get_outputs()}
        missing = [n for n, _ in self.inputs if n not in model_inputs] + \
                  [n for n, _ in self.outputs if n not in model_outputs]
        if missing:
            raise pb_utils.TritonModelException(
                "config.pbtxt names {} but {} has inputs {} and outputs {}".format(
                    missing, filename, sorted(model_inputs), sorted(model_outputs)))

    def _warm_up(self, config):
        """A few runs of the extra sessions (one per core share, a local
        device) before serving: the first runs allocate memory. The session an
        instance uses alone (every core) is left cold, as the real onnxruntime
        backend leaves its one session: the config's model_warmup warms it
        through execute() while the model loads, or the first requests pay."""
        sessions = [s for s in self.sessions.values() if s is not self.session]
        feeds = {}
        for spec, (name, dtype) in zip(config["input"], self.inputs):
            if dtype == np.object_:
                return  # string inputs: no meaningful dummy
            dims = [max(1, int(d)) for d in spec.get("dims", [])]
            feeds[name] = np.zeros(([1] if self.max_batch_size > 0 else []) + dims, dtype=dtype)
        for session in sessions:
            for _ in range(3):
                session.run([n for n, _ in self.outputs], feeds)

    def execute(self, requests):
        if self.max_batch_size == 0:
            return [self._run([request])[0] for request in requests]
        return self._run(requests)

    def _run(self, requests):
        # Triton has already checked names, dtypes and shapes against the config.
        feeds, sizes = {}, []
        for name, dtype in self.inputs:
            parts = [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests]
            feeds[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
            feeds[name] = np.ascontiguousarray(feeds[name], dtype=dtype)
            sizes = [p.shape[0] for p in parts]
        try:
            with self.cores.threads() as share:  # all cores alone, a share when instances run together
                session = self.sessions[max([t for t in self.sessions if t <= share] or [min(self.sessions)])]
                results = session.run([n for n, _ in self.outputs], feeds)
        except Exception as err:  # one failed run fails the requests in it, not the server
            runtime = "OpenVINO" if self.plan.cpu == accelerators.OPENVINO else "onnxruntime"
            error = pb_utils.TritonError("{} failed: {}".format(runtime, err))
            return [pb_utils.InferenceResponse(error=error) for _ in requests]

        responses, start = [], 0
        for size in sizes:
            if self.max_batch_size == 0:
                chunk = results
            else:
                chunk = [r[start:start + size] for r in results]
            start += size
            tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value, dtype=dtype))
                       for (name, dtype), value in zip(self.outputs, chunk)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self):
        self.session = self.sessions = None
        self.cores.close()
