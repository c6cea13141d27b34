"""Distillation methods, one file each, found by name in the registry."""

from distilkit.methods.base import Method, MethodContext, Progress, get_method, method_names, register_method
from distilkit.methods import finetune, kd, pkd, refbert, text_smoothing, tinybert  # noqa: F401,E402  (register)

__all__ = ["Method", "MethodContext", "Progress", "get_method", "method_names", "register_method"]
