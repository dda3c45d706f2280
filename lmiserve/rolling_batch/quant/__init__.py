"""Quantized weights: their canonical layouts, the checkpoint formats read into them, and the
schemes ``option.quantize`` and a checkpoint's ``quantization_config`` name."""
