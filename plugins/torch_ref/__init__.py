"""torch_ref: torchvision's ResNet-50 (v1.5) trained the way PyTorch's reference recipe does.

A plain PyTorch training step (channels-last, SGD momentum, weight decay on conv and linear
weights only, cross-entropy), synthetic data made once on the device, ``torch.autocast`` for bf16
(CPU and GPU) and fp16 with a gradient scaler (GPU). Multi-worker runs use PyTorch's own engine:
``torch.distributed`` with DistributedDataParallel (gloo on CPU, nccl on GPU), configured through
the environment PyTorch's launcher sets (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK).

Written only against the public plugin API; PyTorch is imported only in the worker.
"""

from __future__ import annotations

import os

from accelbench.api import (
    BackendInfo,
    ClusterRank,
    Engine,
    LaunchPlan,
    LocalCluster,
    Option,
    Prepared,
    RunBackend,
    RunConfig,
    UsageError,
    hookimpl,
)
from accelbench.plugins.shared.cpu_features import onednn_unread
from accelbench.plugins.shared.extras import extra

PLUGIN_API = "2.3"  # the plugin API this built-in is written for, checked as a third-party one's

VERSION = "1.0.0"
#: the worker's ``init_process_group`` method: a file for local runs, else ``env://``
INIT_METHOD_VARIABLE = "ACCELBENCH_TORCH_INIT_METHOD"


class TorchDistributedEngine(Engine):
    """``torch.distributed``'s environment rendezvous, as ``torchrun`` sets it: rank 0 listens on
    MASTER_ADDR:MASTER_PORT (loopback for local runs). No service processes."""

    name = "torch_distributed"
    description = "torch.distributed env:// rendezvous (MASTER_ADDR/PORT, RANK, WORLD_SIZE) for DDP"

    def local(self, cluster: LocalCluster) -> LaunchPlan:
        # Nothing beyond loopback: gloo's connections on "lo" (it picks the hostname's interface
        # unless told), and the rendezvous through a file, since PyTorch's TCPStore server listens
        # on every interface whatever MASTER_ADDR says; the file lies in the job's scratch directory
        store = os.path.join(cluster.scratch, "torch-store")
        master = {
            "MASTER_ADDR": cluster.host,
            "MASTER_PORT": str(cluster.free_port()),
            "GLOO_SOCKET_IFNAME": "lo",
            INIT_METHOD_VARIABLE: f"file://{store}",
        }
        return LaunchPlan(
            self.name, cluster.workers, [rank_env(master, rank, cluster.workers, rank) for rank in range(cluster.workers)]
        )

    def rank(self, cluster: ClusterRank) -> LaunchPlan:
        if not cluster.coordinator_host:
            raise UsageError("--coordinator must be rank 0's HOST:PORT for PyTorch")
        master = {"MASTER_ADDR": cluster.coordinator_host, "MASTER_PORT": str(cluster.coordinator_port)}
        interface = interface_of(cluster.node_host) if cluster.node_host else None
        if interface:  # gloo binds the interface of the hostname's address unless told
            master["GLOO_SOCKET_IFNAME"] = interface
        local_world = cluster.local_world_size or cluster.local_workers
        env = rank_env(master, cluster.rank, cluster.workers, cluster.local_rank, local_world)
        return LaunchPlan(self.name, cluster.workers, [env])


def rank_env(master: dict[str, str], rank: int, world: int, local_rank: int, local_world: int | None = None) -> dict[str, str]:
    """torchrun's variables: the local rank picks the GPU (``cuda:LOCAL_RANK``)."""
    local = world if local_world is None else local_world
    return {**master, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local)}


def interface_of(address: str) -> str | None:
    """The name of this host's network interface that holds ``address`` (IPv4), or None."""
    import fcntl
    import ipaddress
    import socket
    import struct

    try:
        wanted = ipaddress.IPv4Address(socket.gethostbyname(address))
    except (OSError, ValueError):
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                request = struct.pack("256s", name.encode()[:15])
                found = fcntl.ioctl(probe.fileno(), 0x8915, request)  # SIOCGIFADDR
            except OSError:
                continue  # an interface without an IPv4 address
            if ipaddress.IPv4Address(found[20:24]) == wanted:
                return name
    return None


class TorchResNet50(RunBackend):
    info = BackendInfo(
        name="resnet50",
        framework="pytorch",
        requires=("torch", "torchvision"),
        models=("resnet50", "resnet_small"),
        variants={"resnet50": ("v1.5",)},
        precisions=("fp32", "bf16", "fp16"),
        devices=("cpu", "gpu"),
        # the reference recipe's --batch-size is per GPU (256 in NVIDIA's and MLPerf's ResNet-50)
        batch_semantics="per_device",
        default_batch={"cpu": 8, "gpu": 256},
        version=VERSION,
        description="torchvision ResNet-50 v1.5, plain PyTorch SGD step, channels-last, autocast",
        options={
            "compile": Option("torch.compile the model (default false)", kind="bool"),
            "compile_mode": Option(
                "torch.compile's mode (implies compile=true): reduce-overhead replays the compiled "
                "forward and backward as CUDA graphs on a GPU",
                choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
            ),
            "cuda_graph": Option(
                "capture the whole training step (forward, backward, SGD update) once as a CUDA "
                "graph and replay it each step (GPU, bf16 or fp32, one process; default false)",
                kind="bool",
            ),
            "nesterov": Option("Nesterov momentum (default false, as the torchvision reference)", kind="bool"),
            "fused_sgd": Option(
                "SGD's fused kernel (one update over every tensor, the same weights; "
                "default true on a CPU, where it was measured faster; on a GPU "
                "PyTorch's own for-each update)",
                kind="bool",
            ),
            "memory_format": Option(
                "tensors' memory format (default channels_last, as the reference recipe's --channels-last)",
                choices=("channels_last", "contiguous"),
            ),
        },
        # tcmalloc measured 1.10-1.16x the C library's malloc on the Zen 4 CPU (README, levers);
        # jemalloc 0.8x with its default settings
        data_format="imagefolder",
        environment=extra("torch"),
        allocator="tcmalloc",
    )
    engine = TorchDistributedEngine()

    def check(self, config: RunConfig) -> str | None:
        from . import training

        return training.device_problem(config)

    def is_out_of_memory(self, error: BaseException) -> bool:
        return type(error).__name__ == "OutOfMemoryError" or super().is_out_of_memory(error)

    def prepare(self, config: RunConfig) -> Prepared:
        from . import training

        self.run = training.TorchRun(config)
        return self.run.prepared()

    # accelbench peak: PyTorch's matrix product at the run's precision (fp32 on a CPU: the faster
    # of its two libraries, gemm.py)
    def prepare_matmul(self, config: RunConfig, size: int) -> Prepared:
        from . import training

        torch = training.import_torch(config)
        device = torch.device("cuda:0" if config.device == "gpu" else "cpu")
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[config.resolved_precision]
        generator = torch.Generator().manual_seed(config.seed)
        left, right = (torch.randn(size, size, generator=generator).to(device, dtype) for _ in range(2))
        self.product = lambda: left @ right
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        settings = {"threads": torch.get_num_threads()}
        if device.type == "cpu" and config.resolved_precision == "fp32":
            settings.update(self._faster_cpu_gemm(torch, left, right, size))
        return Prepared(
            device_name=training.device_name(torch, device),
            framework_version=torch.__version__,
            # a product oneDNN is not asked about: told from the CPU and the ceiling
            settings=settings,
            warnings=training.cpu_bf16_warnings(config, onednn_unread()),
        )

    def _faster_cpu_gemm(self, torch, left, right, size: int) -> dict:
        """fp32 on a CPU: PyTorch's BLAS (MKL) or oneDNN, whichever multiplies faster here (MKL
        runs a generic path on an AMD CPU); the peak times that one."""
        from . import gemm

        candidates = gemm.products(torch, left, right)
        library, seconds = gemm.fastest(candidates)
        self.product = candidates[library]
        return {
            "gemm_library": library,
            "gemm_probe_gflops": {name: round(2 * size**3 / s / 1e9, 1) for name, s in seconds.items()},
        }

    def matmul(self) -> None:
        torch_product = self.product()  # CPU ops return when done; a GPU syncs
        self.sync()
        del torch_product

    # train mode (accelbench.execution.training): an image folder through torchvision, core's recipe
    dataset_run = f"{__name__}.dataset:TorchDatasetRun"

    def write_dataset(self, examples: list[tuple[str, int]], stem: str) -> list[str]:
        from . import dataset

        return dataset.write_imagefolder(examples, stem)

    def read_dataset(self, files: list[str]) -> list[tuple[str, int]]:
        from . import dataset

        return dataset.read_imagefolder(files)


@hookimpl
def register_backends(register):
    register(TorchResNet50())
