"""A model named by a Hub id or an s3:// prefix while it is fetched: Loading, then the model built on
the fetched files in its place, or Failed with the fetch's reason; and a download that runs out of
model_loading_timeout keeps what it fetched."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from lmiserve.config import load_settings
from lmiserve.model_fetch import FetchError, FetchOptions, fetch_model
from lmiserve.model_fetch.transfer import MIB, part_paths
from lmiserve.serving import FetchingModel, ModelLoadError, ModelRegistry, needs_fetch
from lmiserve.serving.engine_model import EngineModel


def _settings(tmp_path: Path, model_id: str):
    (tmp_path / "serving.properties").write_text(
        f"model_name=m\noption.model_id={model_id}\noption.rolling_batch=lmi\n"
    )
    return load_settings(tmp_path, env={"OPTION_DOWNLOAD_DIR": str(tmp_path / "downloads")})


def test_the_fetched_model_takes_the_place_of_the_loading_one(s3, tmp_path: Path):
    s3.put("built", "m", {"config.json": json.dumps({"architectures": ["LlamaForCausalLM"]}).encode()})
    settings = _settings(tmp_path, "s3://built/m/")
    assert needs_fetch(settings)
    registry = ModelRegistry()
    loading = FetchingModel(settings)
    registry.add(loading)
    assert registry.ping() == (False, {"m": "Loading"})
    assert loading.describe() == {
        "modelName": "m",
        "status": "Loading",
        "modelId": "s3://built/m/",
        "downloadedBytes": 0,
    }
    model = asyncio.run(loading.build(registry))
    assert isinstance(model, EngineModel) and registry.models["m"] is model
    assert model.settings.model.model_id == str(tmp_path / "downloads" / "s3" / "built" / "m")
    # the first start gets what the download left of model_loading_timeout; a restart gets it whole
    assert 0 < model.first_load_timeout <= settings.model.model_loading_timeout
    assert model.settings.model.model_loading_timeout == settings.model.model_loading_timeout


def test_a_fetch_that_fails_leaves_the_model_failed_with_the_reason(s3, tmp_path: Path):
    registry = ModelRegistry()
    loading = FetchingModel(_settings(tmp_path, "s3://no-such-bucket/m/"))
    registry.add(loading)
    with pytest.raises(ModelLoadError, match="the bucket 'no-such-bucket' does not exist"):
        asyncio.run(loading.build(registry))
    assert registry.ping() == (False, {"m": "Failed"})
    assert loading.describe()["error"] == "s3://no-such-bucket/m/: the bucket 'no-such-bucket' does not exist"


def test_a_download_past_its_deadline_stops_and_keeps_what_it_fetched(s3, tmp_path: Path):
    s3.put("late", "m", {"model.safetensors": os.urandom(16 * MIB)})
    s3.bytes_per_s = 1024 * 1024  # a connection: 8 MiB/s in all, about two seconds
    with pytest.raises(FetchError, match="did not finish within model_loading_timeout; what was fetched is kept"):
        fetch_model("s3://late/m", None, FetchOptions(download_dir=tmp_path, deadline=time.monotonic() + 0.5))
    part, record = part_paths(tmp_path / "s3" / "late" / "m" / "model.safetensors")
    assert part.is_file() and record.read_text().startswith("version ")
