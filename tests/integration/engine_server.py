"""A server on a tiny random Llama with the rolling-batch engine, shared by protocol tests."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.server_process import ServerProcess
from tests.server_process import serving_dir as write_serving_dir


def serving_dir(root: Path, model_dir: Path, extra: str = "") -> Path:
    return write_serving_dir(
        root,
        f"model_name=tiny\noption.model_id={model_dir}\noption.rolling_batch=lmi\noption.dtype=fp32\n"
        "option.max_model_len=256\noption.max_rolling_batch_prefill_tokens=32\n" + extra,
    )


def start(root: Path, model_dir: Path, extra: str = "", env: dict | None = None) -> ServerProcess:
    return ServerProcess(serving_dir(root, model_dir, extra), env=env)


class Reference:
    """transformers generate (greedy, fp32) on the same tiny model."""

    def __init__(self, model_dir: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def ids(self, prompt: str, n: int) -> list[int]:
        ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
        out = self.model.generate(ids, max_new_tokens=n, do_sample=False)
        return out[0, ids.shape[1] :].tolist()

    def text(self, prompt: str, n: int) -> str:
        return self.tokenizer.decode(self.ids(prompt, n), skip_special_tokens=True)

    def chat_prompt(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def chat_text(self, messages: list[dict], n: int) -> str:
        """Greedy output for a conversation rendered with the model's chat template."""
        ids = self.tokenizer(self.chat_prompt(messages), add_special_tokens=False, return_tensors="pt")["input_ids"]
        out = self.model.generate(ids, max_new_tokens=n, do_sample=False)
        return self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
