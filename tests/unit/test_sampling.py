import torch

from lmiserve.generation.sampling import (
    apply_penalties,
    apply_top_k_top_p_min_p,
    apply_typical_p,
    make_generator,
    sample_rows,
)


def test_top_k_keeps_k_best_per_row_and_zero_means_all():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0], [1.0, 4.0, 3.0, 2.0]])
    out = apply_top_k_top_p_min_p(logits.clone(), top_k=torch.tensor([2, 0]))
    assert torch.isinf(out[0]).tolist() == [True, False, False, True]
    assert torch.equal(out[1], logits[1])


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    out = apply_top_k_top_p_min_p(logits.clone(), top_p=torch.tensor([0.7]))
    assert (~torch.isinf(out[0])).tolist() == [True, True, False, False]
    out = apply_top_k_top_p_min_p(logits.clone(), top_p=torch.tensor([1.0]))
    assert torch.allclose(out, logits)


def test_min_p_drops_tokens_below_fraction_of_best():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    out = apply_top_k_top_p_min_p(logits.clone(), min_p=torch.tensor([0.5]))
    assert (~torch.isinf(out[0])).tolist() == [True, True, False, False]


def test_best_token_always_survives():
    logits = torch.tensor([[10.0, 0.0, 0.0]])
    out = apply_top_k_top_p_min_p(logits.clone(), top_p=torch.tensor([1e-9]), min_p=torch.tensor([1.0]))
    assert not torch.isinf(out[0, 0])


def test_typical_p_neutral_at_one():
    logits = torch.randn(2, 10)
    out = apply_typical_p(logits.clone(), torch.tensor([1.0, 0.2]))
    assert torch.equal(out[0], logits[0])
    assert torch.isinf(out[1]).any() and not torch.isinf(out[1]).all()


def test_penalties_touch_only_seen_tokens():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    ids = torch.tensor([[0, 1, 1]])
    mask = torch.tensor([[True, True, True]])
    out = apply_penalties(logits.clone(), ids, mask, repetition=torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]]
    out = apply_penalties(logits.clone(), ids, mask, presence=torch.tensor([0.5]), frequency=torch.tensor([1.0]))
    assert out.tolist() == [[0.5, -4.5, 1.0, 0.5]]


def test_seeded_rows_are_reproducible_whatever_the_batch():
    probs = torch.softmax(torch.randn(3, 50), dim=-1)
    alone = sample_rows(probs[1:2], [make_generator(7)]).item()
    together = sample_rows(probs, [make_generator(1), make_generator(7), make_generator(3)])
    assert together[1].item() == alone
    g1, g2 = make_generator(5), make_generator(5)
    assert [sample_rows(probs[:1], [g1]).item() for _ in range(5)] == [
        sample_rows(probs[:1], [g2]).item() for _ in range(5)
    ]
