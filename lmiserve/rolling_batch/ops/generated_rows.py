"""Generated tokens run again as prompt rows are attended as the decodes that first produced them.

A replayed request (:mod:`..runner.replay`: its engine died) and a sequence recomputed after
preemption bring tokens that were generated one decode at a time; the step runs them as rows of a
prompt chunk. The device's prompt kernel adds a row's attention sums in another order than its
decode kernel (tiles of queries and keys against one query over the keys), so those rows' keys,
values and the last row's logits would round differently from the first run, and a greedy
continuation could take the other side of a later near tie. The linear layers are not the issue:
the CPU's and the deterministic mode's form each row on its own. So each row at or after its
sequence's prompt length is marked here (:attr:`.metadata.PagedAttentionInputs.generated`), and
the ops' attention attends it once more, on its own, as the decode of its position
(:meth:`.reference.ReferenceOps.attention`, which every device's ops inherit; the prompt kernel's
result for it is overwritten). Only steps that hold such rows pay for it; they run eagerly,
outside captured graphs. Deterministic mode's ops attend every prompt row as a decode already:
there no row is marked (:func:`..runner.step_inputs.build_step_arrays`).
"""

from __future__ import annotations

import numpy as np
import torch

from .metadata import GeneratedRows, PagedAttentionInputs


def generated_rows(
    positions: np.ndarray,
    block_tables: np.ndarray,
    cu_q_lens: np.ndarray,
    num_decodes: int,
    prompt_lens: np.ndarray,
    device: str | torch.device,
) -> GeneratedRows | None:
    """The rows of the prompt chunks (sequences after the ``num_decodes`` first) whose position is
    at least their sequence's prompt length; None when there are none."""
    owner = np.repeat(np.arange(cu_q_lens.shape[0] - 1), np.diff(cu_q_lens))
    rows = np.flatnonzero((owner >= num_decodes) & (positions >= prompt_lens[owner]))
    if rows.shape[0] == 0:
        return None
    tables = torch.from_numpy(np.ascontiguousarray(block_tables[owner[rows]])).to(device)
    paged = PagedAttentionInputs.one_decode_per_row(tables, (positions[rows] + 1).tolist())
    return GeneratedRows(torch.from_numpy(rows.astype(np.int64)).to(device), paged)
