"""Weights as an engine loads them: the canonical layouts of quantized weights, the checkpoint
files and formats read into them (safetensors, GGUF, AWQ, GPTQ, compressed-tensors, FP8), the
pieces a tensor-parallel rank reads, and the schemes ``option.quantize`` and a checkpoint's
``quantization_config`` name."""
