"""The trial schedule: in which order the trials of a run's plans are run, and when to stop.

A machine's speed drifts over minutes (other tenants, thermal and frequency changes). Running all
trials of one backend and then all of the next puts that drift straight into their ratio. The
interleaved schedule runs trials in *rounds*, every plan once per round, and reverses the order
every other round (A B | B A | A B ...): ABBA counterbalancing, so a linear drift lands equally on
every plan over each pair of rounds, and the trials of one round, adjacent in time, can be paired.

The lockstep schedule (``accelbench.execution.lockstep``) keeps every side warm and alternates blocks of
steps within pairs of processes; its ``rounds`` are pairs.

``until``: keep adding rounds (or pairs) until every comparison the run makes is decided against a
tolerance (or its interval is as narrow as asked), or the time budget is spent.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterator

from accelbench.errors import UsageError

KINDS = ("lockstep", "interleaved", "sequential")
WHEN_BUSY = ("wait", "go")
#: lockstep: rounds of blocks in each pair of processes, and the seconds a block aims at. Six
#: rounds of 2 s blocks time 12 s of each side per pair: on the 2-core VMs a pair's start-up and
#: warm-up take 30-60 s, and the pairs' spread (process to process, 1-3%) dominates the blocks'
#: (see ``stats.blocks_per_pair`` for the rule that trades them).
DEFAULT_BLOCKS = 6
DEFAULT_BLOCK_S = 2.0
#: an ``until`` run's first pairs get twice the rounds (its own rule re-chooses them after three
#: pairs): with the sides starting at once and a warm-up that ends once the step time stops
#: falling, a pair of seconds-long steps opens in about half a minute on the 2-core VMs, and the
#: spread of a pair's ratio is mostly its blocks' (6% a round, against 1.5% from process to
#: process on the Zen 4 VM), so longer pairs count most of the run's time at the same precision
DEFAULT_UNTIL_BLOCKS = 12
#: a comparison needs at least two paired rounds before an interval exists
MIN_DECIDING_ROUNDS = 2
#: rounds of an ``until`` run when no time budget stops it first
MAX_ROUNDS = 200
#: the time budget of an ``until`` run when none is given
DEFAULT_UNTIL_BUDGET_S = 600.0
#: the time box of one trial of an ``until`` run when none is given: many short interleaved
#: trials follow a drifting machine better than a few long ones
UNTIL_TRIAL_TIME_S = 20.0


@dataclass(frozen=True)
class StopRule:
    """When an ``until`` run has its answer: ``tolerance`` (every verdict decided) or
    ``half_width`` (every ratio's 95% interval at most this wide on each side, relative)."""

    tolerance: float | None = None
    half_width: float | None = None

    def describe(self) -> str:
        if self.tolerance is not None:
            return f"every comparison decided at ±{self.tolerance:.1%}"
        return f"every ratio's 95% interval within ±{self.half_width:.1%}"


@dataclass(frozen=True)
class Schedule:
    kind: str = "interleaved"
    #: rounds (trials per plan); with ``until``, the rounds before the first decision is tried
    rounds: int = 1
    until: StopRule | None = None
    #: no trial (or pair) starts after this many seconds of the run (None: no limit)
    max_time_s: float | None = None
    #: lockstep: rounds of blocks per pair, the seconds a block aims at, and what a busy machine does
    blocks: int = DEFAULT_BLOCKS
    block_s: float = DEFAULT_BLOCK_S
    when_busy: str = "wait"
    #: lockstep: re-choose the rounds of blocks per pair from the pairs so far (``stats.blocks_per_pair``)
    adapt_blocks: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"--schedule must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.until and self.kind == "sequential":
            raise UsageError("--until-decided/--until-halfwidth need paired trials: --schedule lockstep or interleaved")
        if self.when_busy not in WHEN_BUSY:
            raise UsageError(f"--when-busy must be one of {', '.join(WHEN_BUSY)}, got {self.when_busy!r}")
        if self.blocks < 1:
            raise UsageError(f"--blocks must be at least 1, got {self.blocks}")
        if not (math.isfinite(self.block_s) and 0 < self.block_s <= 3600):
            raise UsageError(f"--block-time must be between 0 and 1 hour, got {self.block_s:g} s")

    @property
    def time_budget_s(self) -> float | None:
        """``max_time_s``; an ``until`` run given none still stops at ``DEFAULT_UNTIL_BUDGET_S``."""
        if self.max_time_s is None and self.until:
            return DEFAULT_UNTIL_BUDGET_S
        return self.max_time_s

    @property
    def round_limit(self) -> int:
        return max(self.rounds, MAX_ROUNDS) if self.until else self.rounds


def round_order(plans: int, round_index: int) -> list[int]:
    """Plan indices of one interleaved round: forward in even rounds, reversed in odd ones."""
    order = list(range(plans))
    return order if round_index % 2 == 0 else order[::-1]


def slots(schedule: Schedule, plans: int) -> Iterator[tuple[int, int]]:
    """(round, plan index) in run order, for the schedule's fixed number of rounds. An ``until``
    run asks the caller after each round whether to go on, so it walks rounds itself."""
    if schedule.kind == "sequential":
        for plan in range(plans):
            for round_index in range(schedule.rounds):
                yield round_index, plan
        return
    for round_index in range(schedule.round_limit):
        for plan in round_order(plans, round_index):
            yield round_index, plan


def parse_fraction(text: str, flag: str) -> float:
    """'3%' or '0.03' → 0.03, strictly between 0 and 1; UsageError naming ``flag`` otherwise."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"{flag} must be like 3% or 0.03, got {text!r}") from None
    if not (math.isfinite(value) and 0 < value < 1):
        raise UsageError(f"{flag} must be between 0 and 100%, got {text!r}")
    return value


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|sec|m|min|h)?\s*$")
_UNIT_S = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, flag: str) -> float:
    """'90', '90s', '5m', '1.5h' → seconds (> 0); UsageError naming ``flag`` otherwise."""
    match = _DURATION.match(text)
    if not match:
        raise UsageError(f"{flag} must be a duration like 300, 90s, 5m or 1h, got {text!r}")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"{flag} must be more than 0 seconds, got {text!r}")
    return seconds
