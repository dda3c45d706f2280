"""The API process tokenizes, formats and serves HTTP; model compute is in the engine's process.
So building the app for an engine-backed model and loading its tokenizer imports no torch."""

import subprocess
import sys

import pytest

from lmiserve.generation.tokenizer import direct_class, load_tokenizer

PROGRAM = """
import asyncio, sys
from lmiserve.config import load_settings
from lmiserve.server.app import create_app
from lmiserve.serving import EngineModel, ModelRegistry, build_model

settings = load_settings({model_dir!r}, env={{"OPTION_ROLLING_BATCH": "lmi"}})
model = build_model(settings)
assert isinstance(model, EngineModel), type(model)
registry = ModelRegistry()
registry.add(model)
create_app(registry, settings)
print("after app:", "torch" in sys.modules)
asyncio.run(model._load_files())  # the model's files and tokenizer, as its start does
print("after tokenizer:", "torch" in sys.modules, model.tokenizer("hello world").input_ids)
"""


def test_app_and_tokenizer_of_an_engine_model_import_no_torch(tiny_llama_dir):
    program = PROGRAM.format(model_dir=str(tiny_llama_dir))
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "after app: False" in lines
    assert any(line.startswith("after tokenizer: False [") for line in lines), done.stdout


@pytest.mark.parametrize("which", ["llama", "qwen2", "qwen3", "smollm2"])
def test_the_tokenizer_is_the_one_autotokenizer_builds(which, tiny_model_dirs, smollm2_dir):
    from transformers import AutoTokenizer

    path = smollm2_dir if which == "smollm2" else tiny_model_dirs[which]
    ours, theirs = load_tokenizer(path), AutoTokenizer.from_pretrained(path)
    assert type(ours) is type(theirs)
    if which == "qwen2":  # AutoTokenizer builds Qwen2's own class: only it can, so it does
        assert direct_class(path) is None
    text = "Hello, world! Ünïcödé and    spaces\nnew line <s> 12345"
    assert ours(text).input_ids == theirs(text).input_ids
    assert ours.all_special_ids == theirs.all_special_ids
    ids = theirs(text).input_ids
    assert ours.decode(ids) == theirs.decode(ids)
    if theirs.chat_template:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
            theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )
