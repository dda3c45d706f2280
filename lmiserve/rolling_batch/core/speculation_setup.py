"""Building the engine's speculative decoding from its configuration: the proposer the method
names (prompt lookup, a draft model with its own KV cache, an EAGLE or EAGLE-3 head on the model's
hidden states), on the model's device and in its dtype."""

from __future__ import annotations

import logging
from typing import Any

from ...config.speculative import SpeculativeConfig
from ...devices import torch_dtype
from ..runner import graphs
from ..runner.decode_seed import time_rows
from ..runner.startup import MAX_VERIFY_ROWS
from ..speculative.proposer import Proposer
from .speculation import Speculation

log = logging.getLogger("lmiserve.engine")


def _draft_model(config: Any, loaded: Any, spec_config: SpeculativeConfig) -> Proposer:
    from ..speculative.draft_model import DraftModelProposer
    from ..speculative.weight_bytes import step_weight_bytes

    runner = loaded.runner
    backend = None if config.enforce_eager else graphs.backend_for(config.device)
    return DraftModelProposer(
        spec_config.model,  # type: ignore[arg-type]
        target_vocab_size=loaded.spec.vocab_size,
        target_weight_bytes=step_weight_bytes(runner.model),
        device=config.device,
        dtype=torch_dtype(config.dtype),
        max_num_seqs=config.max_num_seqs,
        max_model_len=loaded.max_model_len,
        block_size=config.block_size,
        ops_name=config.ops,
        deterministic=config.deterministic,
        chunk_tokens=config.max_num_batched_tokens,
        graph_backend=backend,
    )


def _eagle(loaded: Any, spec_config: SpeculativeConfig) -> Proposer:
    from ..speculative.eagle import EagleProposer

    runner = loaded.runner
    proposer = EagleProposer(spec_config.model, runner.model, method=spec_config.method, max_len=loaded.max_model_len)
    if proposer.hidden == "aux":
        runner.model.aux_layers = proposer.aux_layers
        if runner.graphs is not None or runner.mixed_graphs is not None:
            # the streams a captured graph keeps are not its output: such steps run eagerly
            log.warning("%s reads the model's inner layers: steps run without captured graphs", proposer.name)
            runner.graphs = runner.mixed_graphs = None
    return proposer


def build_speculation(config: Any, loaded: Any) -> Speculation | None:
    """The engine's speculative decoding from ``config.speculative`` (None: off). A vision model's
    steps place picture rows by prompt chunks alone: it does not speculate (logged)."""
    spec_config: SpeculativeConfig | None = getattr(config, "speculative", None)
    if spec_config is None:
        return None
    if loaded.runner.images is not None:
        log.warning("speculative decoding is off: %s reads pictures", loaded.spec.architecture)
        return None
    proposer: Proposer
    if spec_config.method == "ngram":
        from ..speculative.ngram import NgramProposer

        proposer = NgramProposer(spec_config.prompt_lookup_min, spec_config.prompt_lookup_max)
    elif spec_config.method == "draft_model":
        proposer = _draft_model(config, loaded, spec_config)
    else:
        proposer = _eagle(loaded, spec_config)
    log.info(
        "speculative decoding: %s, %d tokens a step%s",
        spec_config.method,
        spec_config.num_speculative_tokens,
        ", adaptive" if spec_config.adaptive else "",
    )
    table = time_rows(loaded.runner, _timed_rows(config, spec_config)) if spec_config.adaptive else ()
    if table:
        log.info("decode steps by rows (ms): %s", ", ".join(f"{r}: {t * 1e3:.1f}" for r, t in table))
    return Speculation(spec_config, proposer, loaded.max_model_len, table)


def _timed_rows(config: Any, spec_config: SpeculativeConfig) -> list[int]:
    """The step sizes the cost model reads: every row count up to one verify run, then doublings of
    it up to the most rows a step decodes."""
    run = 1 + spec_config.num_speculative_tokens
    rows = list(range(1, run + 1))
    top = min(config.max_num_seqs * run, MAX_VERIFY_ROWS)
    size = 2 * run
    while size < top:
        rows.append(size)
        size *= 2
    if top > run:
        rows.append(top)
    return rows
