"""Tiny random EAGLE and EAGLE-3 heads written in their published layouts for a tiny Llama, the
target's hidden states of a whole sequence, and the heads computed from scratch in plain torch
(no cache) as the proposers' reference."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from lmiserve.rolling_batch.models.architectures import spec_from_config
from lmiserve.rolling_batch.models.decoder import DecoderModel
from lmiserve.rolling_batch.models.rope import rope_tables
from lmiserve.rolling_batch.models.spec import read_config
from lmiserve.rolling_batch.ops.metadata import AttentionMetadata, PagedAttentionInputs
from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.rolling_batch.quant.checkpoint import read_safetensors

HIDDEN, INTER, HEADS, KV_HEADS = 64, 96, 4, 2
THETA = 10000.0
EPS = 1e-6
BLOCK = 16


def target_model(model_dir: Path) -> DecoderModel:
    spec = spec_from_config(read_config(model_dir))
    cos, sin = rope_tables(model_dir, spec.architecture, 256)
    return DecoderModel(spec, read_safetensors(model_dir), ReferenceOps(), cos, sin)


def target_states(model: DecoderModel, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target's final hidden states of every token of ``tokens`` (one forward pass from
    scratch), and its aux streams where ``model.aux_layers`` is set."""
    spec, n = model.spec, len(tokens)
    blocks = -(-n // BLOCK)
    shape = (blocks, BLOCK, spec.num_kv_heads, spec.head_dim)
    caches = [
        (torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype)) for _ in range(spec.num_layers)
    ]
    positions = torch.arange(n)
    paged = PagedAttentionInputs.of(
        torch.arange(blocks, dtype=torch.int32)[None],
        torch.tensor([0, n], dtype=torch.int32),
        torch.tensor([n], dtype=torch.int32),
    )
    model.aux_hidden = None
    with torch.inference_mode():
        final = model.forward(torch.tensor(tokens), positions, AttentionMetadata(positions, paged), caches)
    return final, model.aux_hidden


def _w(gen: torch.Generator, *shape: int, scale: float = 0.15) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


def _norm(gen: torch.Generator, width: int) -> torch.Tensor:
    return 1.0 + _w(gen, width, scale=0.1)


def _layer(gen: torch.Generator, prefix: str, attn_in: int) -> dict[str, torch.Tensor]:
    d = HIDDEN // HEADS
    a = prefix + "self_attn."
    return {
        a + "q_proj.weight": _w(gen, HEADS * d, attn_in),
        a + "k_proj.weight": _w(gen, KV_HEADS * d, attn_in),
        a + "v_proj.weight": _w(gen, KV_HEADS * d, attn_in),
        a + "o_proj.weight": _w(gen, HIDDEN, HEADS * d),
        prefix + "mlp.gate_proj.weight": _w(gen, INTER, HIDDEN),
        prefix + "mlp.up_proj.weight": _w(gen, INTER, HIDDEN),
        prefix + "mlp.down_proj.weight": _w(gen, HIDDEN, INTER),
        prefix + "post_attention_layernorm.weight": _norm(gen, HIDDEN),
    }


def _config(vocab: int, layers: int, **extra) -> dict:
    return dict(
        model_type="llama",
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        num_hidden_layers=layers,
        rms_norm_eps=EPS,
        rope_theta=THETA,
        max_position_embeddings=512,
        hidden_act="silu",
        vocab_size=vocab,
        **extra,
    )


def write_eagle(out: Path, vocab: int, layers: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    """An EAGLE head as yuhuili/EAGLE-* publish it: pytorch_model.bin with ``fc`` (and its
    bias) and ``layers.{i}.*`` (no input norm on layer 0), no embeddings and no LM head."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {"fc.weight": _w(gen, HIDDEN, 2 * HIDDEN), "fc.bias": _w(gen, HIDDEN)}
    for i in range(layers):
        tensors.update(_layer(gen, f"layers.{i}.", HIDDEN))
        if i > 0:
            tensors[f"layers.{i}.input_layernorm.weight"] = _norm(gen, HIDDEN)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(_config(vocab, layers, architectures=["LlamaForCausalLM"], bias=True)))
    torch.save(tensors, out / "pytorch_model.bin")
    return tensors


def write_eagle3(
    out: Path, vocab: int, target_ids: list[int], layer_ids: list[int], seed: int = 0
) -> dict[str, torch.Tensor]:
    """An EAGLE-3 head as yuhuili/EAGLE3-* publish it: safetensors with ``fc`` (3H -> H, no bias),
    ``midlayer.*`` (q/k/v read 2H), ``norm``, ``lm_head`` over a draft vocabulary of the target
    ids ``target_ids`` (ascending), ``d2t`` offsets and the ``t2d`` mask; no embeddings."""
    gen = torch.Generator().manual_seed(seed)
    draft = len(target_ids)
    tensors = {"fc.weight": _w(gen, HIDDEN, len(layer_ids) * HIDDEN)}
    tensors.update(_layer(gen, "midlayer.", 2 * HIDDEN))
    tensors["midlayer.input_layernorm.weight"] = _norm(gen, HIDDEN)
    tensors["midlayer.hidden_norm.weight"] = _norm(gen, HIDDEN)
    tensors["norm.weight"] = _norm(gen, HIDDEN)
    tensors["lm_head.weight"] = _w(gen, draft, HIDDEN, scale=0.5)
    ids = torch.tensor(target_ids)
    tensors["d2t"] = ids - torch.arange(draft)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    config = _config(
        vocab,
        1,
        architectures=["LlamaForCausalLMEagle3"],
        draft_vocab_size=draft,
        eagle_aux_hidden_state_layer_ids=layer_ids,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(out / "model.safetensors"))
    return tensors


# --- the reference: the head from scratch, plain torch --------------------------------------


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def _rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (THETA ** (torch.arange(0, d, 2).float() / d))
    angles = positions.float()[:, None] * inv
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


def _decoder_layer(t: dict, p: str, x: torch.Tensor, residual: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    n, d = x.shape[0], HIDDEN // HEADS
    a = p + "self_attn."
    q = _rotate((x @ t[a + "q_proj.weight"].T).view(n, HEADS, d), positions)
    k = _rotate((x @ t[a + "k_proj.weight"].T).view(n, KV_HEADS, d), positions)
    v = (x @ t[a + "v_proj.weight"].T).view(n, KV_HEADS, d)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
    attn = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    h = residual + attn.transpose(0, 1).reshape(n, -1) @ t[a + "o_proj.weight"].T
    m = _rms(h, t[p + "post_attention_layernorm.weight"])
    gate, up = m @ t[p + "mlp.gate_proj.weight"].T, m @ t[p + "mlp.up_proj.weight"].T
    return h + (F.silu(gate) * up) @ t[p + "mlp.down_proj.weight"].T


def _head(method: str, t: dict, embed: torch.Tensor, ids: list[int], h: torch.Tensor, positions: torch.Tensor):
    """Every row's (next hidden state, LM head input), computed from scratch."""
    emb = embed[torch.tensor(ids)]
    if method == "eagle":
        x = torch.cat([emb, h], -1) @ t["fc.weight"].T + t["fc.bias"]
        out = _decoder_layer(t, "layers.0.", x, x, positions)
        i = 1
        while f"layers.{i}.post_attention_layernorm.weight" in t:
            out = _decoder_layer(t, f"layers.{i}.", _rms(out, t[f"layers.{i}.input_layernorm.weight"]), out, positions)
            i += 1
        return out, out
    x = torch.cat([_rms(emb, t["midlayer.input_layernorm.weight"]), _rms(h, t["midlayer.hidden_norm.weight"])], -1)
    out = _decoder_layer(t, "midlayer.", x, h, positions)
    return out, _rms(out, t["norm.weight"])


def reference_proposals(
    method: str, t: dict, target: DecoderModel, tokens: list[int], states: torch.Tensor, count: int
) -> list[int]:
    """``count`` greedy proposals after ``tokens`` from the target's states (final or aux) of
    positions ``0 .. len(tokens) - 2``, every step recomputed from the start."""
    with torch.no_grad():
        h = states if method == "eagle" else states @ t["fc.weight"].T
        ids = list(tokens[1:])
        out: list[int] = []
        for _ in range(count):
            hidden, head_in = _head(method, t, target.embed, ids, h, torch.arange(len(ids)))
            if method == "eagle":
                token = int((head_in[-1] @ target.lm_head.weight.T).argmax())
            else:
                d = int((head_in[-1] @ t["lm_head.weight"].T).argmax())
                token = d + int(t["d2t"][d])
            out.append(token)
            ids.append(token)
            h = torch.cat([h, hidden[-1:]])
    return out
