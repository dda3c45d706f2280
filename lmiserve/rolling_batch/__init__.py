"""The continuous-batching engine: scheduler, paged KV cache, models, sampler and the engine process."""
