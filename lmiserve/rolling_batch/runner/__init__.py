"""Running a scheduled step on the device: its inputs, the model eagerly or from captured graphs,
sampling, tensor-parallel ranks, the warm-up and the engine's start-up."""
