class _Platform:
    device_type = "cpu"


current_platform = _Platform()
