"""The ``djl_python`` names lmiserve does not provide, and what to use instead.

An import hook placed last on ``sys.meta_path`` turns an import of any missing
``djl_python.*`` module into an ImportError carrying that advice.
"""

from __future__ import annotations

import importlib.abc
import sys

SUPPORTED = (
    "djl_python.Input, djl_python.Output, djl_python.inputs, djl_python.outputs, "
    "djl_python.output_formatter.output_formatter, djl_python.input_parser.input_formatter, "
    "djl_python.request_io (TextGenerationOutput, Token, Sequence, RequestInput, TextInput)"
)

_ENGINE = (
    "lmiserve serves the model with its own engine: leave option.entryPoint unset and give model.py no handle() "
    "(only @output_formatter/@input_formatter functions), and choose the backend with option.rolling_batch"
)

ADVICE = {
    "rolling_batch": "lmiserve's continuous batching is not importable. " + _ENGINE,
    "properties_manager": (
        "read the model's configuration from the Input of the first handle() call (inputs.get_properties()), "
        "or set it in serving.properties"
    ),
    "huggingface": "the built-in Hugging Face handler is not importable. " + _ENGINE,
    "lmi_vllm": "the built-in vLLM handler is not importable; use option.rolling_batch=vllm. " + _ENGINE,
    "tensorrt_llm": "TensorRT-LLM is not supported; use option.rolling_batch=lmi or vllm",
    "lmi_trtllm": "TensorRT-LLM is not supported; use option.rolling_batch=lmi or vllm",
    "transformers_neuronx": "AWS Neuron is not supported; use option.rolling_batch=lmi, npu or vllm",
    "neuron_utils": "AWS Neuron is not supported; use option.rolling_batch=lmi, npu or vllm",
    "deepspeed": "DeepSpeed is not supported; use option.tensor_parallel_degree with option.rolling_batch=lmi",
    "chat_completions": 'send OpenAI chat bodies ({"messages": [...]}) to /invocations or /v1/chat/completions',
    "encode_decode": "read bodies with Input.get_as_json()/get_as_string() and write them with Output.add_as_json()",
    "service_loader": "name the handler with option.entryPoint and option.handler",
    "sm_inference": "define model_fn/input_fn/predict_fn/output_fn in model.py or inference.py",
}


def unsupported_message(name: str) -> str:
    """Why ``djl_python.<name>`` cannot be imported, and what to use instead."""
    top = name.split(".")[0]
    advice = ADVICE.get(top, "")
    head = f"djl_python.{name} is not provided by lmiserve"
    return f"{head}: {advice}. Supported: {SUPPORTED}" if advice else f"{head}. Supported: {SUPPORTED}"


class _Unsupported(importlib.abc.MetaPathFinder):
    """Consulted only after every other finder: a ``djl_python`` submodule that does not exist."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname.startswith("djl_python."):
            name = fullname[len("djl_python.") :]
            raise ModuleNotFoundError(unsupported_message(name), name=fullname)
        return None


def install() -> None:
    if not any(isinstance(f, _Unsupported) for f in sys.meta_path):
        sys.meta_path.append(_Unsupported())
