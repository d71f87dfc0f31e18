"""Where a training step's time goes: the plugin's own step (prepared by the plugin, as a worker
does) under its framework's profiler, the operators grouped into the same categories for every
framework, so PyTorch's step can be laid beside MXNet's op by op.

    LD_PRELOAD=libtcmalloc_minimal.so.4 python tests/benchmarks/profile_ops.py --plugin torch_ref
    LD_PRELOAD=libtcmalloc_minimal.so.4 python tests/benchmarks/profile_ops.py --plugin torch_ref --option fused_sgd=false
    LD_PRELOAD=libjemalloc.so.2 python tests/benchmarks/profile_ops.py --plugin mxnet_ngc --variant v1.5
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 \\
        python tests/benchmarks/profile_ops.py --plugin tf_benchmarks --variant v1 --batch 32 --steps 3
    python tests/benchmarks/profile_ops.py --reference tf_cnn_benchmarks --variant v1 --batch 32 --steps 3

TensorFlow's ops are read from its profiler's trace (XSpace), over the timed steps only; the
reference tf_cnn_benchmarks runs from ``../shared/references`` (its README's command) in this
process under the same profiler, its last ``--steps`` session runs taken. TensorFlow runs two
inter-op threads on two cores, so its operators overlap and their times add up to more than the
step: compare categories between runs, not with the step's wall time -- or give both
``--inter-op-threads 1``, which runs one operator at a time, so each one's time is its own.

(The step runs in this process, so the plugin's measured allocator is preloaded by hand, as its
workers get it, and so are its huge pages: the TF plugins' workers run glibc's malloc with
``glibc.malloc.hugetlb=1`` (``accelbench run --huge-pages``). MXNet runs with bulk execution off
here -- MXNET_EXEC_BULK_EXEC_TRAIN=0, set by this script -- or its profiler times fused segments
of operators, not operators.)

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

from bench_reference import REFERENCES, tf_cnn_command

# category: operator names (regular expressions, matched in order) of PyTorch's aten ops, MXNet's
# operators and TensorFlow's op types
CATEGORIES = [
    (
        "convolution backward",
        r"convolution_backward|_backward_Convolution|mkldnn_convolution_backward|"
        r"Conv2DBackprop",
    ),
    (
        "convolution forward",
        r"^aten::(mkldnn_)?convolution$|^aten::_convolution$|^Convolution$|mkldnn_convolution|"
        r"Conv2D$",
    ),
    ("batch norm backward", r"batch_norm_backward|_backward_BatchNorm|FusedBatchNormGrad"),
    ("batch norm forward", r"batch_norm|^BatchNorm$|FusedBatchNorm"),
    ("activation (ReLU)", r"relu|threshold_backward|Activation|^Relu"),
    ("residual add", r"^aten::add$|elemwise_add|_backward_add|broadcast_add|^AddV2$"),
    ("gradient sums", r"^AddN$"),
    ("pooling", r"pool|Pooling|MaxPool"),
    (
        "linear + loss",
        r"addmm|^aten::mm$|linear|FullyConnected|softmax|cross_entropy|nll_loss|log_softmax|pick|"
        r"MatMul|Softmax|BiasAdd",
    ),
    ("optimizer update", r"sgd|^aten::(add_|mul_|_foreach.*|lerp_)$|Optimizer|Momentum"),
    ("weight decay", r"^L2Loss$|^Mul$"),
    ("zero grads / copies", r"zero_|fill_|copy_|_copyto|empty|to_dense|reorder|clone|^Pad$|^Slice$"),
]
#: TensorFlow trace events that are not operators (the executor, regions, variable plumbing)
TF_NOT_OPS = re.compile(r"^(StartRegion|StopRegion|Record|ReadVariableOp|VariableV2|_Arg|_Retval|NoOp|Identity)$")


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if re.search(pattern, name):
            return label
    return "other"


def prepare(plugin: str, variant: str | None, batch: int, inter_op_threads: int | None, options: dict | None = None):
    """The plugin's backend, prepared exactly as a worker prepares it (process settings first)."""
    from accelbench.execution import runner
    from accelbench.execution.worker_main import apply_process_settings
    from accelbench.planning.config import RunConfig
    from accelbench.registry import PluginHost

    [ref] = PluginHost().select([plugin])
    [plan] = runner.plan(
        [ref],
        RunConfig(
            global_batch=batch, precision="fp32", variant=variant, inter_op_threads=inter_op_threads, options=options or {}
        ),
    )
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
    return batch * steps / wall, {
        "user_s": (after.ru_utime - before.ru_utime) / steps,
        "system_s": (after.ru_stime - before.ru_stime) / steps,
        "minor_faults": (after.ru_minflt - before.ru_minflt) / steps,
    }


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


def tf_trace(run_steps, steps: int) -> dict[str, float]:
    """Total time per TensorFlow op type over the last ``steps`` step-sized calls (a tf.function's
    run or a session run) that ``run_steps()`` makes under TensorFlow's profiler, in ms."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            run_steps()
        finally:
            tf.profiler.experimental.stop()
        [trace] = Path(logdir).rglob("*.xplane.pb")
        return tf_op_times(trace.read_bytes(), steps)


def tf_op_times(trace: bytes, steps: int) -> dict[str, float]:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(trace)
    [host] = [plane for plane in space.planes if plane.name == "/host:CPU"]
    names = host.event_metadata
    events = [
        (line.name, names[e.metadata_id].name, line.timestamp_ns * 1000 + e.offset_ps, e.duration_ps)
        for line in host.lines
        for e in line.events
    ]
    # the steps: a tf.function's whole run (KernelAndDeviceFunc::Run) or a session's, 0.5 s or more
    windows = sorted(
        (start, start + length)
        for _, name, start, length in events
        if name in ("KernelAndDeviceFunc::Run", "SessionRun") and length > 5e11
    )[-steps:]
    ops = defaultdict(float)
    for thread, name, start, length in events:
        op_type = name.rpartition(":")[2]
        if not thread.startswith("tf_Compute") or ":" not in name or name.startswith("ExecutorState"):
            continue
        if TF_NOT_OPS.match(op_type) or not any(a <= start < b for a, b in windows):
            continue
        ops[op_type.removeprefix("_MklNative").removeprefix("_Mkl")] += length / 1e9
    return ops


def tf_cnn_benchmarks_ops(
    references: Path, variant: str, batch: int, warmup: int, steps: int, inter_op_threads: int | None
) -> dict[str, float]:
    """tf_cnn_benchmarks' own step (its README's command, run in this process) under the profiler."""
    import runpy
    import sys

    model = "resnet50" if variant == "v1" else "resnet50_v1.5"
    threads = [f"--num_inter_threads={inter_op_threads}"] if inter_op_threads else []
    sys.argv = tf_cnn_command(references, [f"--model={model}", *threads], batch, warmup, steps)
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    sys.path.insert(0, str(Path(sys.argv[0]).parent))

    def run_steps():
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit:  # absl's app.run exits when it is done
            pass

    return tf_trace(run_steps, steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--plugin", choices=["torch_ref", "mxnet_ngc", "tf_benchmarks"])
    which.add_argument("--reference", choices=["tf_cnn_benchmarks"], help="a reference's own step instead")
    parser.add_argument("--variant", default=None, help="default: the plugin's first (the reference: v1)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="profiled steps (and as many unprofiled)")
    parser.add_argument("--references", type=Path, default=REFERENCES, help=f"default {REFERENCES}")
    parser.add_argument(
        "--inter-op-threads", type=int, default=None, help="default: the framework's; 1 runs one operator at a time"
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a backend option, as accelbench run's (repeatable), e.g. fused_sgd=false",
    )
    args = parser.parse_args()
    if args.reference:
        ops = tf_cnn_benchmarks_ops(
            args.references, args.variant or "v1", args.batch, args.warmup, args.steps, args.inter_op_threads
        )
        print_categories(f"{args.reference} {args.variant or 'v1'}, batch {args.batch}, fp32:", ops, args.steps)
        return
    if args.plugin == "mxnet_ngc":  # before MXNet is imported (in prepare)
        os.environ.setdefault("MXNET_EXEC_BULK_EXEC_TRAIN", "0")
    from accelbench.planning.config import parse_option  # KEY=VALUE as accelbench run's --option reads it

    backend = prepare(args.plugin, args.variant, args.batch, args.inter_op_threads, dict(map(parse_option, args.option)))
    for _ in range(args.warmup):
        backend.step()
    rate, cpu = unprofiled(backend, args.batch, args.steps)
    if args.plugin == "tf_benchmarks":
        ops = tf_trace(lambda: [backend.step() for _ in range(args.steps)], args.steps)
    else:
        ops = (torch_ops if args.plugin == "torch_ref" else mxnet_ops)(backend, args.steps)
    print_categories(
        f"{args.plugin}, batch {args.batch}, fp32: {rate:.2f} img/s unprofiled "
        f"({1000 * args.batch / rate:.0f} ms/step); per step CPU user {cpu['user_s'] * 1000:.0f} ms, "
        f"system {cpu['system_s'] * 1000:.0f} ms, {cpu['minor_faults']:.0f} minor page faults;",
        ops,
        args.steps,
    )


def print_categories(title: str, ops: dict[str, float], steps: int) -> None:
    by_category, top = defaultdict(float), defaultdict(list)
    for name, ms in ops.items():
        label = category(name)
        by_category[label] += ms / steps
        top[label].append((ms / steps, name))
    total = sum(by_category.values())
    print(f"{title} profiled operators {total:.0f} ms/step")
    print(f"{'category':<24}{'ms/step':>9}{'share':>7}   top operators (ms/step)")
    for label, ms in sorted(by_category.items(), key=lambda item: -item[1]):
        names = ", ".join(f"{n} {t:.0f}" for t, n in sorted(top[label], reverse=True)[:3])
        print(f"{label:<24}{ms:>9.1f}{ms / total:>7.1%}   {names}")


if __name__ == "__main__":
    main()
