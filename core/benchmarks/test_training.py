"""Training-step benchmarks over every installed backend and the given batch sizes.

    pytest --pyargs accelbench.benchmarks --benchmark-only --benchmark-json out.json \
        [--accelbench-batch-sizes 8,16] [--accelbench-image-size 224] [--accelbench-rounds 20]
    pytest --pyargs accelbench.benchmarks --benchmark-only --benchmark-autosave
    pytest --pyargs accelbench.benchmarks --benchmark-only --benchmark-compare --benchmark-compare-fail=median:5%
"""


def test_training_step(accelbench_benchmark, accelbench_backend, accelbench_batch, accelbench_options):
    record = accelbench_benchmark(
        accelbench_backend,
        rounds=accelbench_options["rounds"],
        warmup_rounds=accelbench_options["warmup"],
        global_batch=accelbench_batch,
        **accelbench_options["config"],
    )
    if record is not None:
        assert record.status == "ok" and record.throughput is not None
        assert record.throughput.images == accelbench_batch * accelbench_options["rounds"] * record.steps.steps_per_sample
