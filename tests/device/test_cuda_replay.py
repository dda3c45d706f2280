"""On a machine with a CUDA GPU: a replayed request (its tokens run again as a prompt chunk, the
generated ones attended by the Triton decode kernel) continues the first run's bf16 tokens and
log-probabilities bit for bit, eagerly and with the first run's decodes on captured graphs."""

import pytest

from tests.unit.engine.test_replay import check_bf16_replays_bit_for_bit, wide_heads_model  # noqa: F401

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_bf16_replays_on_cuda_continue_bit_for_bit(wide_heads_model, eager, deterministic):  # noqa: F811
    check_bf16_replays_bit_for_bit(wide_heads_model, device="cuda:0", enforce_eager=eager, deterministic=deterministic)
