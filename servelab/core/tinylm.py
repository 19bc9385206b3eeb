"""The small decoder that the token-streaming lesson serves (models_streaming/).

A GPT-style transformer (token and position embeddings, pre-norm attention and MLP blocks, a
key/value cache) whose weights are random numbers from a fixed seed: nothing can be downloaded
here, so, as with the vision model's demo weights, the latency is real and the text is not.

A token is one byte of UTF-8 text (256 tokens), so no tokenizer is needed either.

Decoding is greedy, and on the CPU the arithmetic is float64: a step's result then does not
depend on which other requests share its batch (float32 matrix products may round differently
for another batch size, and a near tie between two logits could pick another token). Both
schedulers of the lesson must produce the same tokens for the same prompt.

Two sizes (``SIZES``): a small one that a laptop's CPU decodes in a millisecond or two per step,
and GPT-2 small's shape (12 layers, 768 wide, 12 heads: n_layer, n_embd and n_head in the
``gpt2`` checkpoint's config.json on Hugging Face) in FP16 on a GPU, such as the node's P100.
``for_instance`` picks the one a Triton model instance serves. In FP16 a step's rounding can
depend on the batch, so there the two schedulers' tokens may part after a near tie: the lesson
reports how many requests agree instead of promising all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

VOCAB = 256
NOTE = "a decoder with deterministic random weights: latency is real, the text is not"


@dataclass(frozen=True)
class Size:
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    max_prompt: int = 256       # bytes
    max_new_tokens: int = 512   # per request

    @property
    def context(self) -> int:
        return self.max_prompt + self.max_new_tokens


SIZES = {
    "cpu": Size(),                                       # ~0.9 M weights: 1-2 ms a step on one core
    "gpu": Size(d_model=768, n_layers=12, n_heads=12),   # GPT-2 small's shape, 85.9 M weights
}


def for_instance(kind: str, device_id: int = 0) -> "TinyDecoder":
    """The decoder a Triton model instance serves: ``kind`` is the Python backend's
    ``args["model_instance_kind"]`` ("CPU" or "GPU"), ``device_id`` its GPU."""
    if kind == "GPU":
        return TinyDecoder(SIZES["gpu"], device=f"cuda:{device_id}", dtype=torch.float16)
    return TinyDecoder(SIZES["cpu"])


def describe(decoder: "TinyDecoder") -> str:
    s = decoder.size
    return (f"{s.n_layers} layers, {s.d_model} wide, {s.n_heads} heads, {str(decoder.dtype).split('.')[-1]} "
            f"on {decoder.device}")


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens) -> str:
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def check_request(prompt: bytes, max_tokens: int, size: Size = Size()) -> str | None:
    """Why a request cannot be served (a message for the client), or None."""
    if len(prompt) == 0:
        return "the prompt is empty"
    if len(prompt) > size.max_prompt:
        return f"the prompt is {len(prompt)} bytes; at most {size.max_prompt}"
    if not 1 <= max_tokens <= size.max_new_tokens:
        return f"max_tokens is {max_tokens}; it must be 1 to {size.max_new_tokens}"
    return None


class TinyDecoder(torch.nn.Module):
    """``prefill(prompt)`` starts a request: its cache and first token. ``step(caches, tokens)``
    decodes one more token for each request of a batch, whatever their lengths."""

    def __init__(self, size: Size = Size(), seed: int = 0, device: str = "cpu",
                 dtype: torch.dtype = torch.float64):
        super().__init__()
        self.size = size
        d, g = size.d_model, torch.Generator().manual_seed(seed)

        def rand(*shape, std):
            return torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=torch.float64) * std,
                                      requires_grad=False)

        self.tok = rand(VOCAB, d, std=1.0)
        # An output matrix of its own, of unit scale: logits (layer-normed input) differ by whole
        # units, far from ties; tied to self.tok, every prompt would soon repeat one token.
        self.head = rand(d, VOCAB, std=1.0)
        self.pos = rand(size.context, d, std=1.0)   # as large as a token's: outputs vary along the stream
        self.layers = torch.nn.ModuleList()
        for _ in range(size.n_layers):
            layer = torch.nn.Module()
            layer.qkv = rand(d, 3 * d, std=1 / math.sqrt(d))
            layer.proj = rand(d, d, std=1 / math.sqrt(d))
            layer.up = rand(d, 4 * d, std=1 / math.sqrt(d))
            layer.down = rand(4 * d, d, std=1 / math.sqrt(4 * d))
            self.layers.append(layer)
        # Only printable ASCII is generated (bytes 32 to 126): the stream is readable, if meaningless.
        self.printable = torch.full((VOCAB,), -math.inf, dtype=torch.float64)
        self.printable[32:127] = 0.0
        self.printable = torch.nn.Parameter(self.printable, requires_grad=False)
        self.to(device=device, dtype=dtype)
        self.device, self.dtype = torch.device(device), dtype

    def _heads(self, x):  # (..., n, d) -> (..., heads, n, d / heads)
        *lead, n, d = x.shape
        h = self.size.n_heads
        return x.reshape(*lead, n, h, d // h).transpose(-3, -2)

    def _merge(self, x):  # (..., heads, n, dh) -> (..., n, d)
        *lead, h, n, dh = x.shape
        return x.transpose(-3, -2).reshape(*lead, n, h * dh)

    def _logits_to_token(self, x):
        x = torch.nn.functional.layer_norm(x, x.shape[-1:])
        return (x @ self.head + self.printable).argmax(-1)

    @torch.inference_mode()
    def prefill(self, prompt: list[int]) -> tuple[list, int]:
        """One request's prompt, all positions at once: its cache (per layer, keys and values of
        shape (heads, length, d / heads)) and the first generated token."""
        n = len(prompt)
        x = self.tok[torch.tensor(prompt, device=self.device)] + self.pos[:n]
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        cache = []
        for layer in self.layers:
            q, k, v = (self._heads(t) for t in (torch.nn.functional.layer_norm(x, x.shape[-1:])
                                                @ layer.qkv).split(x.shape[-1], -1))
            cache.append((k, v))
            att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal)
            x = x + self._merge(att) @ layer.proj
            x = x + torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, x.shape[-1:]) @ layer.up) @ layer.down
        return cache, int(self._logits_to_token(x[-1]))

    @torch.inference_mode()
    def step(self, caches: list[list], tokens: list[int]) -> tuple[list[list], list[int]]:
        """One decoding step for a batch of requests: ``caches[i]`` and ``tokens[i]`` (its last
        token) of request i. Caches of different lengths are padded and masked."""
        lengths = [c[0][0].shape[-2] for c in caches]
        longest, b = max(lengths), len(caches)
        pos = torch.tensor(lengths, device=self.device)
        x = (self.tok[torch.tensor(tokens, device=self.device)] + self.pos[pos]).unsqueeze(1)   # (b, 1, d)
        # position j of request i is real when j < its length; the new token (last) always is
        seen = torch.arange(longest + 1, device=self.device).unsqueeze(0) < pos.unsqueeze(1) + 0
        seen[:, -1] = True
        mask = seen[:, None, None, :]                                                         # (b, 1, 1, L+1)
        new_caches = [[] for _ in range(b)]
        for li, layer in enumerate(self.layers):
            q, k, v = (self._heads(t) for t in (torch.nn.functional.layer_norm(x, x.shape[-1:])
                                                @ layer.qkv).split(x.shape[-1], -1))  # (b, h, 1, dh)
            keys = torch.zeros(b, *k.shape[1:2], longest + 1, k.shape[-1], dtype=self.dtype, device=self.device)
            values = torch.zeros_like(keys)
            for i, c in enumerate(caches):
                ck, cv = c[li]
                keys[i, :, :lengths[i]], values[i, :, :lengths[i]] = ck, cv
                new_caches[i].append((torch.cat([ck, k[i]], -2), torch.cat([cv, v[i]], -2)))
            keys[:, :, -1:], values[:, :, -1:] = k, v
            att = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + self._merge(att) @ layer.proj
            x = x + torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, x.shape[-1:]) @ layer.up) @ layer.down
        return new_caches, [int(t) for t in self._logits_to_token(x[:, 0])]

    def generate(self, prompt: list[int], max_tokens: int) -> list[int]:
        """The plainest greedy loop, one request alone: the reference both schedulers must match."""
        cache, token = self.prefill(prompt)
        out = [token]
        while len(out) < max_tokens:
            (cache,), (token,) = self.step([cache], [token])
            out.append(token)
        return out
