"""Speculative decoding's draft model, named by an s3:// prefix or a Hub id, is fetched as the model
is, before the engine starts: the settings the engine gets name its local directory; a local
directory is read where it is."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from lmiserve.config import load_settings
from lmiserve.serving import needs_fetch
from lmiserve.serving.fetching_model import fetched_settings
from lmiserve.serving.model_sources import local_draft, remote_draft

CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"]}).encode()


def _settings(tmp_path: Path, text: str):
    (tmp_path / "serving.properties").write_text("model_name=m\noption.rolling_batch=lmi\n" + text)
    return load_settings(tmp_path, env={"OPTION_DOWNLOAD_DIR": str(tmp_path / "downloads")})


def test_a_draft_on_s3_is_fetched_and_named_by_its_directory(s3, tmp_path: Path):
    s3.put("drafts", "small", {"config.json": CONFIG})
    local = tmp_path / "target"
    local.mkdir()
    (local / "config.json").write_bytes(CONFIG)
    settings = _settings(
        tmp_path,
        f"option.model_id={local}\noption.speculative_draft_model=s3://drafts/small/\noption.speculative_length=4\n",
    )
    assert needs_fetch(settings) and remote_draft(settings) == "s3://drafts/small/"
    fetched, left = asyncio.run(fetched_settings(settings))
    where = str(tmp_path / "downloads" / "s3" / "drafts" / "small")
    assert fetched.model.model_id == str(local)  # the model itself: a local directory, as it was
    assert fetched.engine.speculative.model == where
    assert fetched.engine.speculative.for_vllm() == {"model": where, "num_speculative_tokens": 4}
    assert not needs_fetch(fetched) and left > 0


def test_a_draft_by_hub_id_in_the_json_is_fetched_with_the_model(hub_env, s3, tmp_path: Path):
    hub_env.add("org/eagle-head", {"config.json": CONFIG, "model.safetensors": b"weights"})
    s3.put("models", "target", {"config.json": CONFIG})
    spec = {"method": "eagle", "model": "org/eagle-head", "num_speculative_tokens": 3}
    settings = _settings(
        tmp_path, f"option.model_id=s3://models/target/\noption.speculative_config={json.dumps(spec)}\n"
    )
    fetched, _ = asyncio.run(fetched_settings(settings))
    assert fetched.model.model_id == str(tmp_path / "downloads" / "s3" / "models" / "target")
    draft = Path(fetched.engine.speculative.model)
    assert (draft / "config.json").read_bytes() == CONFIG
    assert fetched.engine.speculative.for_vllm() == {**spec, "model": str(draft)}


def test_a_local_draft_needs_no_fetch(tmp_path: Path):
    draft = tmp_path / "draft"
    draft.mkdir()
    settings = _settings(tmp_path, f"option.speculative_draft_model={draft}\n")
    assert not needs_fetch(settings) and remote_draft(settings) is None
    assert settings.engine.speculative.model == str(draft)


def test_a_draft_relative_to_the_model_directory_is_given_by_its_absolute_path(tmp_path: Path, monkeypatch):
    (tmp_path / "drafts" / "small").mkdir(parents=True)
    monkeypatch.chdir(tmp_path.parent)  # the engine's process does not run in the model directory
    settings = _settings(tmp_path, "option.speculative_draft_model=drafts/small\n")
    assert not needs_fetch(settings)
    assert local_draft(settings).engine.speculative.model == str((tmp_path / "drafts" / "small").resolve())
    absolute = _settings(tmp_path, f"option.speculative_draft_model={tmp_path / 'drafts' / 'small'}\n")
    assert local_draft(absolute) is absolute
    ngram = _settings(tmp_path, 'option.speculative_config={"method": "ngram"}\n')
    assert local_draft(ngram) is ngram
