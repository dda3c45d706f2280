"""option.rolling_batch=vllm: generation by an installed vLLM behind lmiserve's engine-client
interface (see :mod:`.adapter`). Nothing here imports vLLM until the backend starts, and nothing
here imports lmiserve's own engine."""
