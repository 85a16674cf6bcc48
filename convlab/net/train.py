"""Train the course's models on the Fashion-MNIST training set (PyTorch, CPU is enough).

PyTorch is an optional extra (`pip install -e ".[train]"`): nothing else in convlab imports it.
The trained parameters are written as .npz with metadata: the layer spec, the recipe, and the
accuracy the CPU reference gets with them at batch 10, 100, 1000 and 10000.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import ConvlabError
from ..models import (ACCURACY_BATCHES, Conv, Dense, Flatten, MaxPool, ModelSpec, Softmax, Tanh,
                      Weights, get_model, save_weights, weights_path)
from ..oracle import reference
from . import data

DEFAULT_DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
TRAIN_IMAGES = "train-images-idx3-ubyte.gz"
TRAIN_LABELS = "train-labels-idx1-ubyte.gz"


@dataclass(frozen=True)
class Recipe:
    optimizer: str  # "adam" or "sgd"
    learning_rate: float
    batch_size: int
    epochs: int
    train_images: int  # the first N training images; 60000 is all of them
    seed: int
    decay_epochs: tuple[int, ...] = ()  # multiply the learning rate by decay_factor at these
    decay_factor: float = 0.2


RECIPES = {
    "ece408-high": Recipe("adam", 1e-3, 64, 6, 60_000, seed=408),
    # Under-trained on purpose: a few hundred plain SGD steps on a slice of the training set.
    "ece408-low": Recipe("sgd", 0.01, 32, 1, 3_200, seed=408),
    "ece408": Recipe("adam", 1e-3, 64, 8, 60_000, seed=408, decay_epochs=(4, 6)),
}
TRAINABLE = tuple(RECIPES)  # the Fashion-MNIST models; alexnet's weights are imported


def _require_torch():
    try:
        import torch
    except ImportError:
        raise ConvlabError("training needs PyTorch: pip install -e \".[train]\"") from None
    return torch


def _torch_model(torch, spec: ModelSpec):
    nn = torch.nn
    modules, names = [], []
    for layer in spec.layers:
        if isinstance(layer, Conv):
            modules.append(nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel,
                                     stride=layer.stride, padding=layer.pad, bias=False))
            names.append(layer.name)
        elif isinstance(layer, Tanh):
            modules.append(nn.Tanh())
            names.append(None)
        elif isinstance(layer, MaxPool):
            modules.append(nn.MaxPool2d(layer.size))
            names.append(None)
        elif isinstance(layer, Flatten):
            modules.append(nn.Flatten())
            names.append(None)
        elif isinstance(layer, Dense):
            modules.append(nn.Linear(layer.in_features, layer.out_features))
            names.append(layer.name)
        elif isinstance(layer, Softmax):
            pass  # folded into the cross-entropy loss while training
        else:
            raise TypeError(f"no PyTorch equivalent for {layer!r}")
    return nn.Sequential(*modules), names


def _export(model, names) -> dict[str, np.ndarray]:
    arrays = {}
    for module, name in zip(model, names):
        if name is None:
            continue
        arrays[f"{name}.weight"] = module.weight.detach().numpy().astype(np.float32)
        if module.bias is not None:
            arrays[f"{name}.bias"] = module.bias.detach().numpy().astype(np.float32)
    return arrays


def evaluate(weights: Weights) -> tuple[np.ndarray, dict[int, float]]:
    """The CPU reference's predictions on the whole test set and its accuracy at each batch size."""
    images, labels = data.load_test_set()
    predictions = reference.predict(weights, data.prepare_input(images, weights.spec.input_size))
    accuracy = {n: float((predictions[:n] == labels[:n]).mean()) for n in ACCURACY_BATCHES}
    return predictions.astype(np.uint8), accuracy


def train(name: str, data_dir: Path = DEFAULT_DATA_DIR, output: Path | None = None,
          log: Callable[[str], None] = print) -> Weights:
    torch = _require_torch()
    spec = get_model(name)
    recipe = RECIPES[name]
    images, labels = data.read_image_label_pair(data_dir / TRAIN_IMAGES, data_dir / TRAIN_LABELS)
    images, labels = images[:recipe.train_images], labels[:recipe.train_images]
    x = torch.from_numpy(data.prepare_input(images, spec.input_size))
    y = torch.from_numpy(labels.astype(np.int64))

    torch.manual_seed(recipe.seed)
    torch.use_deterministic_algorithms(True)
    model, names = _torch_model(torch, spec)
    if recipe.optimizer == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=recipe.learning_rate)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=recipe.learning_rate)
    loss_fn = torch.nn.CrossEntropyLoss()
    shuffle = torch.Generator().manual_seed(recipe.seed)
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, list(recipe.decay_epochs),
                                                    recipe.decay_factor)

    start = time.perf_counter()
    for epoch in range(recipe.epochs):
        order = torch.randperm(len(x), generator=shuffle)
        total = 0.0
        for i in range(0, len(x), recipe.batch_size):
            idx = order[i:i + recipe.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        schedule.step()
        log(f"{name}: epoch {epoch + 1}/{recipe.epochs} mean loss {total / len(x):.4f} "
            f"({time.perf_counter() - start:.0f} s)")
    seconds = time.perf_counter() - start

    arrays = _export(model, names)
    weights = Weights(spec=spec, arrays=arrays)
    predictions, accuracy = evaluate(weights)
    meta = {
        "layers": spec.describe(),
        "origin": spec.origin,
        "recipe": asdict(recipe),
        "training": {
            "data": f"Fashion-MNIST training set, first {recipe.train_images} images",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "seconds": round(seconds, 1),
        },
        "expected_accuracy": {str(n): a for n, a in accuracy.items()},
    }
    path = output / f"{name}.npz" if output else weights_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_weights(path, spec, {**arrays, "reference_predictions": predictions}, meta)
    log(f"{name}: CPU reference accuracy {accuracy[10000]:.4f} on 10,000 test images -> {path}")
    return Weights(spec=spec, arrays={**arrays, "reference_predictions": predictions}, meta=meta)
