"""Token streaming with request-level batching: take a batch, decode it to the end, repeat.

execute() gets the batch Triton's dynamic batcher formed (config.pbtxt). Every request is
decoded one token per step, all of them together; a request that reaches its length gets its
last token (flag FINAL) and leaves, but the batch goes on until its longest request is done.
Requests that arrived meanwhile wait in Triton's queue the whole time: head-of-line blocking.
The decoder (servelab.core.tinylm) has random weights: latency is real, the text is not.
"""

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from servelab.core import tinylm


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)   # one core per model instance
        # A GPU instance (the node) serves GPT-2 small's shape in FP16, a CPU instance a small decoder in float64
        self.decoder = tinylm.for_instance(args["model_instance_kind"], int(args["model_instance_device_id"]))
        pb_utils.Logger.log_info(f"{args['model_instance_name']}: {tinylm.describe(self.decoder)}")

    def execute(self, requests):
        live = []   # [request, its sender, cache, last token, tokens left]
        for request in requests:
            sender = request.get_response_sender()
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy().reshape(-1)[0]
            max_tokens = int(pb_utils.get_input_tensor_by_name(request, "MAX_TOKENS").as_numpy().reshape(-1)[0])
            problem = tinylm.check_request(prompt, max_tokens)
            if problem:   # an error response ends this request's stream; the others go on
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(problem, pb_utils.TritonError.INVALID_ARG)),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            cache, token = self.decoder.prefill(list(prompt))
            live.append([request, sender, cache, token, max_tokens])
        while live:
            still = []
            for entry in live:
                request, sender, cache, token, left = entry
                if request.is_cancelled():   # the client went away: stop decoding for it
                    pb_utils.Logger.log_info(f"cancelled by its client with {left} token(s) to go")
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                left -= 1
                out = pb_utils.Tensor("TOKEN", np.array([token], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if left == 0 else 0)
                if left:
                    entry[4] = left
                    still.append(entry)
            live = still
            if live:   # one step for every request still in the batch
                caches, tokens = self.decoder.step([e[2] for e in live], [e[3] for e in live])
                for entry, cache, token in zip(live, caches, tokens):
                    entry[2], entry[3] = cache, token
        return None   # decoupled: every answer went through a response sender
