import pytest
import torch

from lmiserve.formatters.lmi_dynamic import DynamicParameters
from lmiserve.handlers.hf_generate import BatchGenerator, GenRow

PROMPTS = ["What is Deep Learning?", "The quick brown fox", "Paged attention stores the key value cache in blocks."]


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    model.generation_config = GenerationConfig(eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    return model, tok


def reference(model, tok, prompt, n):
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


def test_greedy_batch_matches_generate_alone(model_and_tokenizer):
    model, tok = model_and_tokenizer
    gen = BatchGenerator(model, tok, [tok.eos_token_id], tok.pad_token_id)
    lengths = [12, 5, 20]
    rows = [GenRow(tok(p)["input_ids"], DynamicParameters(max_new_tokens=n)) for p, n in zip(PROMPTS, lengths)]
    results = gen.run(rows)
    for prompt, n, res in zip(PROMPTS, lengths, results):
        expected = reference(model, tok, prompt, n)
        assert res.token_ids == [t for t in expected if t != tok.eos_token_id][: len(res.token_ids)]
        assert res.token_ids == expected[: len(res.token_ids)]
        if res.finish_reason == "length":
            assert len(res.token_ids) == n
        assert res.text == tok.decode(res.token_ids, skip_special_tokens=True)


def test_seeded_sampling_is_independent_of_batch_composition(model_and_tokenizer):
    model, tok = model_and_tokenizer
    gen = BatchGenerator(model, tok, [tok.eos_token_id], tok.pad_token_id)
    sampled = GenRow(
        tok(PROMPTS[0])["input_ids"],
        DynamicParameters(max_new_tokens=10, do_sample=True, temperature=0.9, top_k=50, seed=42),
    )
    alone = gen.run([sampled])[0].token_ids
    mixed = gen.run(
        [
            GenRow(tok(PROMPTS[1])["input_ids"], DynamicParameters(max_new_tokens=15)),
            sampled,
            GenRow(tok(PROMPTS[2])["input_ids"], DynamicParameters(max_new_tokens=3, do_sample=True, seed=1)),
        ]
    )[1].token_ids
    assert alone == mixed
    other_seed = GenRow(
        tok(PROMPTS[0])["input_ids"],
        DynamicParameters(max_new_tokens=10, do_sample=True, temperature=0.9, top_k=50, seed=43),
    )
    assert gen.run([other_seed])[0].token_ids != alone


def test_stop_sequence_ends_a_row_and_is_cut(model_and_tokenizer):
    model, tok = model_and_tokenizer
    gen = BatchGenerator(model, tok, [tok.eos_token_id], tok.pad_token_id)
    ids = tok(PROMPTS[0])["input_ids"]
    full = gen.run([GenRow(ids, DynamicParameters(max_new_tokens=20))])[0]
    assert len(full.text) > 4
    stop = full.text[3:5]
    res = gen.run([GenRow(ids, DynamicParameters(max_new_tokens=20, stop_sequences=[stop]))])[0]
    assert res.finish_reason == "stop_sequence"
    assert res.text == full.text[: full.text.index(stop)]


def test_streamed_deltas_join_to_final_text(model_and_tokenizer):
    model, tok = model_and_tokenizer
    gen = BatchGenerator(model, tok, [tok.eos_token_id], tok.pad_token_id)
    rows = [GenRow(tok(p)["input_ids"], DynamicParameters(max_new_tokens=n)) for p, n in zip(PROMPTS, [7, 15, 3])]
    steps = []
    results = gen.run(rows, on_step=steps.append)
    for i, res in enumerate(results):
        assert "".join(s[i].text for s in steps if s[i] is not None) == res.text
        assert [s[i] for s in steps if s[i] is not None] == res.tokens


def test_details_give_each_tokens_log_probability_and_the_prompts(model_and_tokenizer):
    model, tok = model_and_tokenizer
    gen = BatchGenerator(model, tok, [tok.eos_token_id], tok.pad_token_id)
    ids = tok(PROMPTS[0])["input_ids"]
    plain, detailed = gen.run(
        [
            GenRow(ids, DynamicParameters(max_new_tokens=6)),
            GenRow(ids, DynamicParameters(max_new_tokens=6, details=True)),
        ]
    )
    assert [t.logprob for t in plain.tokens] == [None] * 6
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True
    )
    expected = [torch.log_softmax(score[0], -1)[t].item() for score, t in zip(out.scores, out.sequences[0, len(ids) :])]
    assert [t.id for t in detailed.tokens] == out.sequences[0, len(ids) :].tolist()
    assert [t.logprob for t in detailed.tokens] == pytest.approx(expected, abs=1e-5)
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    prompt = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1).tolist()
    values = gen.prompt_logprobs(ids)
    assert values[0] is None and values[1:] == pytest.approx(prompt, abs=1e-5)


def test_ignore_eos_min_new_tokens_and_stop_token_ids(model_and_tokenizer):
    model, tok = model_and_tokenizer
    ids = tok(PROMPTS[0])["input_ids"]
    plain = BatchGenerator(model, tok, [tok.eos_token_id], tok.pad_token_id).run(
        [GenRow(ids, DynamicParameters(max_new_tokens=8))]
    )[0]
    tokens = [t.id for t in plain.tokens]
    gen = BatchGenerator(model, tok, [tokens[2]], tok.pad_token_id)  # the third token ends a sequence here
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tokens[2]]  # as the handler's service sets it
    try:
        ends, ignores, later, stops = gen.run(
            [
                GenRow(ids, DynamicParameters(max_new_tokens=8)),
                GenRow(ids, DynamicParameters(max_new_tokens=8, ignore_eos_token=True)),
                GenRow(ids, DynamicParameters(max_new_tokens=8, min_new_tokens=4)),
                GenRow(ids, DynamicParameters(max_new_tokens=8, stop_token_ids=(tokens[1],))),
            ]
        )
    finally:
        model.generation_config.eos_token_id = saved
    assert ([t.id for t in ends.tokens], ends.finish_reason) == (tokens[:3], "eos_token")
    assert ([t.id for t in ignores.tokens], ignores.finish_reason) == (tokens, "length")
    assert [t.id for t in later.tokens][:2] == tokens[:2] and later.tokens[2].id != tokens[2]
    assert ([t.id for t in stops.tokens], stops.finish_reason) == (tokens[:2], "stop_sequence")
