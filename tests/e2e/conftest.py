import pytest
import torch

PROMPTS = [
    "What is Deep Learning?",
    "Write a haiku about the sea.",
    "The capital of France is",
    "List three primary colors:",
]
MAX_NEW = 24


@pytest.fixture(scope="session")
def smollm2_expected(smollm2_dir):
    """transformers generate (greedy, fp32) for each prompt alone: {prompt: (token ids, text)}."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    out = {}
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        gen = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)[0, ids.shape[1] :].tolist()
        out[prompt] = (gen, tok.decode(gen, skip_special_tokens=True))
    return out
