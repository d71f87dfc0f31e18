"""Train mode's recipe as the PyTorch and JAX plugins' SGD optimizers take it (one place, so the
two frameworks cannot drift apart in what they read of it)."""

from typing import Any

from accelbench.api import TrainSpec


def sgd_settings(spec: TrainSpec) -> dict[str, Any]:
    """Momentum, Nesterov and weight decay as the recipe gives them; the learning rate starts at
    0: core sets it before every step (``train_step(learning_rate)``)."""
    return {
        "momentum": spec.momentum,
        "nesterov": spec.nesterov,
        "weight_decay": spec.weight_decay,
        "learning_rate": 0.0,
    }
