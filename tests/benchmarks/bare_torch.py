"""A bare, hand-written PyTorch training loop: the reference the harness is measured against.

Deliberately independent of accelbench's code: torchvision's ResNet-50 (v1.5), channels-last,
SGD momentum 0.9 with weight decay 1e-4 on conv and linear weights, cross-entropy, the same batch
and precision, timed the same way (warm-up excluded, the loss fetched every step, images / wall
time). On a GPU (``--device gpu``) the data is made on it and cuDNN's autotuner is on, as the
torchvision reference's train.py has it. Prints one JSON line.
"""

import argparse
import os

import torch
import torchvision
from bare_timing import time_steps

parser = argparse.ArgumentParser()
parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--warmup", type=int, default=10)
parser.add_argument("--timed", type=int, default=100)
parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
args = parser.parse_args()

torch.set_num_threads(os.cpu_count())
torch.manual_seed(0)
device = torch.device("cuda" if args.device == "gpu" else "cpu")
torch.backends.cudnn.benchmark = device.type == "cuda"
model = torchvision.models.resnet50(weights=None).to(device, memory_format=torch.channels_last)
weights = [p for p in model.parameters() if p.ndim > 1]
rest = [p for p in model.parameters() if p.ndim <= 1]
opt = torch.optim.SGD(
    [{"params": weights, "weight_decay": 1e-4}, {"params": rest, "weight_decay": 0.0}], lr=0.1 * args.batch / 256, momentum=0.9
)
x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device).contiguous(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (args.batch,), device=device)


def one_step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.float(), y)
    loss.backward()
    opt.step()
    return loss.item()  # brings the loss to the host: the step has finished on the device


time_steps(one_step, args.batch, args.warmup, args.timed)
