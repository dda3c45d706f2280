"""An ``inference.py`` that defines only model_fn: the toolkit's defaults do the rest."""

import torch


def model_fn(model_dir):
    model = torch.nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]))
    return model.eval()
