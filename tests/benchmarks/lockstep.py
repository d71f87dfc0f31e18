"""Lockstep: a plugin's warm worker and its reference's warm process (a bare loop, or a shipped
program), both alive, taking turns in blocks of a few steps (A B | B A | A B ...), so the two
blocks of a pair are seconds apart.

Why: on a shared VM the machine's speed moves over tens of seconds (a neighbour on the host's
cores). On the 2-core Zen 4 VM (2026-12-04) one side's trials 24 s apart differed by up to 10%
while the steps within a trial varied 3-7%: rounds of fresh processes pair trials 24 s or more
apart and inherit the drift; blocks of two seconds, one right after the other, share it.

What is compared is each side's warm steady state. The plugin's side is accelbench's own lockstep
side (``accelbench.execution.lockstep.Side``: the worker ``accelbench run`` starts, with the environment it
gives it, warmed up by the config's rule, its blocks timed in the worker and the worker stopped
between them, exactly as ``accelbench run --schedule lockstep`` drives it); the bare loop times
its own blocks (``bare_timing.py``). Neither side's start-up is in it: rounds of whole
``accelbench run`` invocations measure that path.

Every side is parked alike while another runs its block: stopped (SIGSTOP) right after its block
and continued (SIGCONT) right before its next, then given core's settling pause
(``accelbench.execution.lockstep.SETTLE_S``). A waiting framework is not idle (an OpenMP runtime spins its
threads for a while after a parallel region), and on the Zen 4 VM the TF plugin's 1-step blocks
ran ~5% faster after 1.5 s stopped than after 1.5 s waiting in a pipe read: a side parked another
way than its peer would be favoured or penalised by it.

A shipped reference (tf_cnn_benchmarks, MXNet's ``train_imagenet.py``, the Model Garden) runs its
own loop and cannot be asked for a block: ``ShippedSide`` lets it run and stops it by job control
(SIGSTOP to its process group) right after the line it prints for a step, continuing it (SIGCONT)
for its next block. Rounds of its whole runs paired runs half a minute apart on a
VM whose speed moves on that scale (their rounds spread ±7% on the Zen 4 VM, so a 2% bar needed
~40 of them).

Process pairs (``in_pairs``): every round of one pair of processes shares what was decided once per
process — where its memory landed, how its threads were placed, which kernels a JIT or autotuner
picked. On the Zen 4 VM two lockstep runs of the same case 50 minutes apart decided opposite ways
(jax_flax bf16 at batch 32: 0.952 (0.930-0.974), then 1.040 (1.014-1.067)): the rounds' interval
is the spread of blocks, not of processes. With several pairs, each opened afresh (the side that
starts first, and blocks first, alternating from pair to pair as ``accelbench.execution.schedule.round_order``
orders them), one pair is one unit: its ratio is the two sides' images over seconds within it, and
the interval is over pairs (``accelbench.analysis.stats.paired_ratio``), as ``accelbench compare`` decides a
lockstep run's.
"""

import collections
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import tempfile
import time
from datetime import datetime, timezone

from bare_timing import ANSWER, LOCKSTEP, READY
from bench_overhead import HERE, alternate, kept, learn

from accelbench.execution.lockstep import SETTLE_S
from accelbench.execution.schedule import round_order

#: a lockstep case holds its worker for many blocks; the worker's timeout counts per phase
SESSION_TIMEOUT_S = 6 * 3600.0


def whole(steps, per, unit):
    """How many ``unit`` (calls, or step lines) of ``per`` steps a block of ``steps`` is; a block
    that is not whole ones is refused, not rounded (its images would not be the steps it ran)."""
    if steps % per:
        raise ValueError(f"a block of {steps} steps is not whole {unit} of {per}")
    return steps // per


def run_config(args, batch):
    """The plugin and RunConfig of a case's ``accelbench run`` arguments (flag, value pairs)."""
    from accelbench.planning.config import RunConfig, parse_option

    fields, options, plugin = {"global_batch": batch, "timeout_s": SESSION_TIMEOUT_S}, {}, None
    for flag, value in zip(args[::2], args[1::2]):
        if flag == "--plugin":
            plugin = value
        elif flag == "--option":
            options.update([parse_option(value)])
        elif flag in ("--precision", "--variant", "--device"):
            fields[flag.removeprefix("--")] = value
        else:
            raise ValueError(f"lockstep: no RunConfig field for {flag}")
    return plugin, RunConfig.from_dict({**fields, "options": options})


class PluginSide:
    """The plugin's worker as ``accelbench run --schedule lockstep`` drives it: core's lockstep side
    (``accelbench.execution.lockstep.Side``), opened (checked, prepared, warmed up by a fixed warm-up of
    ``warmup`` steps and one more timed call) and parked; ``block(steps)`` continues it, times that
    many steps in one timing loop in the worker and parks it again."""

    def __init__(self, args, batch, warmup):
        from accelbench.environments import machine as environment
        from accelbench.environments import python_envs as envs
        from accelbench.execution import runner
        from accelbench.execution.lockstep import Side, SideUnavailable
        from accelbench.execution.processes import WorkerFailure
        from accelbench.records.results import RunContext
        from accelbench.registry import PluginHost

        plugin, config = run_config(args, batch)
        [item] = runner.plan(PluginHost().select([plugin]), config.replace(warmup_steps=warmup, warmup="fixed"))
        if item.precheck:
            raise SystemExit(f"{plugin}: {item.precheck.reason}")
        self.batch, self.rounds, self.clock0 = batch, 0, time.monotonic()
        self.failure = (SideUnavailable, WorkerFailure, envs.EnvironmentNotMade)
        try:
            python, described = envs.interpreter(item.setup, True, lambda text: print(text, flush=True))
            self.ctx = RunContext(
                item.ref, item.config, environment.collect(item.ref.backend.describe().requires), worker=described
            )
            self.side = Side(self.ctx, 0, runner.RunObserver())
            self.side.open(python)
        except self.failure as exc:
            self.close()
            raise SystemExit(f"{plugin}: {exc}") from None
        self.loop = self.side.prepared.steps_per_call
        if warmup % self.loop:
            self.close()
            raise SystemExit(f"{plugin}: it runs {self.loop} steps a call; a warm-up of {warmup} is not whole calls")

    def block(self, steps):
        """``steps`` steps in whole calls (a backend that runs a loop of steps a call, as
        ``tpu_official``'s ``steps_per_loop``, takes its blocks in whole loops)."""
        calls = whole(steps, self.loop, "calls")
        try:
            block = self.side.block(calls, self.rounds, self.clock0)
        except self.failure as exc:
            raise SystemExit(f"the plugin's worker failed: {exc}") from None
        self.rounds += 1
        return self.batch * block.steps, block.seconds

    def record(self, timed_by):
        """The record of the blocks so far (of the process's first call alone before any block),
        as ``accelbench run`` builds a lockstep side's."""
        from accelbench.records.results import TrialOutcome, build

        side = self.side
        first = TrialOutcome("ok", "", side.first_call, side.prepared, startup=side.startup)
        outcome = side.outcome() if side.blocks else first
        outcome.prepared = dataclasses.replace(outcome.prepared, settings={**outcome.prepared.settings, "timed_by": timed_by})
        return build(dataclasses.replace(self.ctx, outcomes=[outcome]))

    def close(self):
        if hasattr(self, "side"):
            self.side.close()


class BareSide:
    """A bare loop in lockstep mode (``bare_timing.py``), warmed up; ``block(steps)`` times steps."""

    def __init__(self, command, batch, warmup, python, env):
        script, *rest = command
        self.log = tempfile.TemporaryFile("w+")  # frameworks write much to stderr; a pipe could fill
        self.process = subprocess.Popen(
            [python, str(HERE / script), *rest, "--batch", str(batch), "--warmup", str(warmup), "--timed", "1"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
            env={**os.environ, **env, LOCKSTEP: "1"},
        )
        try:
            self._answer(READY)
        except SystemExit:
            self.close()  # its log, which nothing else would close
            raise
        self._signal(signal.SIGSTOP)  # parked as the plugin's side is, until its first block

    def _answer(self, prefix):
        for line in self.process.stdout:
            if line.startswith(prefix):
                return line.removeprefix(prefix)
        self.log.seek(0)
        tail = " ".join(self.log.read().split()[-60:])
        raise SystemExit(f"the bare loop exited ({self.process.wait()}): {tail}")

    def _signal(self, which):
        if self.process.poll() is None:
            os.kill(self.process.pid, which)

    def block(self, steps):
        self._signal(signal.SIGCONT)
        time.sleep(SETTLE_S)
        self.process.stdin.write(f"{steps}\n")
        figures = json.loads(self._answer(ANSWER))
        self._signal(signal.SIGSTOP)
        return figures["images"], figures["wall_time_s"]

    def close(self):
        if self.process.poll() is None:
            self._signal(signal.SIGCONT)  # a stopped loop would not read the end of its stdin
            self.process.stdin.close()  # the end of its stdin ends the loop
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


class ShippedSide:
    """A shipped reference program, as it ships, in lockstep by job control. It runs its own loop
    and prints a line per step, or per loop of ``steps_per_line`` steps (``step_line`` finds them);
    after ``warmup`` of those lines it is stopped, and ``block(steps)`` continues it until that
    many more steps' lines have come, then stops it again.

    A block's seconds are the time the program was let run between the step line that ended its
    previous block and the one that ends this block: from that line to the stop, plus from the
    continue to this block's last line. The stopped time is left out, and a line's delay through
    the pipe, alike at both ends, cancels. A step the program began before the stop took effect
    (the few microseconds from reading its line to the signal) is counted where it ran: in the
    running time before the stop. ``scratch`` (a TemporaryDirectory the program works in) is
    removed when the side closes."""

    def __init__(self, command, step_line, batch, warmup, cwd=None, env=None, scratch=None, steps_per_line=1):
        from accelbench.execution.worker_main import die_with_parent

        self.step_line, self.batch, self.scratch = step_line, batch, scratch
        self.steps_per_line = steps_per_line
        self.tail = collections.deque(maxlen=40)  # its last lines, for the reason if it dies
        # its own session: the stop and continue reach every process it starts, and nothing of a
        # terminal's signals; stderr merged (MXNet logs its step lines there); killed with this
        # process however it dies, as core's workers are (left stopped, it would wait for a SIGCONT
        # that never comes)
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        try:
            for _ in range(warmup):
                self.last_line = self._next_step()
            self._stop()
        except SystemExit:
            self.close()
            raise

    def _next_step(self):
        """The arrival time of the program's next step line."""
        for line in self.process.stdout:
            self.tail.append(line.rstrip())
            if self.step_line.search(line):
                return time.perf_counter()
        raise SystemExit(f"the reference exited ({self.process.wait()}): {' | '.join(self.tail)[-1500:]}")

    def _signal(self, which):
        os.killpg(self.process.pid, which)

    def _stop(self):
        self._signal(signal.SIGSTOP)
        self.stopped_at = time.perf_counter()

    def block(self, steps):
        lines = whole(steps, self.steps_per_line, "lines")
        ran_before_stop = self.stopped_at - self.last_line
        time.sleep(SETTLE_S)  # as every side: the one that ran last has settled into its stop
        continued_at = time.perf_counter()
        self._signal(signal.SIGCONT)
        for _ in range(lines):
            self.last_line = self._next_step()
        self._stop()
        return self.batch * steps, ran_before_stop + (self.last_line - continued_at)

    def close(self):
        if self.process.poll() is None:
            self._signal(signal.SIGKILL)  # it would run on for its million steps; nothing of it is kept
            self.process.wait()
        self.process.stdout.close()
        if self.scratch is not None:
            self.scratch.cleanup()


@contextlib.contextmanager
def sides(args, reference_side, batch, warmup, seen, keep=None, reference_first=False):
    """Both sides, warmed up one after the other (never beside each other); ``seen`` gets the
    plugin's record of its warm-up (FLOPs, peak, settings, Python), from which
    ``reference_side(seen)`` starts the reference's side (a ``BareSide`` or a ``ShippedSide``: its
    interpreter and environment may follow the plugin's). Yields (plugin side, reference side);
    closes both after, the plugin's record of its blocks kept in ``keep`` if given. ``reference_first``:
    the reference starts and warms up first, from what an earlier pair left in ``seen``."""
    plugin = reference = None
    try:
        if reference_first:
            reference = reference_side(seen)
        plugin = PluginSide(args, batch, warmup)
        learn(plugin.record("bench_reference --lockstep"), seen)
        if reference is None:
            reference = reference_side(seen)
        yield plugin, reference
        if keep is not None:
            from accelbench.records.results import write_results

            stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
            # a results file as accelbench run writes one, validated against the schema
            write_results(kept(keep, f"lockstep-{stamp}.json"), [plugin.record("bench_reference --lockstep")])
    finally:
        if reference is not None:
            reference.close()
        if plugin is not None:
            plugin.close()


def in_pairs(name, open_pair, steps, rounds, pairs, go_on=None):
    """Lockstep over process pairs: ``pairs`` pairs (more while ``go_on(units)`` says so, once they
    have run), each opened by ``open_pair(reference_first)`` (``sides`` with all but that bound) and run
    for ``rounds`` rounds of ``steps``-step blocks. The sides alternate from pair to pair in which
    starts first and which opens the blocks; every round keeps the ABBA order within its pair.

    Returns the pooled images/sec of each side over every pair, and one unit per pair: each side's
    images/sec within it, in the order the sides started (``bench_overhead.paired`` reads which
    went first from it, as it does a round's)."""
    totals = {"accelbench": [0, 0.0], "reference": [0, 0.0]}
    units = []

    def tallied(label, block):
        def run():
            images, wall = block(steps)
            totals[label][0] += images
            totals[label][1] += wall
            return images, wall

        return run

    while len(units) < pairs or (go_on is not None and go_on(units)):
        # the order core's lockstep opens a pair's sides in: forward, then reversed, pair by pair
        reference_first = round_order(2, len(units)) == [1, 0]
        with open_pair(reference_first) as (plugin, reference):
            runners = {"accelbench": tallied("accelbench", plugin.block), "reference": tallied("reference", reference.block)}
            if reference_first:
                runners = dict(reversed(runners.items()))
            rate, _ = alternate(f"{name} pair {len(units) + 1}", runners, rounds)
        units.append({label: rate[label] for label in runners})
        print(f"  {name} pair {len(units)}: ratio {rate['accelbench'] / rate['reference']:.3f}", flush=True)
    return {label: images / wall for label, (images, wall) in totals.items()}, units
