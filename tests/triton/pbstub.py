"""A stand-in for Triton's ``triton_python_backend_utils``, with the names the lab's Python-backend
model files use, so a test can run a ``model.py`` as the backend runs it (initialize, then execute
with a list of requests): a request is a dict of input arrays by name, a response a dict (its output
tensors by name, or its error)."""

from __future__ import annotations

import types


class Tensor:
    def __init__(self, name, array):
        self.name, self.array = name, array

    def as_numpy(self):
        return self.array


class TritonError(Exception):
    INVALID_ARG = 3

    def __init__(self, message, code=0):
        super().__init__(message)
        self.code = code


def stand_in(logged: list[str] | None = None) -> types.ModuleType:
    """The module; ``logged`` (if given) collects what the model logs."""
    log = logged.append if logged is not None else (lambda msg: None)
    pb_utils = types.ModuleType("triton_python_backend_utils")
    pb_utils.Tensor = Tensor
    pb_utils.get_input_tensor_by_name = lambda request, name: Tensor(name, request[name])
    pb_utils.InferenceResponse = lambda output_tensors=(), error=None: (
        {"error": error} if error is not None else {t.name: t.array for t in output_tensors})
    pb_utils.TritonError = TritonError
    pb_utils.Logger = types.SimpleNamespace(log_info=log, log_warn=log)
    return pb_utils
