"""transformers' own ``generate`` on the same model and prompts: static batches, no server."""

from __future__ import annotations

import time
from pathlib import Path


def run_baseline(
    model_path: Path,
    dtype: str,
    prompts: list[list[int]],
    concurrencies: list[int],
    max_new_tokens: int,
    device: str = "cpu",
) -> list[dict[str, object]]:
    """Output tokens/s of ``generate`` with static batches of each size, on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..devices import torch_dtype

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype(dtype)).to(device).eval()

    def wait() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = 0
    results = []
    with torch.inference_mode():
        warm = torch.tensor([prompts[0][:16]], device=device)
        model.generate(warm, max_new_tokens=4, do_sample=False, pad_token_id=pad)
        for batch in concurrencies:
            ids, mask = left_padded([prompts[i % len(prompts)] for i in range(batch)], pad)
            ids, mask = torch.tensor(ids, device=device), torch.tensor(mask, device=device)
            wait()
            started = time.perf_counter()
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
            wait()
            seconds = time.perf_counter() - started
            results.append(
                {
                    "concurrency": batch,
                    "device": device,
                    "output_tokens": batch * max_new_tokens,
                    "seconds": seconds,
                    "output_tokens_per_s": batch * max_new_tokens / seconds,
                }
            )
    return results


def left_padded(prompts: list[list[int]], pad: int) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts of different lengths as one batch for ``generate``: padded on the left, and their
    attention mask."""
    width = max(len(p) for p in prompts)
    return [[pad] * (width - len(p)) + p for p in prompts], [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
