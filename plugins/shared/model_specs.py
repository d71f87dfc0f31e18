"""Model descriptions several framework plugins build, so each builds the same architecture.

Neutral ground: no framework is imported here, and any plugin may import it (a plugin never
imports another framework's helper). Numbers only; each plugin turns them into its own layers.
"""

from __future__ import annotations

#: the small ResNet for small images: Gluon model zoo's ResNetV1(BasicBlockV1, SMALL_LAYERS,
#: SMALL_CHANNELS, thumbnail=True) -- a 3x3 stem convolution without pooling, then basic residual
#: blocks: SMALL_LAYERS blocks per stage, SMALL_CHANNELS[0] stem channels and SMALL_CHANNELS[1:]
#: per stage; global pooling, dense logits
SMALL_LAYERS = (2, 2, 2)
SMALL_CHANNELS = (16, 16, 32, 64)

#: ResNet-50's variants, v1 (the original: stride 2 in each downsampling block's first 1x1) and
#: v1.5 (the stride moved to the 3x3: NVIDIA's and the official TPU model's)
RESNET50_VARIANTS = ("v1", "v1.5")
