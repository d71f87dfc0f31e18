"""Execution: the worker process (``worker_main``) and the host's side of it (``processes``), the one
timing loop (``timing``), trials and rounds (``runner``, ``schedule``), warm sides in lock step
(``lockstep``), several workers as one run (``multiworker``, ``distributed``, ``netns``), a worker
stepped on demand (``session``), train mode (``training``), ``accelbench peak`` (``matmul_peak``),
``accelbench data``'s conversion (``conversion``), and what is watched while they run (``busy``,
``memwatch``, ``energy``, ``allocators``)."""
