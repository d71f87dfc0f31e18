"""The worker side of torch_ref: PyTorch is imported here only."""

from __future__ import annotations

import os

from accelbench.api import DeviceMemory, Prepared, RunConfig, training_flops
from accelbench.plugins.shared.cpu_features import (
    bf16_emulation_from_onednn,
    c_stdout_captured,
    onednn_unread,
    onednn_verbose_read_back,
)
from accelbench.plugins.shared.model_specs import SMALL_CHANNELS, SMALL_LAYERS

WEIGHT_DECAY = 1e-4  # torchvision's reference recipe
#: eager steps on a side stream before a CUDA graph is captured (PyTorch's whole-network capture
#: recipe): cuDNN's autotuner, lazily made handles and the optimizer's momentum buffers are set up
#: by them, outside the graph; they train the model as any step does, before the warm-up
GRAPH_WARMUP_STEPS = 3
BASE_LEARNING_RATE = 0.1  # per 256 images, scaled linearly with the global batch
MOMENTUM = 0.9


#: the inter-op pool's size once set in this process (PyTorch refuses a second call)
_inter_op_set: list[int] = []


def import_torch(config: RunConfig):
    import torch

    torch.set_num_threads(config.effective_threads)
    # PyTorch takes the inter-op pool's size once per process (a second call raises): the check
    # and the run import torch in the same worker
    if config.inter_op_threads and not _inter_op_set:
        torch.set_num_interop_threads(config.inter_op_threads)
        _inter_op_set.append(config.inter_op_threads)
    return torch


def device_name(torch, device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from accelbench.api import cpu_model

    return cpu_model()


def device_problem(config: RunConfig) -> str | None:
    """Why this config cannot run on this machine's devices, or None."""
    torch = import_torch(config)
    if config.resolved_precision == "fp16" and config.device == "cpu":
        return "fp16 autocast with a gradient scaler needs a GPU; this run is on the CPU (use bf16 or fp32)"
    if config.resolved_device_count > 1:
        return (
            f"{config.resolved_device_count} devices in one process: PyTorch runs one process per device "
            f"(DistributedDataParallel); use --workers {config.resolved_device_count} with one device each"
        )
    if config.device == "gpu" and not torch.cuda.is_available():
        return "no GPU visible to PyTorch (torch.cuda.is_available() is False)"
    return cuda_graph_problem(config)


def cuda_graph_problem(config: RunConfig) -> str | None:
    """Why the whole-step CUDA graph (option ``cuda_graph``) cannot hold this run, or None."""
    if not config.options.get("cuda_graph"):
        return None
    if config.device != "gpu":
        return "cuda_graph: a CUDA graph needs a GPU; this run is on the CPU"
    if config.resolved_precision == "fp16":
        return (
            "cuda_graph: fp16's gradient scaler reads its overflow check on the host every step, "
            "which a CUDA graph cannot hold; use bf16 or fp32"
        )
    if config.workers > 1:
        return "cuda_graph: captured for one process; DistributedDataParallel's all-reduce is not in the graph"
    if config.mode == "train":
        return "cuda_graph: the graph replays one batch and a fixed learning rate; train mode changes both"
    if _compiling(config):
        return "cuda_graph: with torch.compile, ask for its own CUDA graphs (compile_mode=reduce-overhead)"
    return None


def _compiling(config: RunConfig) -> bool:
    return bool(config.options.get("compile")) or "compile_mode" in config.options


def resnet_small(torch, num_classes: int, channels: int = 3):
    """The layers of ``model_specs`` (Gluon's thumbnail ResNetV1 with basic blocks): a 3x3 stem
    convolution without pooling, basic residual blocks, global pooling, linear logits."""
    nn = torch.nn

    def norm(channels):
        return nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)  # Gluon's 0.9 decay is PyTorch's 0.1

    class Block(nn.Module):  # type: ignore[name-defined]  # torch is imported at run time, in the worker
        def __init__(self, in_channels, channels, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
            self.bn1 = norm(channels)
            self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
            self.bn2 = norm(channels)
            self.shortcut = (
                nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride, bias=False), norm(channels))
                if stride != 1 or channels != in_channels
                else nn.Identity()
            )

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))

    layers = [nn.Conv2d(channels, SMALL_CHANNELS[0], 3, 1, 1, bias=False)]
    in_channels = SMALL_CHANNELS[0]
    for stage, (blocks, channels) in enumerate(zip(SMALL_LAYERS, SMALL_CHANNELS[1:])):
        for block in range(blocks):
            layers.append(Block(in_channels, channels, 2 if stage > 0 and block == 0 else 1))
            in_channels = channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_channels, num_classes)]
    return nn.Sequential(*layers)


def build_model(torch, config: RunConfig, channels: int = 3):
    if config.model == "resnet_small":
        return resnet_small(torch, config.num_classes, channels)
    import torchvision

    # torchvision's ResNet-50 is v1.5 (stride 2 in each downsampling block's 3x3) and its
    # convolutions have no bias: the same 25,557,032 parameters as the TF and MXNet plugins'
    model = torchvision.models.resnet50(weights=None, num_classes=config.num_classes)
    if channels != 3:
        model.conv1 = torch.nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
    return model


def forward_macs(torch, model, image_size: int, device, channels: int = 3) -> int:
    """Multiply-adds of one image's forward pass, counted on the model's conv and linear layers
    during one forward pass (hooks read each layer's output shape)."""
    nn, total = torch.nn, [0]

    def count(layer, _inputs, output):
        if isinstance(layer, nn.Conv2d):
            kh, kw = layer.kernel_size
            total[0] += output[0].numel() * kh * kw * layer.in_channels // layer.groups
        elif isinstance(layer, nn.Linear):
            total[0] += layer.in_features * layer.out_features

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, channels, image_size, image_size, device=device))
    model.train(was_training)
    for hook in hooks:
        hook.remove()
    return total[0]


class TorchRun:
    """Model, optimizer, synthetic data and the step, built once in the worker."""

    def __init__(self, config: RunConfig):
        self.config = config
        self.torch = torch = import_torch(config)
        torch.manual_seed(config.seed)  # the same initial weights on every worker
        self.distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
        self.device = self._device()
        if self.distributed:
            torch.distributed.init_process_group(
                "nccl" if config.device == "gpu" else "gloo",
                rank=int(os.environ["RANK"]),
                world_size=int(os.environ["WORLD_SIZE"]),
                init_method=os.environ.get("ACCELBENCH_TORCH_INIT_METHOD", "env://"),
            )
        self.memory_format = {"channels_last": torch.channels_last, "contiguous": torch.contiguous_format}[
            config.options.get("memory_format", "channels_last")
        ]
        model = build_model(torch, config, self.channels).to(self.device, memory_format=self.memory_format)
        self.flops_per_image = training_flops(forward_macs(torch, model, config.image_size, self.device, self.channels))
        self.parameters = sum(p.numel() for p in model.parameters())
        self.model = self.net = model
        if self.distributed:
            self.net = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if config.device == "gpu" else None
            )
        self.compiled = _compiling(config)
        if self.compiled:
            self.net = torch.compile(self.net, mode=config.options.get("compile_mode"))
        self.optimizer = self._optimizer()
        self.autocast_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[config.resolved_precision]
        self.scaler = torch.amp.GradScaler("cuda") if config.resolved_precision == "fp16" else None
        self.images, self.labels = self._synthetic()
        self.graph = self.graph_loss = None
        if config.options.get("cuda_graph"):
            self.graph, self.graph_loss = self._capture()

    @property
    def channels(self) -> int:
        return 3

    def _recipe(self) -> dict:
        """momentum, nesterov, weight decay and the learning rate (train mode: core's recipe)."""
        return {
            "momentum": MOMENTUM,
            "nesterov": bool(self.config.options.get("nesterov", False)),
            "weight_decay": WEIGHT_DECAY,
            "learning_rate": BASE_LEARNING_RATE * self.config.resolved_global_batch / 256,
        }

    def _device(self):
        torch = self.torch
        if self.config.device == "gpu":
            index = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(index)
            # the torchvision reference's train.py turns cuDNN's autotuner on unless asked to be
            # deterministic: each convolution's fastest algorithm, picked at its first call
            torch.backends.cudnn.benchmark = True
            return torch.device("cuda", index)
        return torch.device("cpu")

    def _optimizer(self):
        # weight decay on conv and linear weights only, never on batch-norm parameters or biases
        recipe = self.recipe = self._recipe()
        decayed = [p for p in self.model.parameters() if p.ndim > 1]
        others = [p for p in self.model.parameters() if p.ndim <= 1]
        return self.torch.optim.SGD(
            [{"params": decayed, "weight_decay": recipe["weight_decay"]}, {"params": others, "weight_decay": 0.0}],
            lr=recipe["learning_rate"],
            momentum=recipe["momentum"],
            nesterov=recipe["nesterov"],
            fused=self._fused_sgd() or None,
        )  # None: PyTorch's own choice

    def _fused_sgd(self) -> bool:
        """SGD's fused kernel unless the user said otherwise: kept on the CPU, where it was measured
        (README, levers: the same weights bit for bit, the update in 12 ms instead of 27-29 a
        ResNet-50 step); on a GPU, where it was not, PyTorch's own for-each update."""
        chosen = self.config.options.get("fused_sgd")
        return self.device.type == "cpu" if chosen is None else bool(chosen)

    def _synthetic(self):
        """Images and labels made once on the device (each worker its own), reused every step."""
        torch, cfg = self.torch, self.config
        generator = torch.Generator(device=self.device).manual_seed(cfg.seed + 1 + int(os.environ.get("RANK", "0")))
        shape = (cfg.resolved_per_device_batch, 3, cfg.image_size, cfg.image_size)
        images = torch.randn(shape, generator=generator, device=self.device).contiguous(memory_format=self.memory_format)
        labels = torch.randint(0, cfg.num_classes, (cfg.resolved_per_device_batch,), generator=generator, device=self.device)
        return images, labels

    def _autocast(self):
        return self.torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None)

    def step(self) -> float:
        if self.graph is not None:
            self.graph.replay()
            return self._finished(self.graph_loss)
        return self._step(self.images, self.labels)

    def _step(self, images, labels) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        return self._finished(self._forward_backward_update(images, labels))

    def _forward_backward_update(self, images, labels):
        """One step's work after its gradients were cleared; the loss, on the device."""
        with self._autocast():
            logits = self.net(images)
        smoothing = self.config.train.label_smoothing if self.config.train else 0.0
        loss = self.torch.nn.functional.cross_entropy(logits.float(), labels, label_smoothing=smoothing)  # fp32 loss
        if self.scaler:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        return loss

    def _finished(self, loss) -> float:
        value = loss.item()  # bringing the loss to the host waits for the step
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        return value

    def _capture(self):
        """The whole step as one CUDA graph (PyTorch's whole-network capture): a few eager steps
        on a side stream, then one step captured with the gradients cleared to None, so that
        backward writes them (not adds to them) from the graph's own memory at every replay."""
        torch = self.torch
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP_STEPS):
                self.optimizer.zero_grad(set_to_none=True)
                self._forward_backward_update(self.images, self.labels)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            loss = self._forward_backward_update(self.images, self.labels)
        return graph, loss

    def weights_checksum(self) -> float:
        """Sum of every parameter, float64: equal on every worker of an in-sync run."""
        with self.torch.no_grad():
            return float(sum(p.double().sum().item() for p in self.model.parameters()))

    def close(self) -> None:
        dist = self.torch.distributed
        if not (self.distributed and dist.is_initialized()):
            return
        dist.barrier()  # every rank is done with the store before rank 0 removes it
        rank = dist.get_rank()
        dist.destroy_process_group()
        method = os.environ.get("ACCELBENCH_TORCH_INIT_METHOD", "")
        if rank == 0 and method.startswith("file://"):
            store = method.removeprefix("file://")
            for remove in (os.remove, os.rmdir):
                try:
                    remove(store)
                except OSError:
                    pass
                store = os.path.dirname(store)

    def prepared(self) -> Prepared:
        torch = self.torch
        conv = next(m for m in self.model.modules() if isinstance(m, torch.nn.Conv2d))
        onednn = self._onednn_read_back()
        return Prepared(
            device_name=self._device_name(),
            flops_per_image=self.flops_per_image,
            data_placement="device",
            framework_version=torch.__version__,
            warnings=cpu_bf16_warnings(self.config, onednn),
            settings={
                **onednn,
                "torchvision": _version("torchvision"),
                "parameters": self.parameters,
                "optimizer": "SGD" + (" + GradScaler" if self.scaler else ""),
                "sgd_implementation": _sgd_implementation(self.optimizer),
                "learning_rate": self.optimizer.param_groups[0]["lr"],
                "momentum": self.optimizer.param_groups[0]["momentum"],
                "nesterov": self.optimizer.param_groups[0]["nesterov"],
                "weight_decay": self.optimizer.param_groups[0]["weight_decay"],
                "autocast_dtype": str(self.autocast_dtype).removeprefix("torch.") if self.autocast_dtype else None,
                "variable_dtype": str(conv.weight.dtype).removeprefix("torch."),
                "memory_format": "channels_last"
                if conv.weight.is_contiguous(memory_format=torch.channels_last)
                else "contiguous",
                "compile": self.compiled,
                **(compile_read_back(self.net) if self.compiled else {}),
                "cuda_graph": self._graph_read_back(),
                "ddp": self.distributed,
                "process_group_backend": torch.distributed.get_backend() if self.distributed else None,
                "world_size": torch.distributed.get_world_size() if self.distributed else 1,
                "intra_op_threads": torch.get_num_threads(),
                "inter_op_threads": torch.get_num_interop_threads(),
                "mkldnn": torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled,
                **self._cuda_read_back(),
                "conv_biases": any(m.bias is not None for m in self.model.modules() if isinstance(m, torch.nn.Conv2d)),
            },
        )

    def _device_name(self) -> str:
        return device_name(self.torch, self.device)

    def _graph_read_back(self) -> str | bool:
        if self.graph is None:
            return False
        return (
            f"whole step captured once (forward, backward, SGD update; after {GRAPH_WARMUP_STEPS} eager steps), "
            "replayed every step"
        )

    def device_memory(self) -> DeviceMemory:
        """The caching allocator's largest pool (what the GPU had to hold), beside the largest
        amount tensors took of it."""
        if self.device.type != "cuda":
            return DeviceMemory.on_host()
        cuda = self.torch.cuda
        allocated = cuda.max_memory_allocated(self.device)
        return DeviceMemory(
            int(cuda.max_memory_reserved(self.device)),
            f"torch.cuda.max_memory_reserved (tensors at most {allocated} bytes of it: max_memory_allocated)",
        )

    def _cuda_read_back(self) -> dict:
        """On a GPU, what PyTorch will do with its convolutions and fp32 products, read from it:
        cuDNN's version, its autotuner, and whether fp32 convolutions and matrix products may
        run in TF32 (the record's peak for fp32 on such a GPU is the TF32 one)."""
        torch = self.torch
        if self.device.type != "cuda":
            return {}
        return {
            "cudnn": str(torch.backends.cudnn.version()),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        }

    def _onednn_read_back(self) -> dict[str, str | None]:
        """oneDNN's instruction set and the kernel it picks for a small channels-last convolution at
        this run's precision (autocast, as the step runs it), from the verbose log PyTorch's oneDNN
        writes to this process's stdout while its switch is on. None where PyTorch sent it no
        convolution (a GPU, oneDNN off, or a bf16 convolution PyTorch computes by itself); oneDNN
        prints its instruction set once a process, so this is asked once, before the step runs."""
        torch = self.torch
        if self.device.type != "cpu" or not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
            return onednn_unread()
        # fixed tensors, no module: a layer's random initialisation would move the global RNG
        images, weights = (
            torch.ones(shape).contiguous(memory_format=torch.channels_last) for shape in ((2, 32, 14, 14), (32, 32, 3, 3))
        )
        try:
            with c_stdout_captured() as log, torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                with torch.no_grad(), self._autocast():
                    torch.nn.functional.conv2d(images, weights, padding=1)
        except AssertionError:  # how PyTorch says its oneDNN was built without the verbose switch
            return onednn_unread()
        return onednn_verbose_read_back(log.text)


def compile_read_back(compiled) -> dict:
    """What torch.compile's mode set in the compiler's config, read from the compiled module: its
    CUDA graphs (reduce-overhead) and GEMM/convolution autotuning (max-autotune); None where this
    PyTorch does not say (``get_compiler_config`` came with PyTorch 2.4)."""
    read = getattr(compiled, "get_compiler_config", None)
    config = (read() if read else None) or {}
    return {"compile_cudagraphs": config.get("triton.cudagraphs"), "compile_max_autotune": config.get("max_autotune")}


def cpu_bf16_warnings(config: RunConfig, onednn: dict[str, str | None]) -> list[str]:
    """Why a bf16 run or product on the CPU is emulated, if it is: told from the kernel oneDNN said
    it ran (``onednn``), else from the CPU flags and oneDNN's ceiling."""
    if config.device != "cpu" or config.resolved_precision != "bf16":
        return []
    from accelbench.api import cpu_flags

    warning = bf16_emulation_from_onednn("PyTorch", onednn, cpu_flags())  # its convolutions: oneDNN
    return [warning] if warning else []


def _sgd_implementation(optimizer) -> str:
    """The update PyTorch runs: "fused" (one kernel), "foreach" (multi-tensor calls) or "for-loop"
    (per tensor). Unset, PyTorch decides at the first step by the tensors' device (for-each on
    CUDA, the for-loop on the CPU): that decision is asked of PyTorch itself."""
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return "fused"
    foreach = group.get("foreach")
    if foreach is None:
        try:
            from torch.optim.optimizer import _default_to_fused_or_foreach  # what step() calls

            _, foreach = _default_to_fused_or_foreach(group["params"], differentiable=False, use_fused=False)
        except ImportError:
            return "PyTorch's default (not readable in this version)"
    return "foreach" if foreach else "for-loop"


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""
