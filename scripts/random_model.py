#!/usr/bin/env python3
"""Write a random-weight model of a named shape, with SmolLM2's tokenizer, for speed work.

    python scripts/random_model.py llama-1b /tmp/llama-1b [--dtype bf16] [--quantize fp8|awq|gptq]
        [--tokenizer DIR]

Random weights time exactly like trained ones as long as requests use ``ignore_eos`` (the
outputs are noise). Shapes: ``smollm2`` (the embedded model's shape), ``llama-1b``
(Llama-3.2-1B's: hidden 2048, 16 layers, 32/8 heads, intermediate 8192), ``llama-8b``
(Llama-3.1-8B's: hidden 4096, 32 layers, 32/8 heads, intermediate 14336), ``mixtral-small`` (a
Mixtral layout that fits one GPU: hidden 2048, 16 layers, 16/8 heads, 8 experts of intermediate
5632, top 2), ``olmoe-1b-7b`` (OLMoE-1B-7B's: hidden 2048, 16 layers, 16 heads, 64 experts of
intermediate 1024, top 8), ``phi3-mini`` (Phi-3-mini's, as ``Phi3ForCausalLM`` with fused QKV and
gate/up: hidden 3072, 32 layers, 32 heads, intermediate 8192, no rope scaling), ``gemma2-2b``
(Gemma-2-2B's: hidden 2304, 26 layers alternating sliding-window and global attention, 8/4 heads
of 256, intermediate 9216, score and logit caps). The vocabulary is SmolLM2's (49,152 tokens), so
its tokenizer serves every shape. ``--tokenizer`` takes SmolLM2's tokenizer from a directory
(one saved with ``save_pretrained``, about 3.5 MiB) where the embedded model is not installed.

``--quantize`` writes the decoder layers' projections quantized as the usual tools write them
(:mod:`lmiserve.rolling_batch.quant.writers`): ``awq`` AutoAWQ GEMM, 4-bit with zero points;
``gptq`` GPTQ v1, 4-bit symmetric, no act-order; ``fp8`` compressed-tensors float-quantized
(llm-compressor's FP8_DYNAMIC: e4m3 per output channel, dynamic per-token activations). AWQ and
GPTQ use groups of 128 input rows, or the largest of 64 and 32 that divides every layer's inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHAPES = {
    "smollm2": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    intermediate_size=1536, tie_word_embeddings=True, rope_theta=100000.0),
    "llama-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     intermediate_size=8192, tie_word_embeddings=True, rope_theta=500000.0),
    "llama-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                     intermediate_size=14336, tie_word_embeddings=False, rope_theta=500000.0),
    "mixtral-small": dict(config="MixtralConfig", hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
                          num_key_value_heads=8, intermediate_size=5632, num_local_experts=8, num_experts_per_tok=2,
                          tie_word_embeddings=False, rope_theta=1000000.0),
    "olmoe-1b-7b": dict(config="OlmoeConfig", hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
                        num_key_value_heads=16, intermediate_size=1024, num_experts=64, num_experts_per_tok=8,
                        norm_topk_prob=False, tie_word_embeddings=False, rope_theta=10000.0),
    "phi3-mini": dict(config="Phi3Config", hidden_size=3072, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, intermediate_size=8192, tie_word_embeddings=False,
                      rope_theta=10000.0),
    "gemma2-2b": dict(config="Gemma2Config", hidden_size=2304, num_hidden_layers=26, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=256, intermediate_size=9216, tie_word_embeddings=True,
                      rope_theta=10000.0, rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=4096,
                      attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
}  # fmt: skip
"""Each shape's config fields; ``config`` names the transformers config class (LlamaConfig if absent)."""


def build(
    shape: str, out: Path, dtype: str = "bf16", max_position_embeddings: int = 8192, tokenizer_dir: Path | None = None
) -> Path:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmiserve.devices import torch_dtype
    from lmiserve.model_store import DEFAULT_MODEL_ID, resolve_model

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or resolve_model(DEFAULT_MODEL_ID, Path.cwd()))
    fields = dict(SHAPES[shape])
    config_class = getattr(transformers, fields.pop("config", "LlamaConfig"))
    if config_class is transformers.Phi3Config:  # no LongRoPE: the original length is the whole
        fields["original_max_position_embeddings"] = max_position_embeddings
    fields.setdefault("rms_norm_eps", 1e-5)
    config = config_class(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **fields,
    )
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config).to(torch_dtype(dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def quantize(out: Path, fmt: str) -> int:
    """The checkpoint in ``out`` rewritten with its projections quantized in ``fmt``; the group size."""
    from lmiserve.rolling_batch.quant.writers import write_quantized

    config = json.loads((out / "config.json").read_text())
    widths = (config["hidden_size"], config["intermediate_size"])
    group_size = next((g for g in (128, 64, 32) if all(w % g == 0 for w in widths)), -1)
    write_quantized(out, out, fmt, group_size=group_size)
    return group_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--quantize", choices=["fp8", "awq", "gptq"], default=None)
    parser.add_argument(
        "--tokenizer", type=Path, default=None, help="SmolLM2's tokenizer (default: the embedded model's)"
    )
    args = parser.parse_args(argv)
    path = build(args.shape, args.out, args.dtype, tokenizer_dir=args.tokenizer)
    if args.quantize:
        group_size = quantize(path, args.quantize)
        print(f"quantized: {args.quantize}" + (f" g{group_size}" if args.quantize != "fp8" else ""), file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
