"""LoRA adapters on the engine: many fine-tunes of one base model in one batch.

- :mod:`.peft_weights` reads a PEFT adapter directory into per-layer low-rank factors.
- :mod:`.adapters` keeps the book (torch-free): which adapters exist, which are loaded in host
  memory (``max_cpu_loras``, least recently used first out, pinned ones never), which hold one of
  the ``max_loras`` device slots, and which requests use them.
- :mod:`.pool` holds the device slots: fixed tensors sized at start for ``max_loras`` adapters of
  rank ``max_lora_rank``, so adapter memory stays bounded.

A step's adapted rows, listed slot by slot for the device kernels in fixed buffers that captured
step graphs read (one segment per slot, ``max_loras`` of them), are the runner's
(:mod:`..runner.lora_buffers`).

Each projection of a step adds ``B[slot] @ (A[slot] @ x)`` for the runs of tokens whose request
uses the adapter in ``slot`` (the ops' ``lora_add``); tokens of requests without an adapter get
nothing added.
"""
