"""Where a training step's time goes: the plugin's own step (prepared by the plugin, as a worker
does) under its framework's profiler, the operators grouped into the same categories for every
framework, so PyTorch's step can be laid beside MXNet's op by op.

    LD_PRELOAD=libtcmalloc_minimal.so.4 python tests/benchmarks/profile_ops.py --plugin torch_ref
    LD_PRELOAD=libjemalloc.so.2 python tests/benchmarks/profile_ops.py --plugin mxnet_ngc --variant v1.5

(The step runs in this process, so the plugin's measured allocator is preloaded by hand, as its
workers get it. MXNet runs with bulk execution off here -- MXNET_EXEC_BULK_EXEC_TRAIN=0, set by
this script -- or its profiler times fused segments of operators, not operators.)

Prints the step time without the profiler (images/sec), then per category the operators' own
time per step (ms), its share of the profiled time, and the top operators. Profilers add their own
cost, so compare shares and per-category times between frameworks, not a profiled total with an
unprofiled one.
"""

import argparse
import json
import os
import re
import resource
import tempfile
import time
from collections import defaultdict
from pathlib import Path

# category: operator names (regular expressions, matched in order) of PyTorch's aten ops and
# MXNet's operators
CATEGORIES = [
    ("convolution backward", r"convolution_backward|_backward_Convolution|mkldnn_convolution_backward"),
    ("convolution forward", r"^aten::(mkldnn_)?convolution$|^aten::_convolution$|^Convolution$|mkldnn_convolution"),
    ("batch norm backward", r"batch_norm_backward|_backward_BatchNorm"),
    ("batch norm forward", r"batch_norm|^BatchNorm$"),
    ("activation (ReLU)", r"relu|threshold_backward|Activation"),
    ("residual add", r"^aten::add$|elemwise_add|_backward_add|broadcast_add"),
    ("pooling", r"pool|Pooling"),
    ("linear + loss", r"addmm|^aten::mm$|linear|FullyConnected|softmax|cross_entropy|nll_loss|log_softmax|pick"),
    ("optimizer update", r"sgd|^aten::(add_|mul_|_foreach.*|lerp_)$|Optimizer"),
    ("zero grads / copies", r"zero_|fill_|copy_|_copyto|empty|to_dense|reorder|clone"),
]


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if re.search(pattern, name):
            return label
    return "other"


def prepare(plugin: str, variant: str | None, batch: int):
    """The plugin's backend, prepared exactly as a worker prepares it (process settings first)."""
    from accelbench import runner
    from accelbench.config import RunConfig
    from accelbench.registry import PluginHost
    from accelbench.worker import apply_process_settings

    [ref] = PluginHost().select([plugin])
    [plan] = runner.plan([ref], RunConfig(global_batch=batch, precision="fp32", variant=variant))
    apply_process_settings(plan.config)
    backend = ref.backend
    backend.prepare(plan.config)
    return backend


def unprofiled(backend, batch: int, steps: int) -> tuple[float, dict[str, float]]:
    """Images/sec of ``steps`` steps without the profiler, and per step: this process's user and
    system CPU seconds and minor page faults (memory the kernel had to map and zero)."""
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(steps):
        backend.step()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return batch * steps / wall, {"user_s": (after.ru_utime - before.ru_utime) / steps,
                                  "system_s": (after.ru_stime - before.ru_stime) / steps,
                                  "minor_faults": (after.ru_minflt - before.ru_minflt) / steps}


def torch_ops(backend, steps: int) -> dict[str, float]:
    """Self CPU time per aten operator over ``steps`` steps, in ms."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            backend.step()
    return {event.key: event.self_cpu_time_total / 1000 for event in prof.key_averages()}


def mxnet_ops(backend, steps: int) -> dict[str, float]:
    """Total time per MXNet operator over ``steps`` steps (its aggregate stats), in ms."""
    import mxnet as mx

    with tempfile.TemporaryDirectory() as tmp:
        mx.profiler.set_config(profile_all=True, aggregate_stats=True, filename=str(Path(tmp) / "profile.json"))
        mx.profiler.set_state("run")
        for _ in range(steps):
            backend.step()
        mx.nd.waitall()
        mx.profiler.set_state("stop")
        stats = json.loads(mx.profiler.dumps(format="json"))
    ops = {}
    for domain, entries in stats["Time"].items():
        if "operator" in domain.lower():
            for name, figures in entries.items():
                ops[name] = ops.get(name, 0.0) + figures["Total"]
    return ops


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plugin", required=True, choices=["torch_ref", "mxnet_ngc"])
    parser.add_argument("--variant", default=None, help="default: the plugin's first")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="profiled steps (and as many unprofiled)")
    args = parser.parse_args()
    if args.plugin == "mxnet_ngc":  # before MXNet is imported (in prepare)
        os.environ.setdefault("MXNET_EXEC_BULK_EXEC_TRAIN", "0")
    backend = prepare(args.plugin, args.variant, args.batch)
    for _ in range(args.warmup):
        backend.step()
    rate, cpu = unprofiled(backend, args.batch, args.steps)
    ops = (torch_ops if args.plugin == "torch_ref" else mxnet_ops)(backend, args.steps)
    by_category, top = defaultdict(float), defaultdict(list)
    for name, ms in ops.items():
        label = category(name)
        by_category[label] += ms / args.steps
        top[label].append((ms / args.steps, name))
    total = sum(by_category.values())
    print(f"{args.plugin}, batch {args.batch}, fp32: {rate:.2f} img/s unprofiled "
          f"({1000 * args.batch / rate:.0f} ms/step); per step CPU user {cpu['user_s'] * 1000:.0f} ms, "
          f"system {cpu['system_s'] * 1000:.0f} ms, {cpu['minor_faults']:.0f} minor page faults; "
          f"profiled operators {total:.0f} ms/step")
    print(f"{'category':<24}{'ms/step':>9}{'share':>7}   top operators (ms/step)")
    for label, ms in sorted(by_category.items(), key=lambda item: -item[1]):
        names = ", ".join(f"{n} {t:.0f}" for t, n in sorted(top[label], reverse=True)[:3])
        print(f"{label:<24}{ms:>9.1f}{ms / total:>7.1%}   {names}")


if __name__ == "__main__":
    main()
