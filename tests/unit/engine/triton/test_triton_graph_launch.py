"""The attention launch of a captured mixed step (sized by its bucket, not by the step), the
arguments no kernel specialises on, and where compiled kernels are kept."""

import os

import numpy as np
import torch

from lmiserve.rolling_batch import ops as ops_package
from lmiserve.rolling_batch.ops.metadata import PagedAttentionInputs
from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.rolling_batch.ops.triton_kernels import attention
from lmiserve.rolling_batch.runner.mixed_graphs import _layout
from lmiserve.rolling_batch.runner.step_inputs import StepArrays
from tests.unit.engine.test_ops import BS, paged

DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu"


def _step(lengths, q_lens, tables, num_decodes) -> StepArrays:
    t = sum(q_lens)
    cu = np.zeros(len(q_lens) + 1, dtype=np.int32)
    np.cumsum(q_lens, out=cu[1:])
    return StepArrays(
        input_ids=np.zeros(t, dtype=np.int64),
        positions=np.zeros(t, dtype=np.int64),
        slots=np.zeros(t, dtype=np.int64),
        block_tables=tables.numpy(),
        cu_q_lens=cu,
        seq_lens=np.array(lengths, dtype=np.int32),
        num_decodes=num_decodes,
    )


def test_a_mixed_bucket_launch_gives_the_steps_own_attention():
    """Two decodes and a prompt chunk laid out in bucket (4 sequences, 40 extra tokens): one
    dummy sequence, the padding run last, max_q_len the bucket's bound (41). The step's rows
    equal the reference and, bit for bit, the launch sized by the step itself."""
    heads, kv_heads, dim = 4, 2, 32
    lengths, q_lens = [17, 50, 70], [1, 1, 23]
    k_cache, v_cache, tables, _ = paged(lengths, kv_heads, dim, num_blocks=64, seed=13)
    q = torch.randn(sum(q_lens), heads, dim)
    b, p = 4, 40
    _, (padded_tables, cu, lens), nd = _layout(b, p, _step(lengths, q_lens, tables, 2))
    assert nd == 2 and cu.tolist() == [0, 1, 2, 25, 26, 45] and lens.tolist() == [17, 50, 70, 1, 19]
    width = max(padded_tables.shape[1], -(-(p + 1) // BS))
    full_tables = torch.zeros((b + 1, width), dtype=torch.int32)
    full_tables[:, : padded_tables.shape[1]] = torch.from_numpy(padded_tables)
    q_padded = torch.cat([q, torch.randn(int(cu[-1]) - q.shape[0], heads, dim)])
    scale = dim**-0.5

    def launch(q_rows, tables_, cu_, lens_, max_q_len):
        args = (t.to(DEVICE) for t in (q_rows, k_cache, v_cache, tables_, cu_, lens_))
        return attention.paged_attention(*args, max_q_len, scale).cpu()

    bound = launch(q_padded, full_tables, torch.from_numpy(cu), torch.from_numpy(lens), p + 1)
    cu_step = torch.tensor([0, 1, 2, 25], dtype=torch.int32)
    lens_step = torch.tensor(lengths, dtype=torch.int32)
    own = launch(q, tables, cu_step, lens_step, max(q_lens))
    assert torch.equal(bound[: q.shape[0]], own)
    want = ReferenceOps().attention(q, k_cache, v_cache, PagedAttentionInputs.of(tables, cu_step, lens_step), scale)
    assert torch.allclose(bound[: q.shape[0]], want, atol=1e-5)
    assert torch.isfinite(bound).all()


def _not_specialised(kernel) -> set:
    names = getattr(kernel, "do_not_specialize", None)
    if names is None:  # the interpreter keeps the decorator's arguments
        names = kernel.kwargs.get("do_not_specialize", ())
    return set(names)


def test_the_arguments_that_vary_with_the_step_are_not_specialised_on():
    assert {"table_stride", "window", "scale"} <= _not_specialised(attention._paged_attention_kernel)


def test_triton_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    ops_package.create_ops("cpu", "cuda")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / ".cache" / "lmiserve" / "triton")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")
    ops_package.create_ops("cpu", "cuda")
    assert os.environ["TRITON_CACHE_DIR"] == "/elsewhere"
