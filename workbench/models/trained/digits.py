"""The images the built-in convnet is trained on: scikit-learn's `load_digits`, 1,797 handwritten digits of 8×8
pixels that ship inside the scikit-learn package (nothing is downloaded), split by a seeded permutation into
`HELD_OUT` held-out images and the rest for training.

The convnet takes 3-channel images, so the grey level (0..16, scaled to 0..1) is repeated on the three channels.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import torch

from workbench.errors import WorkbenchError

HELD_OUT = 360
"""Images held out (the last 360 of the permutation; 1,437 remain for training)."""
SPLIT_SEED = 0
"""The permutation's seed: fixed, so every model (any seed, any quantized copy) is scored on the same images."""
IMAGE_SIZE = 8
CLASSES = 10


@dataclass(frozen=True)
class Digits:
    """Train and held-out images (float32 [N, 3, 8, 8], 0..1) with their labels (int64 [N]), and a digest."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    held_out_images: torch.Tensor
    held_out_labels: torch.Tensor
    digest: str
    """sha256 (hex) of the pixels and labels as scikit-learn ships them."""

    def facts(self) -> dict[str, object]:
        """JSON-ready facts a checkpoint records about its data."""
        return {"dataset": "sklearn-load_digits", "digest": self.digest, "train_images": len(self.train_labels),
                "held_out_images": len(self.held_out_labels), "split_seed": SPLIT_SEED}


@functools.lru_cache(maxsize=1)
def digits_split() -> Digits:
    """scikit-learn's digits, split (read once per process)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise WorkbenchError("the trained convnet learns scikit-learn's bundled digits; scikit-learn is not "
                             "installed: pip install scikit-learn") from error
    pixels, labels = load_digits(return_X_y=True)
    digest = hashlib.sha256(pixels.astype("<f8").tobytes() + labels.astype("<i8").tobytes()).hexdigest()
    images = torch.from_numpy(pixels).to(torch.float32).div(16.0).reshape(-1, 1, IMAGE_SIZE, IMAGE_SIZE)
    images = images.expand(-1, 3, -1, -1).contiguous()
    targets = torch.from_numpy(labels).to(torch.int64)
    order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(SPLIT_SEED))
    train, held = order[:-HELD_OUT], order[-HELD_OUT:]
    return Digits(train_images=images[train], train_labels=targets[train], held_out_images=images[held],
                  held_out_labels=targets[held], digest=digest)
