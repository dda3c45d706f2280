"""The adapters' device slots: fixed tensors, sized at start, that the projections read.

Per layer and fused projection (``qkv``, ``o``, ``gate_up``, ``down``, as the decoder fuses its
weights) there is one ``A`` of shape ``(slots, parts * R, in)`` and one ``B`` of shape
``(slots, parts * R, out)`` (PEFT's B, transposed), with ``R = max_lora_rank``. Part ``p`` of a
fused projection (q, k and v; gate and up) owns rows ``p*R : p*R + r`` of ``A`` and of ``B``, and
in ``B`` its own output columns: one product ``x @ A.T`` then one ``@ B`` give every part its own
low-rank update. The rest is zeros, which add nothing, so an adapter of a lower rank, or one that leaves a
module alone, is exact.
"""

from __future__ import annotations

import torch

from ..models.spec import ModelSpec
from .peft_weights import LoraWeights, module_shapes

GROUPS = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


class LoraPool:
    def __init__(self, spec: ModelSpec, slots: int, rank: int, dtype: torch.dtype, device: str | torch.device):
        self.slots = slots
        self.rank = rank
        shapes = module_shapes(spec)
        self.placement: dict[str, tuple[str, int, int, int]] = {}
        """module -> (group, part, first output row, output rows)."""
        sizes: dict[str, tuple[int, int, int]] = {}
        for group, parts in GROUPS.items():
            offset = 0
            for p, module in enumerate(parts):
                fan_out = shapes[module][1]
                self.placement[module] = (group, p, offset, fan_out)
                offset += fan_out
            sizes[group] = (len(parts) * rank, shapes[parts[0]][0], offset)
        self.layers: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = [
            {
                group: (
                    torch.zeros(slots, width, fan_in, dtype=dtype, device=device),
                    torch.zeros(slots, width, fan_out, dtype=dtype, device=device),
                )
                for group, (width, fan_in, fan_out) in sizes.items()
            }
            for _ in range(spec.num_layers)
        ]
        self.parts: dict[str, tuple[int, ...]] = {
            group: (*(self.placement[m][2] for m in parts), sizes[group][2]) for group, parts in GROUPS.items()
        }
        """Each group's part boundaries in B's columns (``lora_add``'s hint: the rest of B is zeros)."""
        self.holds: dict[str, set[int]] = {group: set() for group in GROUPS}
        """The slots whose adapter adapts some module of each group."""

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for layer in self.layers for a, b in layer.values())

    def load(self, slot: int, weights: LoraWeights) -> None:
        """Put ``weights`` in ``slot`` (what was there before is cleared)."""
        for layer in self.layers:
            for a, b in layer.values():
                a[slot].zero_()
                b[slot].zero_()
        for held in self.holds.values():
            held.discard(slot)
        r = self.rank
        for index, modules in weights.layers.items():
            for module, (a_w, b_w) in modules.items():
                group, part, first, rows = self.placement[module]
                a, b = self.layers[index][group]
                rank = a_w.shape[0]
                a[slot, part * r : part * r + rank].copy_(a_w)
                b[slot, part * r : part * r + rank, first : first + rows].copy_(b_w.t())
                self.holds[group].add(slot)
