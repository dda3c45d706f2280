"""The tiny target and draft pair built to agree: the draft's greedy tokens are mostly the
target's, and its proposals, checked against the target's greedy continuation, are mostly kept."""

from __future__ import annotations

import pytest
import torch

from lmiserve.rolling_batch.models.architectures import spec_from_config
from lmiserve.rolling_batch.models.spec import read_config
from lmiserve.rolling_batch.runner.model_runner import ModelRunner
from lmiserve.rolling_batch.scheduling.sequence import Group, Sequence
from lmiserve.rolling_batch.speculative.draft_model import DraftModelProposer
from lmiserve.wire import SamplingParams
from tests.tiny_draft_pair import write_pair
from tests.tiny_models import reference_model

PROMPTS = 3
NEW = 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft-pair")
    return write_pair(root / "target", root / "draft", seed=0)


@pytest.fixture(scope="module")
def continuations(pair):
    """Prompts and the target's greedy continuation of each (transformers, fp32)."""
    target = reference_model(pair[0])
    g = torch.Generator().manual_seed(0)
    out = []
    with torch.no_grad():
        for _ in range(PROMPTS):
            prompt = torch.randint(4, target.config.vocab_size, (12,), generator=g).tolist()
            step = target(torch.tensor([prompt]), use_cache=True)
            generated: list[int] = []
            for _ in range(NEW):
                generated.append(int(step.logits[0, -1].argmax()))
                step = target(torch.tensor([generated[-1:]]), past_key_values=step.past_key_values, use_cache=True)
            out.append((prompt, generated))
    return out


def test_the_draft_mostly_picks_the_targets_tokens(pair, continuations):
    draft = reference_model(pair[1])
    agree = 0
    with torch.no_grad():
        for prompt, generated in continuations:
            ids = torch.tensor([prompt + generated])
            picks = draft(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
            agree += sum(p == t for p, t in zip(picks, generated))
    assert agree / (PROMPTS * NEW) >= 0.7


def test_the_drafts_proposals_are_mostly_kept(pair, continuations):
    target_dir, draft_dir = pair
    spec = spec_from_config(read_config(target_dir))
    target = ModelRunner(target_dir, spec, torch.float32, "cpu", 256, 16)
    proposer = DraftModelProposer.for_target(draft_dir, target, max_num_seqs=PROMPTS)
    assert proposer.cost_ratio < 0.3
    seqs = [Sequence(Group(str(i), SamplingParams()), 0, list(p), len(p)) for i, (p, _) in enumerate(continuations)]
    steps = 0
    while any(s.num_generated < NEW for s in seqs):
        live = [s for s in seqs if s.num_generated < NEW]
        steps += 1
        for seq, proposal in zip(live, proposer.propose(live, [4] * len(live))):
            # the target's greedy verify: the proposals it agrees with, then its own token
            truth = continuations[int(seq.request_id)][1][seq.num_generated :]
            kept = 0
            while kept < len(proposal) and kept < len(truth) - 1 and proposal[kept] == truth[kept]:
                kept += 1
            seq.token_ids += truth[: kept + 1]
    for seq in seqs:
        proposer.forget(seq)
    assert proposer.blocks.num_free_blocks == proposer.blocks.num_blocks
    assert NEW / steps > 2.0  # tokens per target step: above two, where one is plain decoding
