"""Where a model runs and in which precision: one answer for training, the teacher, evaluation and timing.

`mixed_precision` is "no", "bf16" or "fp16" (config.py resolves "auto" to one of them). Autocast
follows the device the model's weights are on, so the same code runs on a CPU and on a GPU.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def module_device(model) -> torch.device:
    """The device of a model's weights (CPU for anything without torch parameters, e.g. an ONNX session)."""
    if isinstance(model, nn.Module):
        for param in model.parameters():
            return param.device
    return torch.device("cpu")


def available_device() -> torch.device:
    """The accelerator torch finds (a CUDA or ROCm GPU, Apple's MPS, an XPU), else the CPU: where a saved model is
    scored or asked for predictions. Training asks accelerate instead, which also knows the process's rank."""
    return torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")


def autocast(device: torch.device, mixed_precision: str):
    """Autocast on `device`'s type in the configured dtype; disabled (fp32) for "no"."""
    dtype = AUTOCAST_DTYPES.get(mixed_precision)
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def to_device(value, device: torch.device):
    """`value` with every tensor in it on `device`: a tensor, a dict (a batch), a dataclass (`Features`), or
    anything else as it is. Tensors already there are not copied. Asynchronous only toward an accelerator: a
    copy to the CPU made with non_blocking returns before its bytes have landed (the teacher cache then writes
    them to disk at once)."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=device.type != "cpu")
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: to_device(getattr(value, f.name), device)
                                             for f in dataclasses.fields(value) if f.init})
    return value
