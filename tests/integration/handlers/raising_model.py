def handle(inputs):
    if inputs.is_empty():
        return None
    raise RuntimeError("the model refuses")
