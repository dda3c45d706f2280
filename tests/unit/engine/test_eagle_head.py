"""EAGLE and EAGLE-3 proposers on tiny random heads in their published layouts, against the heads
computed from scratch in plain torch (tests/unit/engine/eagle_helpers.py), token for token in fp32:
several sequences at once, proposals accepted in part, sequences that skip a round."""

from __future__ import annotations

import json
import random

import pytest
import torch

from lmiserve.rolling_batch.scheduling.sequence import Group, Sequence
from lmiserve.rolling_batch.speculative.eagle import EagleProposer
from lmiserve.rolling_batch.speculative.eagle_weights import (
    default_aux_layers,
    detect_method,
    head_config,
    load_head,
    read_config,
)
from lmiserve.wire import SamplingParams
from tests.unit.engine.eagle_helpers import (
    HIDDEN,
    reference_proposals,
    target_model,
    target_states,
    write_eagle,
    write_eagle3,
)

LAYER_IDS = [2, 0, 1]
"""The tiny target has 2 layers: the embeddings, the stream between its layers and the one before
its final norm (listed out of order: the streams are concatenated in layer order)."""


@pytest.fixture(scope="module")
def target(tiny_llama_dir):
    return target_model(tiny_llama_dir)


@pytest.fixture(scope="module")
def draft_ids(target):
    vocab = target.embed.shape[0]
    return sorted(random.Random(3).sample(range(vocab), 120))


@pytest.fixture(scope="module")
def heads(tmp_path_factory, target, draft_ids):
    vocab, root = target.embed.shape[0], tmp_path_factory.mktemp("eagle-heads")
    return {
        "eagle": (root / "eagle", write_eagle(root / "eagle", vocab)),
        "eagle-2layers": (root / "eagle2", write_eagle(root / "eagle2", vocab, layers=2, seed=1)),
        "eagle3": (root / "eagle3", write_eagle3(root / "eagle3", vocab, draft_ids, LAYER_IDS)),
    }


def make_seq(tokens: list[int]) -> Sequence:
    group = Group("r", SamplingParams())
    seq = Sequence(group, 0, list(tokens), len(tokens))
    group.sequences.append(seq)
    return seq


def test_eagle_layout_loads(heads, target):
    path, tensors = heads["eagle"]
    config, loaded = load_head(path, len(target.layers), HIDDEN)
    assert config.method == "eagle" and config.aux_layers == () and config.num_layers == 1
    assert torch.equal(loaded["fc.bias"], tensors["fc.bias"])
    proposer = EagleProposer(path, target, dtype=torch.float32)
    assert (proposer.name, proposer.hidden, proposer.aux_layers) == ("eagle", "final", ())
    head = proposer.head
    assert head.embed is None and head.lm_head is None and head.draft_to_target is None
    assert head.layers[0].input_norm is None and head.fc.bias is not None
    assert 0 < proposer.cost_ratio < 1


def test_eagle3_layout_loads(heads, target, draft_ids):
    path, tensors = heads["eagle3"]
    config, loaded = load_head(path, len(target.layers), HIDDEN)
    assert config.method == "eagle3" and config.aux_layers == (0, 1, 2)
    assert not config.norm_before_residual and not config.norm_output
    assert "layers.0.hidden_norm.weight" in loaded and not any(n.startswith("midlayer.") for n in loaded)
    proposer = EagleProposer(path, target, dtype=torch.float32)
    assert (proposer.name, proposer.hidden, proposer.aux_layers) == ("eagle3", "aux", (0, 1, 2))
    head = proposer.head
    assert head.embed is None and head.lm_head.out_features == len(draft_ids)
    assert head.draft_to_target.tolist() == draft_ids
    assert head.layers[0].qkv.weight.shape[1] == 2 * HIDDEN


def test_eagle3_config_readings(tmp_path):
    assert default_aux_layers(32) == (2, 16, 29)
    plain = {"hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2, "architectures": ["X"]}
    assert detect_method(plain, {"d2t": torch.zeros(1)}) == "eagle3"
    assert detect_method(plain, {"fc.weight": torch.zeros(1)}) == "eagle"
    assert head_config(plain, "eagle3", 32, 8).aux_layers == (2, 16, 29)
    nested = dict(plain, eagle_config={"eagle_aux_hidden_state_layer_ids": [30, 1, 15]})
    assert head_config(nested, "eagle3", 32, 8).aux_layers == (1, 15, 30)
    off = dict(plain, eagle_config={"use_aux_hidden_state": False})
    assert head_config(off, "eagle3", 32, 8).aux_layers == ()
    speculators = {
        "speculators_model_type": "eagle3",
        "transformer_layer_config": dict(plain, architectures=["LlamaForCausalLM"]),
        "draft_vocab_size": 100,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
    }
    (tmp_path / "config.json").write_text(json.dumps(speculators))
    merged = read_config(tmp_path)
    assert detect_method(merged, {}) == "eagle3" and merged["draft_vocab_size"] == 100
    config = head_config(merged, "eagle3", 32, 8)
    assert config.norm_before_residual and config.aux_layers == (1, 2, 3)


def run_rounds(proposer, target, method, tensors, rounds, seed=0):
    """Prompts prefilled, then rounds of: proposals (checked against the reference), a random
    prefix of them accepted plus the target's own next token, its states observed."""
    rng = random.Random(seed)
    vocab = target.embed.shape[0]
    if proposer.hidden == "aux":
        target.aux_layers = proposer.aux_layers
    try:
        seqs = [make_seq([rng.randrange(4, vocab) for _ in range(n)]) for n in (6, 11, 8)]

        def states(tokens):
            final, aux = target_states(target, tokens)
            return final if proposer.hidden == "final" else aux

        def next_token(tokens):
            final, _ = target_states(target, tokens)
            return int(target.logits(final[-1:]).argmax())

        for seq in seqs:  # the prompt's step: every prompt token's state, then the sampled token
            prompt = list(seq.token_ids)
            proposer.observe(seq, 0, states(prompt))
            seq.token_ids.append(next_token(prompt))
        compared = 0
        for r in range(rounds):
            counts = [rng.choice([0, 1, 3, 4]) if r % 3 == 2 else rng.choice([1, 2, 4]) for _ in seqs]
            proposed = proposer.propose(seqs, counts)
            for seq, count, got in zip(seqs, counts, proposed):
                tokens = seq.token_ids
                expected = reference_proposals(method, tensors, target, tokens, states(tokens[:-1]), count)
                assert got == expected, (r, seq.seq_id)
                compared += len(got)
                # the verify step: a prefix of the proposals accepted, then the target's token
                n = len(tokens)
                accepted = got[: rng.randrange(len(got) + 1)] if got else []
                grown = tokens + accepted
                grown.append(next_token(grown))
                proposer.observe(seq, n - 1, states(grown[:-1])[n - 1 :])
                seq.token_ids = grown
        return compared, seqs
    finally:
        target.aux_layers = ()


@pytest.mark.parametrize("name", ["eagle", "eagle-2layers", "eagle3"])
def test_proposals_equal_the_head_from_scratch(heads, target, name):
    path, tensors = heads[name]
    proposer = EagleProposer(path, target, dtype=torch.float32)
    method = "eagle3" if name == "eagle3" else "eagle"
    compared, seqs = run_rounds(proposer, target, method, tensors, rounds=7)
    assert compared > 20
    for seq in seqs:  # only rows built from the target's states are kept
        kv = proposer._seqs[seq.seq_id].kv
        assert kv.positions == list(range(kv.length)) and kv.length < len(seq.token_ids) - 1
    proposer.forget(seqs[0])
    assert seqs[0].seq_id not in proposer._seqs


def test_rejected_states_observed_then_taken_back(heads, target):
    """States observed past what is final (as if for proposals later rejected) are replaced when
    observed again from an earlier position: the next proposals are the reference's."""
    path, tensors = heads["eagle"]
    proposer = EagleProposer(path, target, dtype=torch.float32)
    seq = make_seq([5, 9, 13, 21, 34, 55, 89])
    proposer.observe(seq, 0, target_states(target, seq.token_ids)[0])
    seq.token_ids.append(7)
    got = proposer.propose([seq], [4])[0]
    right = seq.token_ids + got[:1] + [11]
    seq.token_ids = seq.token_ids + [(t + 1) % 50 + 4 for t in got] + [3]
    proposer.observe(seq, 7, target_states(target, seq.token_ids[:-1])[0][7:])
    proposer.propose([seq], [2])  # runs the wrong rows into the head's cache
    assert proposer._seqs[seq.seq_id].kv.positions[-1] == 11
    seq.token_ids = right
    proposer.observe(seq, 7, target_states(target, right[:-1])[0][7:])
    expected = reference_proposals("eagle", tensors, target, right, target_states(target, right[:-1])[0], 3)
    assert proposer.propose([seq], [3])[0] == expected


def test_a_sequence_without_the_state_of_its_last_token_proposes_nothing(heads, target):
    path, _ = heads["eagle"]
    proposer = EagleProposer(path, target, dtype=torch.float32)
    seq = make_seq([5, 9, 13, 21])
    assert proposer.propose([seq], [3]) == [[]]  # nothing observed
    proposer.observe(seq, 0, target_states(target, seq.token_ids)[0][:2])
    assert proposer.propose([seq], [3]) == [[]]  # the state of position 2 missing
    proposer.observe(seq, 2, target_states(target, seq.token_ids)[0][2:3])
    assert len(proposer.propose([seq], [3])[0]) == 3


def test_eagle3_maps_draft_ids_to_target_ids(heads, target, draft_ids):
    path, tensors = heads["eagle3"]
    proposer = EagleProposer(path, target, dtype=torch.float32)
    x = torch.randn(50, HIDDEN, generator=torch.Generator().manual_seed(0))
    draft = (x @ tensors["lm_head.weight"].T).argmax(-1)
    got = proposer.head.tokens(x).tolist()
    assert got == [draft_ids[d] for d in draft.tolist()]
    assert any(g != d for g, d in zip(got, draft.tolist()))
    compared, _ = run_rounds(proposer, target, "eagle3", tensors, rounds=3, seed=1)
    assert compared > 0
