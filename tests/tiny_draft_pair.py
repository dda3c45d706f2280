"""A tiny random target model and a draft model built to agree with it often, for speculative decoding.

The target is a Llama of ``target_layers`` layers whose layers past the draft's first ones add
little (their attention and MLP output projections scaled by ``upper_scale``); the draft is the
target's first ``draft_layers`` layers with the same embeddings, final norm and LM head. Their
greedy continuations therefore mostly agree, and where the upper layers tip a near tie they
differ, so proposals are both accepted and rejected. The target is several times the draft's
size, so a step of the draft costs a fraction of the target's on a CPU too.

    python tests/tiny_draft_pair.py TARGET_DIR DRAFT_DIR [--seed N] [--hidden 512] [--layers 8]
        [--draft-layers 1] [--upper-scale 0.04]

Nothing is downloaded: the tokenizer is :func:`tests.tiny_models.build_tokenizer`'s.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository's root holds the tests package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_pair(
    target_dir: Path | str,
    draft_dir: Path | str,
    seed: int = 0,
    *,
    hidden_size: int = 512,
    target_layers: int = 8,
    draft_layers: int = 1,
    upper_scale: float = 0.04,
    max_position_embeddings: int = 2048,
) -> tuple[Path, Path]:
    """Write the target and the draft (config.json, safetensors, tokenizer) to the two
    directories; returns them."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.tiny_models import build_tokenizer

    target_dir, draft_dir = Path(target_dir), Path(draft_dir)
    if not 0 < draft_layers < target_layers:
        raise ValueError(f"draft_layers must be between 1 and {target_layers - 1}, got {draft_layers}")
    tokenizer = build_tokenizer(target_dir)
    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 11 // 4,
        num_attention_heads=max(1, hidden_size // 64),
        num_key_value_heads=max(1, hidden_size // 128),
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=0.05,
    )
    torch.manual_seed(seed)
    target = LlamaForCausalLM(LlamaConfig(**shape, num_hidden_layers=target_layers)).eval()
    with torch.no_grad():
        for layer in target.model.layers[draft_layers:]:
            layer.self_attn.o_proj.weight.mul_(upper_scale)
            layer.mlp.down_proj.weight.mul_(upper_scale)
    target.save_pretrained(target_dir)
    draft = LlamaForCausalLM(LlamaConfig(**shape, num_hidden_layers=draft_layers)).eval()
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.")}
    for i in range(draft_layers):
        prefix = f"model.layers.{i}."
        state.update({k: v for k, v in target.state_dict().items() if k.startswith(prefix)})
    draft.load_state_dict(state)
    draft.save_pretrained(draft_dir)
    for name in TOKENIZER_FILES:
        if (target_dir / name).exists():
            shutil.copy(target_dir / name, draft_dir / name)
    return target_dir, draft_dir


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target_dir", type=Path)
    ap.add_argument("draft_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--upper-scale", type=float, default=0.04)
    args = ap.parse_args(argv)
    write_pair(
        args.target_dir,
        args.draft_dir,
        args.seed,
        hidden_size=args.hidden,
        target_layers=args.layers,
        draft_layers=args.draft_layers,
        upper_scale=args.upper_scale,
    )
    print(f"target: {args.target_dir}\ndraft: {args.draft_dir}")


if __name__ == "__main__":
    main()
