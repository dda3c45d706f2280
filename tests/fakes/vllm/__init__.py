"""A stand-in for vLLM in tests: the slice of its public API that lmiserve's vLLM backend uses,
with deterministic generation and a record of what it was asked.

Set by environment variables (read when the engine is built):

- ``FAKE_VLLM_LOG``: a file that receives one JSON line per event (``engine_args``, ``generate``
  with the request's sampling parameters, ``abort``, ``closed``, ``shutdown``).
- ``FAKE_VLLM_EOS_AFTER``: the N-th generated token is the model's EOS token (0: never).
- ``FAKE_VLLM_DELAY``: seconds between two tokens.
- ``FAKE_VLLM_DIE_AFTER``: the engine dies while serving its N-th request (0: never).
- ``FAKE_VLLM_FAIL_START``: building the engine raises with this message.
- ``FAKE_VLLM_HOLD_START``: a file; building the engine waits while it exists.

Like vLLM, ``generate`` refuses (ValueError) a structured-outputs regex that does not compile.

Token ``i`` of a prompt is ``4 + (sum(prompt) + seed + i) % (vocab_size - 4)`` (the seed counts
only when sampling), so it is never one of the tiny test tokenizer's special tokens. Its
log-probability is ``-0.5 - (token % 4) / 8``, so sequences of different seeds rank differently.
"""

from .engine.arg_utils import AsyncEngineArgs
from .engine.async_llm_engine import AsyncLLMEngine
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams

__version__ = "0.0.0+fake"

__all__ = ["AsyncEngineArgs", "AsyncLLMEngine", "CompletionOutput", "RequestOutput", "SamplingParams"]
