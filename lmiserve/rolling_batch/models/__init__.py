"""Our implementations of common decoder families, over the device ops.

One generic decoder covers the Llama family (Llama 2/3, SmolLM2, TinyLlama, Mistral), Qwen2/2.5
and Qwen3; what differs between them is declared in :class:`~.spec.ModelSpec`. Gemma 2 and Gemma 3
(text) have a class of their own (:mod:`.gemma`), picked by :func:`.registry.decoder_class`; which
spec reader an architecture name takes is :mod:`.architectures`'.
"""

from .architectures import ARCHITECTURES, spec_from_config, supported
from .spec import ModelSpec, UnsupportedModel

__all__ = ["ARCHITECTURES", "ModelSpec", "UnsupportedModel", "spec_from_config", "supported"]
