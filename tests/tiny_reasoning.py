"""Tiny reasoning models whose greedy output is written by the test: the tokenizer carries a
reasoning family's chat template and thinking tokens, and the weights make each token of a script
predict the next one, whatever came before.

The residual stream holds only the current token's embedding (every layer's output projections
are zero), and the LM head's row for token ``b`` is the embedding of the token before it in the
script, so ``a -> b`` wins greedy decoding by a wide margin over random embeddings. The script
starts from the prompt's last token and ends with the end-of-sequence token.
"""

from __future__ import annotations

from pathlib import Path

QWEN3_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    "</tools><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{%- endif %}"
)
"""Qwen3's template, shortened: tools in the system turn, ChatML turns, and ``enable_thinking``
(false: an empty thinking block ends the prompt)."""

DEEPSEEK_R1_TEMPLATE = (
    "<｜begin▁of▁sentence｜>{%- for m in messages %}"
    "{%- if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' %}<｜Assistant｜>"
    "{%- set c = m['content'] %}{%- if '</think>' in c %}{%- set c = c.split('</think>')[-1] %}{%- endif %}"
    "{{ c }}<｜end▁of▁sentence｜>{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<｜Assistant｜><think>\n{%- endif %}"
)
"""DeepSeek-R1's template, shortened: the generation prompt opens the thinking."""

FAMILIES = {
    "qwen3": (QWEN3_TEMPLATE, ["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
    "deepseek_r1": (
        DEEPSEEK_R1_TEMPLATE,
        ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
        "<｜end▁of▁sentence｜>",
    ),
}


def build_reasoning_tokenizer(out: Path, family: str, script: list[str]):
    """The tokenizer of :func:`build_reasoning_model`: the tests' BPE, the family's special tokens
    and chat template, the thinking and tool-call markers, and each script entry as one token."""
    from tests.tiny_models import build_tokenizer

    template, specials, eos = FAMILIES[family]
    tokenizer = build_tokenizer(out)
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    plain = ["<think>", "</think>", "<tool_call>", "</tool_call>", "\n\n"]
    tokenizer.add_tokens([t for t in dict.fromkeys(plain + script) if t not in tokenizer.get_vocab()])
    tokenizer.eos_token = eos
    tokenizer.chat_template = template
    tokenizer.save_pretrained(out)
    return tokenizer


def build_reasoning_model(out: Path, family: str, script: list[str], seed: int = 0) -> Path:
    """A model directory whose greedy output, after a ``family`` chat prompt, is ``script`` (each
    entry one token), then the end of sequence. The thinking markers ``<think>``, ``</think>``,
    ``<tool_call>`` and ``</tool_call>`` are tokens of the vocabulary, as in the real families."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    eos = FAMILIES[family][2]
    tokenizer = build_reasoning_tokenizer(out, family, script)
    vocab = tokenizer.get_vocab()
    prompt_end = [
        tokenizer(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": "hi"}], **kw, add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )["input_ids"][-1]
        for kw in ({}, {"enable_thinking": False})
    ]
    chain = [vocab[t] for t in script] + [vocab[eos]]
    hidden = 128
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=vocab[eos],
        pad_token_id=vocab[eos],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        embed = torch.randn(len(tokenizer), hidden)
        embed *= hidden**0.5 / embed.norm(dim=1, keepdim=True)
        model.model.embed_tokens.weight.copy_(embed)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(len(tokenizer), hidden)
        before = [prompt_end[0], *chain[:-1]]
        assert len(set(before)) == len(before), "each token of the script must come once"
        for a, b in zip(before, chain, strict=True):
            head[b] += embed[a]
        if prompt_end[1] not in before:  # thinking off: the answer starts after </think>
            after = chain[script.index("</think>") + 1] if "</think>" in script else chain[0]
            head[after] += embed[prompt_end[1]]
        model.lm_head.weight.copy_(head / hidden)
    model.save_pretrained(out)
    return out
