"""Distillation methods, one file each, found by name in the registry."""

from distilkit.methods import codir, finetune, kd, lrc, pkd, refbert, sra, text_smoothing, tinybert  # noqa: F401
from distilkit.methods.base import Method, MethodContext, get_method, method_names, register_method
from distilkit.train.progress import Progress

__all__ = ["Method", "MethodContext", "Progress", "get_method", "method_names", "register_method"]
