"""What the admission-control tests share: an engine's measured load and a control to test."""

from lmiserve.serving.admission_control import AdmissionControl, EngineLoad

FAST = EngineLoad(prefill_tokens_per_s=1000.0, decode_step_seconds=0.01)


def control(batch=4, limit=100, predictive=True, first_token_wait=0.0):
    return AdmissionControl(batch_size=batch, limit=limit, predictive=predictive, first_token_wait=first_token_wait)
