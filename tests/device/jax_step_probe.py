"""Why `jax_flax` trails its bare loop on a GPU: both steps in ONE process, alternating.

In one process XLA's autotuner picks each convolution's algorithm once and both compiled steps
share the choice, so a gap that survives here is in the step itself (its program or its host
dispatch), and one that vanishes was per-process. Variants, each timed in blocks of --block steps
(every step waits for its loss, as both sides of the reference benchmark do), the order rotating
from round to round:

- bare: `bare_jax.py`'s step, run in this process (its batch as arguments);
- plugin: `JaxRun.step()`, as the plugin's worker calls it (learning rate a Python float);
- plugin, rate on device: the plugin's compiled step fed its rate as a device array.

Prints each variant's images/sec (images / seconds over all blocks), its ratio to bare with the
95% interval of accelbench's paired statistics over the rounds (``stats.paired_ratio``: t on the
rounds' log-ratios, the order not regressed out, since three variants rotate), the log-ratios'
spread, and the host's dispatch time (call to return, before the wait) per step. One JSON line at
the end.
"""

import argparse
import json
import math
import runpy
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent / "benchmarks"


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--device", default="gpu", choices=["cpu", "gpu"])
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=5)
    return parser.parse_args()


def bare_step(args):
    """The bare loop's step and state, built by running bare_jax.py here without its timing."""
    sys.path.insert(0, str(BENCHMARKS))
    import bare_timing

    bare_timing.time_steps = lambda *a, **k: None
    sys.argv = [
        "bare_jax.py",
        "--precision",
        args.precision,
        "--batch",
        str(args.batch),
        "--image-size",
        str(args.image_size),
        "--device",
        args.device,
    ]
    bare = runpy.run_path(str(BENCHMARKS / "bare_jax.py"))
    state = [bare["state"]]

    def call():
        state[0], loss = bare["train_step"](state[0], bare["images"], bare["labels"])
        return loss

    return call


def plugin_steps(args):
    """The plugin's step as its worker calls it (``JaxRun._run_step`` without its wait, which
    the timing loop does), and the same compiled step fed its rate as a device array."""
    from accelbench.planning.config import RunConfig
    from accelbench.plugins.jax_flax.training import JaxRun

    run = JaxRun(
        RunConfig(
            model="resnet50",
            variant="v1.5",
            global_batch=args.batch,
            per_device_batch=args.batch,
            precision=args.precision,
            device=args.device,
            device_count=1,
            image_size=args.image_size,
        )
    )
    on_device = run.jax.device_put(run.jax.numpy.float32(run.learning_rate), run.replicated)

    def call(rate):
        run.state, loss = run._step(run.state, run.images, run.labels, rate)
        return loss

    return lambda: call(run.learning_rate), lambda: call(on_device)


def timed_block(call, steps):
    """Wall time of ``steps`` steps, each waited for, and the host's share before each wait
    (a jitted call returns once dispatched)."""
    dispatch = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        called = time.perf_counter()
        loss = call()
        dispatch += time.perf_counter() - called
        float(loss.block_until_ready())
    return time.perf_counter() - start, dispatch


def main():
    from accelbench.analysis.stats import paired_ratio

    args = parse()
    plugin, plugin_device_rate = plugin_steps(args)
    variants = {"bare": bare_step(args), "plugin": plugin, "plugin, rate on device": plugin_device_rate}
    for call in variants.values():
        timed_block(call, args.warmup)
    seconds = {name: [] for name in variants}
    dispatch = {name: 0.0 for name in variants}
    names = list(variants)
    for round_ in range(args.rounds):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            wall, host = timed_block(variants[name], args.block)
            seconds[name].append(wall)
            dispatch[name] += host
        print(
            f"round {round_ + 1}: " + "  ".join(f"{name} {args.batch * args.block / seconds[name][-1]:.1f}" for name in names),
            flush=True,
        )
    summary = {
        "precision": args.precision,
        "batch": args.batch,
        "device": args.device,
        "block": args.block,
        "rounds": args.rounds,
    }
    for name in names:
        # a block's rate is its images over its seconds, and every block holds the same images
        estimate = paired_ratio([1 / s for s in seconds[name]], [1 / s for s in seconds["bare"]])
        log_ratios = [math.log(b / s) for b, s in zip(seconds["bare"], seconds[name])]
        summary[name] = {
            "images_per_sec": round(args.batch * args.block * args.rounds / sum(seconds[name]), 2),
            "ratio_to_bare": round(estimate.ratio, 4),
            "ratio_to_bare_ci95": [round(end, 4) for end in estimate.ci95],
            "ratio_sd_pct": round(100 * statistics.stdev(log_ratios), 2) if len(log_ratios) > 1 else None,
            "dispatch_ms_per_step": round(1e3 * dispatch[name] / (args.block * args.rounds), 3),
            "step_ms": round(1e3 * sum(seconds[name]) / (args.block * args.rounds), 3),
        }
        print(f"{name}: {summary[name]}", flush=True)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
