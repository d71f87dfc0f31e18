"""The plugin author's whole surface: everything a plugin may import from accelbench.

``import accelbench.api as accelbench`` (or the same names from the top-level package) is what
the built-in plugins use, and a test holds them to it. Names here keep their meaning within one
``PLUGIN_API`` version; a change that breaks a plugin bumps it, and a removed field or method
answers with one line naming its replacement (``accelbench.backend.MIGRATIONS``).

- the protocol: ``Backend`` (what a backend implements), ``BackendInfo`` (what it declares),
  ``Prepared`` (what ``prepare`` reports), ``DeviceMemory`` (what ``device_memory``
  reports, since 2.1), ``Option`` (a typed backend option), ``RunConfig``
  (the resolved run it is given), ``hookimpl`` (marks ``register_backends``)
- train mode, since 2.3: ``TrainSpec`` (``config.train_spec``: the dataset, stopping rule and
  recipe, read as attributes) and ``DatasetManifest`` (what ``prepare_training`` is given: the
  converted dataset's splits, image statistics and files)
- a backend driven by a step loop of its own framework objects: ``RunBackend``
- several workers: ``Engine``, ``LaunchPlan``, ``LocalCluster``, ``ClusterRank``
- helpers: ``training_flops`` (FLOPs of a training step from counted multiply-adds),
  ``cpu_flags``, ``cpu_model``, ``gpus`` (what the machine has), ``cache_dir`` (accelbench's
  folder in the user's cache, since 2.2: where a plugin keeps what it reads once per machine),
  ``describe_preprocessing`` and
  ``EVAL_CROP_FRACTION`` (train mode's ImageNet preprocessing, described alike by every plugin),
  ``UsageError`` (bad input: one line, exit 2)
"""

from accelbench.backend import Backend, BackendInfo, DeviceMemory, Option, Prepared, RunBackend, training_flops
from accelbench.environments.datasets import DatasetManifest
from accelbench.environments.machine import cache_dir, cpu_flags, cpu_model, gpus
from accelbench.errors import UsageError
from accelbench.execution.training import EVAL_CROP_FRACTION, describe_preprocessing
from accelbench.hookspecs import hookimpl
from accelbench.launch import ClusterRank, Engine, LaunchPlan, LocalCluster
from accelbench.planning.config import RunConfig, TrainSpec

#: the version of this surface; a plugin may declare the one it was written for (``PLUGIN_API``
#: in its module): a plugin written for another major version is told what changed
PLUGIN_API = "2.3"

__all__ = [
    "PLUGIN_API",
    "Backend",
    "BackendInfo",
    "ClusterRank",
    "DatasetManifest",
    "DeviceMemory",
    "EVAL_CROP_FRACTION",
    "Engine",
    "LaunchPlan",
    "LocalCluster",
    "Option",
    "Prepared",
    "RunBackend",
    "RunConfig",
    "TrainSpec",
    "UsageError",
    "cache_dir",
    "cpu_flags",
    "cpu_model",
    "describe_preprocessing",
    "gpus",
    "hookimpl",
    "training_flops",
]
