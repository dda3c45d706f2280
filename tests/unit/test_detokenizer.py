import random

import pytest

from lmiserve.generation.detokenizer import IncrementalDetokenizer


def stream(tokenizer, prompt_ids, gen_ids):
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    pieces = [detok.add([t]) for t in gen_ids]
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize("text", ["Große Füchse 😀 🚀 東京", "ünïcödé 😀😀 text", "plain ascii words here"])
def test_streamed_pieces_join_to_the_decoded_text(tiny_tokenizer, text):
    prompt = tiny_tokenizer("Numbers: ")["input_ids"]
    gen = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = stream(tiny_tokenizer, prompt, gen)
    assert "".join(pieces) == text
    # no piece carries half a character
    assert all("\ufffd" not in p for p in pieces)


def test_random_token_sequences_never_lose_text(tiny_tokenizer):
    rng = random.Random(0)
    vocab = len(tiny_tokenizer)
    special = set(tiny_tokenizer.all_special_ids)
    for _ in range(50):
        prompt = tiny_tokenizer("What is")["input_ids"]
        gen = [t for t in (rng.randrange(vocab) for _ in range(30)) if t not in special]
        joined = "".join(stream(tiny_tokenizer, prompt, gen))
        full = tiny_tokenizer.decode(prompt + gen)
        assert joined == full[len(tiny_tokenizer.decode(prompt)) :]


def test_special_tokens_are_skipped(tiny_tokenizer):
    ids = tiny_tokenizer("hello", add_special_tokens=False)["input_ids"]
    pieces = stream(tiny_tokenizer, [], ids + [tiny_tokenizer.eos_token_id])
    assert "".join(pieces) == "hello"


@pytest.fixture(scope="module")
def metaspace_tokenizer():
    """A SentencePiece-style tokenizer: words carry their leading space as '▁'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "</s>"], show_progress=False)
    tok.train_from_iterator(["Say hello world to the whole world please"] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


def test_leading_spaces_survive_streaming(metaspace_tokenizer):
    tok = metaspace_tokenizer
    prompt = tok("Say", add_special_tokens=False)["input_ids"]
    gen = tok("Say hello world", add_special_tokens=False)["input_ids"][len(prompt) :]
    pieces = stream(tok, prompt, gen)
    assert "".join(pieces) == " hello world"
    # decoding each token alone would have dropped the spaces
    assert "".join(tok.decode([t]) for t in gen) == "helloworld"


@pytest.mark.parametrize("spaces,fixture", [(True, "spaces_between_special_tokens.txt"), (False, "no_spaces.txt")])
def test_spaces_between_special_tokens(tiny_tokenizer, spaces, fixture):
    from pathlib import Path

    hello = tiny_tokenizer("hello world", add_special_tokens=False)["input_ids"]
    eos = tiny_tokenizer.eos_token_id
    ids = hello + [eos] + hello + [eos]
    detok = IncrementalDetokenizer(tiny_tokenizer, [], skip_special_tokens=False, spaces_between_special_tokens=spaces)
    text = "".join([detok.add([t]) for t in ids] + [detok.flush()])
    eos_text = tiny_tokenizer.convert_ids_to_tokens(eos)
    sep = " " if spaces else ""
    assert text == sep.join(["hello world", eos_text, "hello world", eos_text])
    path = Path(__file__).resolve().parents[1] / "fixtures" / "protocols" / "lmi" / fixture
    if not path.exists():
        path.write_text(text)
    assert text == path.read_text()
    # skipped special tokens do not split the text
    detok = IncrementalDetokenizer(tiny_tokenizer, [], skip_special_tokens=True, spaces_between_special_tokens=spaces)
    assert "".join([detok.add([t]) for t in ids] + [detok.flush()]) == "hello worldhello world"
