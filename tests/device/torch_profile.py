"""Where a torch_ref training step's time goes, by kernel category, at each precision asked: the
evidence #57 asks for on "bf16 runs 21% slower than fp16 in PyTorch on an H200".

The step is the plugin's own (``accelbench.plugins.torch_ref.training.TorchRun``, built from a
RunConfig as the worker builds it), warmed up, then ``--steps`` steps are recorded by
``torch.profiler`` (CPU and, on a GPU, CUDA activities). Each kernel's own device time (on a CPU:
each operator's own CPU time) is summed into categories -- convolution, matrix product, batch
norm, elementwise, reduction and loss, optimizer update, copy and layout, communication, other --
by its name.
Prints, per precision, the step's wall time, each category's milliseconds a step and share, and
the largest kernels; writes ``torch-profile.json`` under ``--out``.

    python3 tests/device/torch_profile.py --out "$OUT" --precisions bf16,fp16        # on the GPU
    python3 tests/device/torch_profile.py --out /tmp/p --device cpu --precisions fp32,bf16 \\
        --model resnet_small --batch 4 --image-size 32 --steps 2
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

#: (category, pattern on the lower-cased kernel or operator name), first match wins: cuDNN's
#: batch-norm kernels are cuDNN's too (``cudnn::bn_fw_...``), and its convolution kernels are
#: implicit GEMMs, so batch norm is told apart first, then convolutions, then products
CATEGORIES = (
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|gloo"),
    ("batch norm", r"batch_norm|batchnorm|\bbn_|welford"),
    ("convolution", r"conv|cudnn|implicit_gemm|fprop|dgrad|wgrad"),
    ("matrix product", r"gemm|cutlass|cublas|matmul|addmm|\bmm\b|linear"),
    ("optimizer update", r"sgd|multi_tensor|foreach|_fused_"),
    ("copy and layout", r"copy|cast|convert|nchw|nhwc|transpose|permute|contiguous"),
    ("reduction and loss", r"reduce|softmax|nll|cross_entropy|\bsum\b|mean|max_pool|avg_pool|adaptive"),
    ("elementwise", r"elementwise|vectorized|relu|threshold|\badd|\bmul|fill|where|clamp|unrolled"),
)


def category(name: str) -> str:
    lowered = name.lower()
    return next((label for label, pattern in CATEGORIES if re.search(pattern, lowered)), "other")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for torch-profile.json")
    parser.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    parser.add_argument("--precisions", default="bf16,fp16", help="comma-separated (default bf16,fp16)")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=10, help="steps before the profile (default 10)")
    parser.add_argument("--steps", type=int, default=10, help="steps profiled (default 10)")
    parser.add_argument("--top", type=int, default=12, help="largest kernels printed per precision (default 12)")
    parser.add_argument("--option", action="append", default=[], help="a torch_ref option KEY=VALUE (repeatable)")
    return parser.parse_args(argv)


def build(args: argparse.Namespace, precision: str):
    from accelbench.planning.config import RunConfig, parse_option
    from accelbench.plugins.torch_ref.training import TorchRun

    config = RunConfig(
        model=args.model,
        variant="v1.5" if args.model == "resnet50" else None,
        global_batch=args.batch,
        per_device_batch=args.batch,
        precision=precision,
        device=args.device,
        device_count=1,
        image_size=args.image_size,
        options=dict(parse_option(text) for text in args.option),
    )
    return TorchRun(config)


def profile(run, args: argparse.Namespace) -> dict:
    """The step's wall time, unprofiled, then the profiled steps' time by category and kernel."""
    torch = run.torch
    for _ in range(args.warmup):
        run.step()
    started = time.perf_counter()
    for _ in range(args.steps):
        run.step()
    step_ms = 1e3 * (time.perf_counter() - started) / args.steps
    on_gpu = run.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_gpu else [])
    with torch.profiler.profile(activities=activities) as recorded:
        for _ in range(args.steps):
            run.step()
    kernels = own_times(recorded.key_averages(), on_gpu)
    by_category: dict[str, float] = {}
    for name, (microseconds, _) in kernels.items():
        label = category(name)
        by_category[label] = by_category.get(label, 0.0) + microseconds
    total = sum(by_category.values()) or 1.0
    largest = sorted(kernels.items(), key=lambda item: -item[1][0])[: args.top]
    return {
        "step_ms": round(step_ms, 3),
        "images_per_sec": round(args.batch / step_ms * 1e3, 2),
        "measured": "kernels' own device time (CUDA)" if on_gpu else "operators' own CPU time",
        "profiled_ms_per_step": round(total / 1e3 / args.steps, 3),
        "categories": {
            label: {"ms_per_step": round(us / 1e3 / args.steps, 3), "share": round(us / total, 4)}
            for label, us in sorted(by_category.items(), key=lambda item: -item[1])
        },
        "largest": [
            {"name": name[:160], "category": category(name), "ms_per_step": round(us / 1e3 / args.steps, 3), "calls": calls}
            for name, (us, calls) in largest
        ],
    }


def own_times(averages, on_gpu: bool) -> dict[str, tuple[float, int]]:
    """Each kernel's (on a CPU: operator's) own microseconds over the profile, and its calls."""
    times = {}
    for event in averages:
        if on_gpu:
            if str(event.device_type).endswith("CUDA"):
                times[event.key] = (float(event.self_device_time_total), int(event.count))
        elif event.self_cpu_time_total > 0 and event.key.startswith("aten::"):
            times[event.key] = (float(event.self_cpu_time_total), int(event.count))
    return times


def printed(precision: str, result: dict) -> str:
    lines = [
        f"{precision}: {result['step_ms']:.2f} ms a step ({result['images_per_sec']:.1f} img/s unprofiled); "
        f"{result['measured']}: {result['profiled_ms_per_step']:.2f} ms a step"
    ]
    lines += [f"  {label:<20}{c['ms_per_step']:>9.3f} ms {c['share']:>7.1%}" for label, c in result["categories"].items()]
    lines += [f"    {k['ms_per_step']:>8.3f} ms x{k['calls']:<5} [{k['category']}] {k['name'][:100]}" for k in result["largest"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for precision in args.precisions.split(","):
        run = build(args, precision)
        results[precision] = {"settings": run.prepared().settings, **profile(run, args)}
        print(printed(precision, results[precision]), flush=True)
        torch = run.torch
        del run
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next precision's model gets the memory back
    document = {
        "device": args.device,
        "model": args.model,
        "batch": args.batch,
        "image_size": args.image_size,
        "results": results,
    }
    (out / "torch-profile.json").write_text(json.dumps(document, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
