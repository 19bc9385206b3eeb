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
Runs on Python 3.8+ (no newer syntax).
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


def _instances(config):
    """Total model instances in the config (count per listed GPU, if any)."""
    total = 0
    for group in config.get("instance_group", []) or [{"count": 1}]:
        total += int(group.get("count", 1)) * max(1, len(group.get("gpus", []) or []))
    return max(1, total)


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.inputs = [(i["name"], pb_utils.triton_string_to_numpy(i["data_type"])) for i in config["input"]]
        self.outputs = [(o["name"], pb_utils.triton_string_to_numpy(o["data_type"])) for o in config["output"]]

        # servelab records the ONNX file name here (default_model_filename is model.py).
        parameters = config.get("parameters") or {}
        filename = (parameters.get("servelab_onnx_file") or {}).get("string_value") or "model.onnx"
        path = os.path.join(args["model_repository"], args["model_version"], filename)

        # Instances share the CPU cores: give each an equal slice, so two
        # instances do not run 2 x all-cores threads and thrash.
        threads = max(1, _cores() // _instances(config))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Idle threads sleep instead of spinning: on a few shared cores a
        # spinning pool steals the CPU that Triton and the clients need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        if args["model_instance_kind"] == "GPU" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": int(args["model_instance_device_id"])}))
        self.session = ort.InferenceSession(path, options, providers=providers)

        # The config must describe the real model: fail the load, not a request.
        model_inputs = {i.name for i in self.session.get_inputs()}
        model_outputs = {o.name for o in self.session.get_outputs()}
        missing = [n for n, _ in self.inputs if n not in model_inputs] + \
                  [n for n, _ in self.outputs if n not in model_outputs]
        if missing:
            raise pb_utils.TritonModelException(
                "config.pbtxt names {} but {} has inputs {} and outputs {}".format(
                    missing, filename, sorted(model_inputs), sorted(model_outputs)))
        pb_utils.Logger.log_info(
            "{}: onnxruntime {} runner, {} thread(s), providers {}".format(
                args["model_instance_name"], ort.__version__, threads, self.session.get_providers()))

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
            results = self.session.run([n for n, _ in self.outputs], feeds)
        except Exception as err:  # one failed run fails the requests in it, not the server
            error = pb_utils.TritonError("onnxruntime failed: {}".format(err))
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        pb_utils.Logger.log_verbose("{}: ran a batch of {} from {} request(s)".format(
            self.name, sum(sizes), len(requests)))

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
        self.session = None
