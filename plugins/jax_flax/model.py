"""ResNet-50 v1.5 and the small ResNet in Flax (linen), written for this plugin: bottleneck blocks
[3, 4, 6, 3] with the stride in the 3x3 convolution (v1.5), convolutions without biases (each
feeds a batch norm), batch norm with momentum 0.9 and epsilon 1e-5 as the other plugins, fp32
parameters and the run's compute dtype (bf16 on the TPU recipe)."""

from __future__ import annotations

from functools import partial

import flax.linen as nn
import jax.numpy as jnp

from accelbench.plugins.shared.model_specs import SMALL_CHANNELS, SMALL_LAYERS

RESNET50_STAGES = (3, 4, 6, 3)
RESNET50_WIDTHS = (64, 128, 256, 512)


class Block(nn.Module):
    """A residual block's fields and its shortcut: a strided 1x1 projection when the shape changes."""

    channels: int
    stride: int
    conv: type
    norm: type

    def join(self, x, y):
        shortcut = x
        if shortcut.shape != y.shape:
            shortcut = self.norm()(self.conv(y.shape[-1], (1, 1), (self.stride, self.stride))(x))
        return nn.relu(y + shortcut)


class Bottleneck(Block):
    @nn.compact
    def __call__(self, x):
        y = nn.relu(self.norm()(self.conv(self.channels, (1, 1))(x)))
        y = nn.relu(self.norm()(self.conv(self.channels, (3, 3), (self.stride, self.stride))(y)))
        return self.join(x, self.norm()(self.conv(4 * self.channels, (1, 1))(y)))


class Basic(Block):
    @nn.compact
    def __call__(self, x):
        y = nn.relu(self.norm()(self.conv(self.channels, (3, 3), (self.stride, self.stride))(x)))
        return self.join(x, self.norm()(self.conv(self.channels, (3, 3))(y)))


class ResNet(nn.Module):
    num_classes: int
    small: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = True):
        conv = partial(nn.Conv, use_bias=False, dtype=self.dtype, param_dtype=jnp.float32, padding="SAME")
        norm = partial(
            nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5, dtype=self.dtype, param_dtype=jnp.float32
        )
        x = x.astype(self.dtype)
        if self.small:  # a 3x3 stem, no pooling, basic blocks (model_specs)
            x = nn.relu(norm()(conv(SMALL_CHANNELS[0], (3, 3))(x)))
            stages, block = zip(SMALL_LAYERS, SMALL_CHANNELS[1:]), Basic
        else:
            x = nn.relu(norm()(conv(64, (7, 7), (2, 2))(x)))
            x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
            stages, block = zip(RESNET50_STAGES, RESNET50_WIDTHS), Bottleneck
        for stage, (blocks, channels) in enumerate(stages):
            for index in range(blocks):
                stride = 2 if stage > 0 and index == 0 else 1
                x = block(channels, stride, conv, norm)(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=jnp.float32)(x).astype(jnp.float32)


def forward_macs(model: ResNet, variables, image_size: int, channels: int = 3) -> tuple[int, str]:
    """Multiply-adds of one image's forward pass, counted on the model's conv and dense layers
    during one forward pass (each layer's kernel and output shapes); and the compute dtype seen
    at the first convolution's output."""
    total, seen = [0], []

    def count(next_fun, args, kwargs, context):
        output = next_fun(*args, **kwargs)
        module = context.module
        if context.method_name == "__call__" and isinstance(module, (nn.Conv, nn.Dense)):
            kernel = module.variables["params"]["kernel"]
            fan_in = int(jnp.prod(jnp.array(kernel.shape[:-1])))
            positions = int(jnp.prod(jnp.array(output.shape[1:-1]))) if output.ndim > 2 else 1
            total[0] += positions * fan_in * kernel.shape[-1]
            seen.append(str(output.dtype))
        return output

    with nn.intercept_methods(count):
        model.apply(variables, jnp.zeros((1, image_size, image_size, channels)), train=False)
    return total[0], seen[0]
