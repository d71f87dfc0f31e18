"""Headroom levers: each plugin's run beside the same run with one honest lever changed, in
alternating rounds on this machine, so "does it help here" is decided side by side.

A lever changes how the same work is executed, never the work (no fewer FLOPs, no skipped syncs,
no smaller model, no lower precision): the memory allocator preloaded into the worker, OpenMP
thread placement, oneDNN's instruction-set ceiling, the inter-op thread pool, a fused optimizer
update, the tensors' memory format, a compiler over the model (torch.compile).

    python tests/benchmarks/bench_levers.py --plugin torch --lever jemalloc --lever tcmalloc
    python tests/benchmarks/bench_levers.py --rounds 3 --timed 20      # every plugin, every lever
    python tests/benchmarks/bench_levers.py --plugin mxnet --baseline-allocator jemalloc --lever thp

The baseline runs the C library's malloc without huge pages, or ``--baseline-allocator``'s (a
plugin's kept allocator, to measure a lever on top of it; a lever naming that allocator is then
left out of the default set, and ``thp`` where the allocator has no huge-page setting).

Prints the machine, each round's images/sec, then per plugin and lever: the baseline's and the
lever's pooled images/sec, the paired ratio lever/baseline with its 95% interval (accelbench's own
`compare` statistics, order effect removed) and each round's ratio.
"""

import argparse
import ctypes.util
import sys
from pathlib import Path

from bench_overhead import alternate, paired, run_accelbench
from bench_reference import machine_header

from accelbench.execution import allocators

PLUGINS = {
    "tf": ["--plugin", "tf_benchmarks", "--variant", "v1.5", "--precision", "fp32"],
    "tf-bf16": ["--plugin", "tf_benchmarks", "--variant", "v1.5", "--precision", "bf16"],
    "mxnet": ["--plugin", "mxnet_ngc", "--variant", "v1.5", "--precision", "fp32"],
    "mxnet-bf16": ["--plugin", "mxnet_ngc", "--variant", "v1.5", "--precision", "bf16"],
    "torch": ["--plugin", "torch_ref", "--precision", "fp32"],
    "torch-bf16": ["--plugin", "torch_ref", "--precision", "bf16"],
    "jax": ["--plugin", "jax_flax", "--precision", "bf16"],  # the recipe's precision, its default
    "tpu": ["--plugin", "tpu_official", "--option", "steps_per_loop=10"],  # bf16; its timed steps: whole loops
}
#: the baseline's environment: the framework as it ships, where the plugin would otherwise pull a
#: lever by itself (mxnet_ngc raises oneDNN 2.4's ceiling to AMX on a CPU that has it)
MXNET_AS_SHIPPED = {"DNNL_MAX_CPU_ISA": "AVX512_CORE_BF16"}  # oneDNN 2.4's default ceiling: AVX-512, no AMX
BASELINE_ENV = {"mxnet": MXNET_AS_SHIPPED, "mxnet-bf16": MXNET_AS_SHIPPED}
#: and its arguments: PyTorch's own SGD update (torch_ref keeps the fused one on a CPU)
TORCH_AS_SHIPPED = ["--option", "fused_sgd=false"]
#: TensorFlow's own oneDNN choice (the TF plugins turn its oneDNN ops on on a CPU where TF 2.21 leaves them off)
TF_AS_SHIPPED = ["--option", "onednn=false"]
BASELINE_ARGS = {
    "torch": TORCH_AS_SHIPPED,
    "torch-bf16": TORCH_AS_SHIPPED,
    "tf": TF_AS_SHIPPED,
    "tf-bf16": TF_AS_SHIPPED,
    "tpu": TF_AS_SHIPPED,
}


def intel_openmp() -> str | None:
    """Intel's OpenMP runtime, where pip's ``intel-openmp`` puts it (this Python's prefix) or where
    the loader finds it; None where it is not installed."""
    beside = Path(sys.prefix) / "lib" / "libiomp5.so"
    return str(beside) if beside.exists() else ctypes.util.find_library("iomp5")


IOMP = intel_openmp()

#: a lever for PyTorch's step applies at both precisions
TORCH = ("torch", "torch-bf16")
TF = ("tf", "tf-bf16", "tpu")
# lever: (accelbench arguments, worker environment, the plugins it applies to)
LEVERS = {
    "jemalloc": (["--allocator", "jemalloc"], {}, ("tf", "mxnet", "mxnet-bf16", *TORCH, "jax")),
    "tcmalloc": (["--allocator", "tcmalloc"], {}, ("tf", "mxnet", "mxnet-bf16", *TORCH, "jax")),
    # oneDNN 2.4 (mxnet 1.9.1) may use the CPU's AMX (on a CPU without it, the same as the baseline)
    "onednn-amx": ([], {"DNNL_MAX_CPU_ISA": "AVX512_CORE_AMX"}, ("mxnet", "mxnet-bf16")),
    # libgomp's threads pinned one per core (PyTorch and MXNet run oneDNN on OpenMP; TF does not)
    "omp-bind": ([], {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}, ("mxnet", *TORCH)),
    # Intel's OpenMP runtime preloaded in place of GNU's (it serves libgomp's calls), with the
    # placement and block time PyTorch's own launcher gives it (python -m torch.backends.xeon.run_cpu)
    "iomp": (
        [],
        {"LD_PRELOAD": IOMP or "", "KMP_AFFINITY": "granularity=fine,compact,1,0", "KMP_BLOCKTIME": "1"},
        ("mxnet", *TORCH),
    ),
    # the allocator maps its memory in transparent huge pages (where the kernel's THP mode is "madvise",
    # only memory so marked gets them): a 2 MiB page is one fault and one TLB entry, not 512
    "thp": (["--huge-pages", "on"], {}, ("tf", "tpu", "mxnet", "mxnet-bf16", *TORCH, "jax")),
    # the same in another malloc, for a baseline of a kept one (tcmalloc has no huge-page setting)
    "system-thp": (["--allocator", "system", "--huge-pages", "on"], {}, ("mxnet", "mxnet-bf16", *TORCH, "jax")),
    "jemalloc-thp": (["--allocator", "jemalloc", "--huge-pages", "on"], {}, ("mxnet", "mxnet-bf16", *TORCH, "jax")),
    "inter-op-1": (["--inter-op-threads", "1"], {}, ("tf", *TORCH)),
    # TensorFlow's oneDNN ops in place of its Eigen kernels: TF 2.21 turns them on by itself only
    # on a CPU with AVX-512 VNNI/bf16 or AMX (elsewhere, the same as the baseline)
    "tf-onednn": (["--option", "onednn=true"], {}, TF),
    # TensorFlow keeps each oneDNN op's primitive for the next step instead of asking oneDNN's
    # cache for it anew (some sixty a ResNet-50 step by default, to spare the memory)
    "tf-primitive-reuse": ([], {"TF_MKL_OPTIMIZE_PRIMITIVE_MEMUSE": "false"}, ("tf", "tpu")),
    # MXNet's multi-tensor SGD: all weights' momentum updates in one operator call
    "mx-aggregate": ([], {"MXNET_OPTIMIZER_AGGREGATION_SIZE": "60"}, ("mxnet",)),
    "torch-fused-sgd": (["--option", "fused_sgd=true"], {}, TORCH),
    "torch-nchw": (["--option", "memory_format=contiguous"], {}, TORCH),
    # TorchInductor's kernels for the model's forward and backward: its first step compiles (minutes
    # on a few cores), so give it warm-up steps enough for the compile to be behind the timed ones
    "torch-compile": (["--option", "compile=true"], {}, TORCH),
}


def default_levers(plugin, baseline_allocator):
    """Every lever that applies to the plugin and changes something on this baseline."""
    chosen = []
    for lever, (args, _, plugins) in LEVERS.items():
        named = args[args.index("--allocator") + 1] if "--allocator" in args else None
        if plugin not in plugins or named == baseline_allocator:  # the baseline itself, or "thp" on it
            continue
        if lever == "iomp" and not IOMP:
            continue
        # huge pages this machine's kernel or C library, or the allocator, cannot give: accelbench
        # would refuse the run ("--huge-pages on" with tcmalloc, or under THP mode "never")
        if "--huge-pages" in args and allocators.huge_pages_problem(named or baseline_allocator):
            continue
        chosen.append(lever)
    return chosen


def measure(plugin, levers, batch, warmup, timed, rounds, keep=None, baseline_allocator="system"):
    # the baseline names its malloc without huge pages: a plugin's own measured choice (auto) would
    # hide the allocator levers; a lever's own flag comes later on the command line and wins
    base = PLUGINS[plugin] + BASELINE_ARGS.get(plugin, []) + ["--allocator", baseline_allocator, "--huge-pages", "off"]
    base_env = BASELINE_ENV.get(plugin, {})
    runners = {"baseline": lambda: run_accelbench(base, batch, warmup, timed, env=base_env, keep=keep)}
    for lever in levers:
        args, env, _ = LEVERS[lever]
        runners[lever] = lambda args=args, env=env: run_accelbench(
            base + args, batch, warmup, timed, env={**base_env, **env}, keep=keep
        )
    rate, per_round = alternate(plugin, runners, rounds)
    baseline_rounds = [r["baseline"] for r in per_round]
    results = []
    for lever in levers:
        lever_rounds = [r[lever] for r in per_round]
        estimate = paired(per_round, lever, "baseline")
        results.append(
            {
                "plugin": plugin,
                "lever": lever,
                "baseline": rate["baseline"],
                "with_lever": rate[lever],
                "ratio": estimate.ratio,
                "ci95": estimate.ci95,
                "round_ratios": [a / b for a, b in zip(lever_rounds, baseline_rounds)],
            }
        )
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plugin", action="append", choices=sorted(PLUGINS), help="default: all")
    parser.add_argument("--lever", action="append", choices=sorted(LEVERS), help="default: every lever that applies")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--timed", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help=">= 3 for an interval")
    parser.add_argument(
        "--baseline-allocator",
        choices=("system", "jemalloc", "tcmalloc"),
        default="system",
        help="the baseline's malloc (default the C library's; always without huge pages)",
    )
    parser.add_argument(
        "--keep-records",
        type=Path,
        help="a folder to keep every run's results file in (its "
        "per-step times, kernel CPU time and page faults: what made a slow round slow)",
    )
    options = parser.parse_args()
    if "iomp" in (options.lever or []) and not IOMP:
        parser.error("--lever iomp: Intel's OpenMP runtime (libiomp5.so) is not installed: pip install intel-openmp")
    print(machine_header(), flush=True)
    results = []
    for plugin in options.plugin or PLUGINS:
        levers = (
            [lever for lever in options.lever if plugin in LEVERS[lever][2]]
            if options.lever
            else default_levers(plugin, options.baseline_allocator)
        )
        if levers:
            results += measure(
                plugin,
                levers,
                options.batch,
                options.warmup,
                options.timed,
                options.rounds,
                options.keep_records,
                options.baseline_allocator,
            )
    print(
        f"\n{machine_header()}\nbatch {options.batch}, {options.timed} timed steps, {options.rounds} rounds, "
        f"baseline: {options.baseline_allocator} malloc without huge pages"
    )
    print(f"{'plugin':<11}{'lever':<17}{'baseline':>9}{'lever':>8}{'ratio':>7}  {'95% CI':<13} per round")
    for r in results:
        rounds = " ".join(f"{x:.3f}" for x in r["round_ratios"])
        print(
            f"{r['plugin']:<11}{r['lever']:<17}{r['baseline']:>9.2f}{r['with_lever']:>8.2f}{r['ratio']:>7.3f}  "
            f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}  {rounds}"
        )


if __name__ == "__main__":
    main()
