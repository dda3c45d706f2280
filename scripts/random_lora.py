#!/usr/bin/env python3
"""Write random LoRA adapters in PEFT's format for a model directory, for speed work.

    python scripts/random_lora.py OUT_DIR [--model DIR] [--rank 16] [--count 4] [--modules all]

Each ``OUT_DIR/adapter-N/`` holds an ``adapter_config.json`` and an ``adapter_model.safetensors``
adapting every projection (``--modules all``; or a comma-separated list such as ``q_proj,v_proj``)
of every layer at ``--rank``. The weights are random, so the outputs are noise, but they cost
exactly what trained ones cost. Without ``--model``, the embedded default model (SmolLM2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build(model_dir: Path, out: Path, rank: int, modules: list[str], seed: int) -> Path:
    import torch
    from safetensors.torch import save_file

    from lmiserve.rolling_batch.lora.peft_weights import module_shapes
    from lmiserve.rolling_batch.models.architectures import spec_from_config
    from lmiserve.rolling_batch.models.spec import read_config

    spec = spec_from_config(read_config(model_dir))
    shapes = module_shapes(spec)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for module in modules:
            fan_in, fan_out = shapes[module]
            block = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, fan_in, generator=g) / fan_in**0.5).bfloat16()
            tensors[f"{key}.lora_B.weight"] = (torch.randn(fan_out, rank, generator=g) * 0.01).bfloat16()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": modules,
        "bias": "none",
        "base_model_name_or_path": str(model_dir),
        "task_type": "CAUSAL_LM",
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded SmolLM2)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--modules", default="all", help="all, or a comma-separated list of projections")
    args = parser.parse_args(argv)
    if args.model is None:
        from lmiserve.model_store import DEFAULT_MODEL_ID, resolve_model

        args.model = resolve_model(DEFAULT_MODEL_ID, Path.cwd())
    modules = ALL if args.modules == "all" else [m.strip() for m in args.modules.split(",") if m.strip()]
    for i in range(args.count):
        print(build(args.model, args.out / f"adapter-{i + 1}", args.rank, modules, seed=i))
    return 0


if __name__ == "__main__":
    sys.exit(main())
