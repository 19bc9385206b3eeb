"""Token streaming with iteration-level (continuous) batching: one decoding step per execute().

Triton's iterative sequence scheduler (config.pbtxt) calls execute() with the requests that
are ready now: new ones (START = 1) and those this model handed back after their previous
token. Each gets one token; a finished request is released, an unfinished one is rescheduled
and joins the next batch beside whatever arrived meanwhile. No request waits for a longer one.
The decoder (servelab.core.tinylm) has random weights: latency is real, the text is not.
"""

import time

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from servelab.core import tinylm

STALE_AFTER_S = 5.0


class TritonPythonModel:
    def initialize(self, args):
        torch.set_num_threads(1)   # one core per model instance
        # A GPU instance (the node) serves GPT-2 small's shape in FP16, a CPU instance a small decoder in float64
        self.decoder = tinylm.for_instance(args["model_instance_kind"], int(args["model_instance_device_id"]))
        pb_utils.Logger.log_info(f"{args['model_instance_name']}: {tinylm.describe(self.decoder)}")
        self.state = {}   # sequence id -> [cache, last token, tokens left, when it last had a step]

    def execute(self, requests):
        # A client that disconnects while its request waits to be rescheduled: Triton cancels that
        # request and never hands it back, so its state would stay here for good. Every live
        # sequence is in every batch (max_candidate_sequences = max_batch_size): one idle this
        # long is gone.
        for seq in [s for s, st in self.state.items() if time.monotonic() - st[3] > STALE_AFTER_S]:
            pb_utils.Logger.log_info(f"sequence {seq}: cancelled by its client with {self.state.pop(seq)[2]} "
                                     f"token(s) to go (no step for {STALE_AFTER_S} s); its state is freed")
        live = []   # sequence ids that get another step
        for request in requests:
            sender = request.get_response_sender()
            seq = int(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().reshape(-1)[0])
            if pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0]:
                prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy().reshape(-1)[0]
                max_tokens = int(pb_utils.get_input_tensor_by_name(request, "MAX_TOKENS").as_numpy().reshape(-1)[0])
                problem = tinylm.check_request(prompt, max_tokens)
                if problem:   # an error response ends this stream; the request is released
                    sender.send(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(problem, pb_utils.TritonError.INVALID_ARG)),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                cache, token = self.decoder.prefill(list(prompt))
                self.state[seq] = [cache, token, max_tokens, time.monotonic()]
            if request.is_cancelled():   # the client went away: forget it
                left = self.state.pop(seq)[2]
                pb_utils.Logger.log_info(f"cancelled by its client with {left} token(s) to go")
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            state = self.state[seq]
            state[2] -= 1
            out = pb_utils.Tensor("TOKEN", np.array([state[1]], dtype=np.int32))
            if state[2] == 0:   # its last token: answer FINAL, and the request leaves for good
                del self.state[seq]
                sender.send(pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:               # more to come: back to the scheduler after this step
                sender.send(pb_utils.InferenceResponse([out]))
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                live.append(seq)
        if live:   # one step for every request that stays
            caches, tokens = self.decoder.step([self.state[s][0] for s in live], [self.state[s][1] for s in live])
            for seq, cache, token in zip(live, caches, tokens):
                self.state[seq][:2], self.state[seq][3] = (cache, token), time.monotonic()
        return None   # decoupled: every answer went through a response sender
