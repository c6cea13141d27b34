"""distilkit: compress a BERT-family teacher into a small, fast student, and prove what was kept.

    from distilkit import distil
    result = distil("configs/kd_sst2.yaml")   # or a dict, with teacher=/train=/dev= objects in memory
"""

from importlib.metadata import version

__version__ = version("distilkit")  # pyproject.toml's, the one place it is written
__all__ = ["Distilled", "distil", "__version__"]


def __getattr__(name: str):
    """`distil` loads torch and transformers: only when asked for, so `import distilkit` stays instant."""
    if name in ("distil", "Distilled"):
        from distilkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'distilkit' has no attribute {name!r}")
