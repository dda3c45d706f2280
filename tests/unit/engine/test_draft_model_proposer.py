"""The draft-model proposer: greedy continuations of the draft, token for token those of the draft
run on its own, batched, rolled back after a rejection, and its cache given back."""

from __future__ import annotations

import pytest
import torch

from lmiserve.rolling_batch.models.architectures import spec_from_config
from lmiserve.rolling_batch.models.spec import read_config
from lmiserve.rolling_batch.runner.model_runner import ModelRunner
from lmiserve.rolling_batch.scheduling.sequence import Group, Sequence
from lmiserve.rolling_batch.speculative.draft_model import DraftModelProposer, common_prefix
from lmiserve.rolling_batch.speculative.weight_bytes import step_weight_bytes
from lmiserve.wire import SamplingParams
from tests.tiny_models import reference_model

BLOCK = 16


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    """A tiny random Llama whose attention matters: weights large enough that a token's keys and
    values change the greedy continuations after it (stale ones in the cache would show)."""
    from tests.tiny_models import build_model

    return build_model(tmp_path_factory.mktemp("draft") / "model", "llama", seed=3, initializer_range=0.2)


def make(model_dir, **overrides) -> DraftModelProposer:
    spec = spec_from_config(read_config(model_dir))
    settings = dict(
        target_vocab_size=spec.vocab_size,
        target_weight_bytes=10**8,
        device="cpu",
        dtype=torch.float32,
        max_num_seqs=4,
        max_model_len=256,
        block_size=BLOCK,
    )
    settings.update(overrides)
    return DraftModelProposer(model_dir, **settings)


def target_seq(tokens: list[int], rid: str) -> Sequence:
    return Sequence(Group(rid, SamplingParams()), 0, list(tokens), len(tokens))


_models: dict = {}


def greedy(model_dir, tokens: list[int], count: int) -> list[int]:
    """The draft's own greedy continuation: its whole sequence through transformers each token."""
    key = str(model_dir)
    if key not in _models:
        _models[key] = reference_model(model_dir)
    model, ids, out = _models[key], list(tokens), []
    with torch.no_grad():
        for _ in range(count):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
    return out


def prompts(vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (n,), generator=g).tolist() for n in lengths]


def check(
    proposer: DraftModelProposer, model_dir, seqs: list[Sequence], counts: list[int], held: dict[int, int]
) -> list[list[int]]:
    """Propose, compare with the draft's own greedy continuations, and count the blocks held: a
    sequence proposed for now holds its tokens and all its proposals but the last (none past them,
    whatever it held before), one not asked keeps what it held."""
    proposals = proposer.propose(seqs, counts)
    for seq, count, got in zip(seqs, counts, proposals):
        assert got == greedy(model_dir, seq.token_ids, count), (seq.request_id, len(seq.token_ids))
        if count > 0:
            held[seq.seq_id] = -(-(len(seq.token_ids) + count - 1) // BLOCK)
    assert proposer.blocks.num_used_blocks == sum(held.values())
    return proposals


@pytest.mark.parametrize("chunk_tokens, deterministic", [(512, False), (16, False), (16, True)])
def test_proposals_are_the_drafts_greedy_continuation(draft_dir, chunk_tokens, deterministic):
    proposer = make(draft_dir, chunk_tokens=chunk_tokens, deterministic=deterministic)
    vocab = proposer.runner.spec.vocab_size
    seqs = [target_seq(p, rid) for p, rid in zip(prompts(vocab, [5, 30, 40, 9]), "abcd")]
    a, b, c, d = seqs
    held: dict[int, int] = {}

    first = check(proposer, draft_dir, seqs, [3, 5, 5, 0], held)
    assert [len(p) for p in first] == [3, 5, 5, 0]
    assert proposer.num_shadows == 3  # a sequence asked for nothing is not caught up

    # the verify step: a keeps all three and the target's own next token, b none (another token:
    # its shadow goes back from three blocks to two), c its first two and then a token of the target's
    other = lambda t: (t + 1) % vocab or 4  # noqa: E731
    a.token_ids += first[0] + [7]
    b.token_ids += [other(first[1][0])]
    c.token_ids += first[2][:2] + [other(first[2][2])]
    second = check(proposer, draft_dir, seqs, [4, 2, 3, 2], held)

    # again, a rejecting its first proposal, c keeping everything, d just started
    a.token_ids += [other(second[0][0])]
    c.token_ids += second[2] + [11]
    d.token_ids += second[3][:1] + [other(second[3][1])]
    check(proposer, draft_dir, seqs, [2, 0, 4, 3], held)

    # b's proposals were not checked, and it decoded three tokens on its own: the shadow goes back
    # to before its first proposal, not merely to the target's last token
    b.token_ids += [other(second[1][0]), 3, 8]
    check(proposer, draft_dir, seqs, [0, 3, 0, 0], held)

    for seq in seqs:
        proposer.forget(seq)
    assert proposer.num_shadows == 0
    assert proposer.blocks.num_free_blocks == proposer.blocks.num_blocks


def test_sequences_proposed_together_share_each_step(tiny_llama_dir):
    proposer = make(tiny_llama_dir)
    vocab = proposer.runner.spec.vocab_size
    seqs = [target_seq(p, rid) for p, rid in zip(prompts(vocab, [6, 30, 17], seed=1), "xyz")]
    before = proposer.runner.eager_steps
    proposals = proposer.propose(seqs, [2, 4, 3])
    assert proposer.runner.eager_steps - before == 4  # one catch-up step, then three single-token steps
    for seq in seqs:
        seq.token_ids.append(5)
    before = proposer.runner.eager_steps
    proposer.propose(seqs, [1, 1, 1])
    assert proposer.runner.eager_steps - before == 1
    assert [len(p) for p in proposals] == [2, 4, 3]


def test_deterministic_proposals_do_not_depend_on_the_batch(draft_dir):
    alone = make(draft_dir, deterministic=True)
    batched = make(draft_dir, deterministic=True, chunk_tokens=16)
    vocab = alone.runner.spec.vocab_size
    tokens = prompts(vocab, [21, 8, 35], seed=2)
    got_alone = alone.propose([target_seq(tokens[0], "a")], [5])[0]
    got_batched = batched.propose([target_seq(t, rid) for t, rid in zip(tokens, "abc")], [5, 3, 4])[0]
    assert got_alone == got_batched


def test_the_same_tokens_again_rerun_the_last_one(tiny_llama_dir):
    """Asked twice about unchanged tokens, the draft proposes the same (its cache holds past the
    target's tokens: it goes back to the target's last token for its logits)."""
    proposer = make(tiny_llama_dir)
    seq = target_seq(prompts(proposer.runner.spec.vocab_size, [12], seed=3)[0], "a")
    assert proposer.propose([seq], [4]) == proposer.propose([seq], [4])
    assert proposer.propose([seq], [2])[0] == greedy(tiny_llama_dir, seq.token_ids, 2)


def test_a_full_cache_proposes_nothing_for_what_does_not_fit(tiny_llama_dir):
    probe = make(tiny_llama_dir, max_num_seqs=1)
    proposer = make(tiny_llama_dir, kv_cache_bytes=3 * probe.runner.block_bytes)
    assert proposer.blocks.num_blocks == 3
    vocab = proposer.runner.spec.vocab_size
    long, short = (target_seq(p, rid) for p, rid in zip(prompts(vocab, [40, 20], seed=4), "ls"))
    got = proposer.propose([long, short], [5, 2])
    assert got[0] == greedy(tiny_llama_dir, long.token_ids, 5)
    assert got[1] == []
    proposer.forget(long)
    assert proposer.propose([short], [2])[0] == greedy(tiny_llama_dir, short.token_ids, 2)


def test_proposals_stop_at_max_model_len(tiny_llama_dir):
    proposer = make(tiny_llama_dir, max_model_len=32)
    seq = target_seq(prompts(proposer.runner.spec.vocab_size, [30], seed=5)[0], "a")
    assert len(proposer.propose([seq], [5])[0]) == 2
    seq.token_ids += [9, 9]
    assert proposer.propose([seq], [5]) == [[]]


def test_a_draft_with_another_vocabulary_is_refused(tiny_llama_dir):
    spec = spec_from_config(read_config(tiny_llama_dir))
    with pytest.raises(ValueError, match="vocabulary of .* tokens, the target's has"):
        make(tiny_llama_dir, target_vocab_size=spec.vocab_size + 64)


def test_for_target_takes_the_targets_settings(tiny_llama_dir):
    spec = spec_from_config(read_config(tiny_llama_dir))
    target = ModelRunner(tiny_llama_dir, spec, torch.float32, "cpu", 128, BLOCK, deterministic=True)
    proposer = DraftModelProposer.for_target(tiny_llama_dir, target, max_num_seqs=2)
    assert proposer.cost_ratio == 1.0
    assert proposer.runner.deterministic and proposer.runner.ops.name == target.ops.name
    assert proposer.blocks.num_blocks == 2 * (128 // BLOCK)
    assert (proposer.name, proposer.hidden, proposer.aux_layers) == ("draft_model", "", ())
    assert step_weight_bytes(target.model) == sum(
        p.numel() * 4 for name, p in reference_model(tiny_llama_dir).named_parameters() if "embed" not in name
    )


def test_common_prefix():
    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 4, 5], 4) == 4
    assert common_prefix([1, 2, 3, 4], [1, 2, 9, 4], 4) == 2
    assert common_prefix([1, 2, 3], [1, 2, 3], 2) == 2
    assert common_prefix([7], [1], 1) == 0
    assert common_prefix([], [1, 2], 5) == 0
