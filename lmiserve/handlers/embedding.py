"""The built-in embedding handler: sentence-transformers style models (a transformer encoder,
then pooling and normalization as the model directory's ``modules.json`` says), dynamically
batched: every text of every request in a batch goes through one padded forward pass."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..devices import resolve_device
from ..errors import BadRequest, ValidationFailed
from ..formatters import embeddings
from ..model_store import resolve_model
from .inputs import Input
from .outputs import Output
from .service import service_handle

log = logging.getLogger("lmiserve.embedding")


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


class EmbeddingService:
    def __init__(self, properties: dict[str, str]):
        import torch
        from transformers import AutoModel, AutoTokenizer

        started = time.monotonic()
        path = resolve_model(properties.get("model_id"), Path(properties.get("model_dir", ".")))
        self.name = properties.get("model_name", path.name)
        self.device = resolve_device(properties.get("device", "auto"))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, dtype=torch.float32).to(self.device).eval()
        modules = _read(path / "modules.json") or []
        types = [m.get("type", "") for m in modules]
        pooling_dir = next((m["path"] for m in modules if m.get("type", "").endswith("Pooling")), "1_Pooling")
        pooling = _read(path / pooling_dir / "config.json") or {"pooling_mode_mean_tokens": True}
        self.pooling = (
            "cls"
            if pooling.get("pooling_mode_cls_token")
            else "max"
            if pooling.get("pooling_mode_max_tokens")
            else "mean"
        )
        self.normalize = any(t.endswith("Normalize") for t in types)
        st_config = _read(path / "sentence_bert_config.json") or {}
        self.max_length = int(
            st_config.get("max_seq_length") or getattr(self.model.config, "max_position_embeddings", 512)
        )
        self.dimensions = int(self.model.config.hidden_size)
        log.info(
            "embedding model %s on %s: %s pooling%s, %d dimensions, up to %d tokens (loaded in %.1f s)",
            path,
            self.device,
            self.pooling,
            ", normalized" if self.normalize else "",
            self.dimensions,
            self.max_length,
            time.monotonic() - started,
        )

    def embed(self, texts: list[str] | None, token_ids: list[list[int]] | None) -> tuple[np.ndarray, list[int]]:
        import torch

        if texts is not None:
            enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        else:
            batch = [ids[: self.max_length] for ids in token_ids or []]
            enc = self.tokenizer.pad({"input_ids": batch}, return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items()}
        mask = enc["attention_mask"]
        with torch.inference_mode():
            hidden = self.model(**enc).last_hidden_state
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "max":
            pooled = hidden.masked_fill(~mask.bool().unsqueeze(-1), float("-inf")).max(dim=1).values
        else:
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy(), mask.sum(dim=1).tolist()

    def handle(self, inputs: Input) -> Output:
        output = Output()
        parsed: list[tuple[int, embeddings.EmbeddingRequest]] = []
        for index, item in enumerate(inputs.get_batches()):
            try:
                req = embeddings.parse(item.get_as_json())
                if req.dimensions is not None and req.dimensions != self.dimensions:
                    raise ValidationFailed(f"dimensions must be {self.dimensions} for this model")
                parsed.append((index, req))
            except json.JSONDecodeError as exc:
                output.error(
                    f"request body is not valid JSON: {exc}", code=400, message="Bad Request", batch_index=index
                )
            except BadRequest as exc:
                output.error(exc.detail, code=400, message="Bad Request", batch_index=index)
            except ValidationFailed as exc:
                output.error(exc.detail, code=400, message="Bad Request", batch_index=index)
        text_reqs = [(i, r) for i, r in parsed if r.texts is not None]
        id_reqs = [(i, r) for i, r in parsed if r.texts is None]
        for group, is_text in ((text_reqs, True), (id_reqs, False)):
            if not group:
                continue
            flat_texts = [t for _, r in group for t in (r.texts or [])] if is_text else None
            flat_ids = None if is_text else [x for _, r in group for x in (r.token_ids or [])]
            vectors, counts = self.embed(flat_texts, flat_ids)
            start = 0
            for index, req in group:
                end = start + req.count
                output.add_as_json(
                    embeddings.response(req, vectors[start:end], counts[start:end], self.name), batch_index=index
                )
                start = end
        return output


handle = service_handle(EmbeddingService)
"""DJL's entry point: the first call (the model's properties) builds the service."""
