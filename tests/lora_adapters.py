"""PEFT LoRA adapters with random weights, for tests: built with ``peft`` itself and saved the way
PEFT saves them (adapter_config.json and adapter_model.safetensors)."""

from __future__ import annotations

from pathlib import Path

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_adapter(
    model_dir: Path,
    out: Path,
    seed: int,
    rank: int = 8,
    targets: list[str] | None = None,
    scale: float = 3.0,
    **config,
) -> Path:
    """A LoRA adapter for the model in ``model_dir`` with random A and B (B is zero in a freshly
    initialised adapter, which would change nothing), made large enough to change the tokens."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if (out / "adapter_config.json").is_file():
        return out
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(
        r=rank,
        lora_alpha=config.pop("lora_alpha", 2 * rank),
        target_modules=targets or ALL_MODULES,
        init_lora_weights=False,
        **config,
    )
    model = get_peft_model(base, lora)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.mul_(scale)
    model.save_pretrained(out)
    return out


def peft_greedy(model_dir: Path, adapter: Path | None, prompt_ids: list[int], max_new: int, dtype=None) -> list[int]:
    """transformers ``generate`` (greedy) with the adapter loaded by ``peft`` (none: the base
    model), up to and including the first end-of-sequence token."""
    import torch
    from peft import PeftModel

    from tests.tiny_models import reference_model

    model = reference_model(model_dir, dtype)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    out = model.generate(input_ids=torch.tensor([prompt_ids]), max_new_tokens=max_new, do_sample=False)
    gen = out[0, len(prompt_ids) :].tolist()
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or [])
    for i, t in enumerate(gen):
        if t in eos:
            return gen[: i + 1]
    return gen
