"""distilkit: compress a BERT-family teacher into a small, fast student, and prove what was kept.

    from distilkit import distil
    result = distil("my-experiment.yaml")   # or a dict, with teacher=/train=/dev= objects in memory
"""

from importlib.metadata import version

from distilkit import config

__version__ = version("distilkit")  # pyproject.toml's, the one place it is written
__all__ = ["Distilled", "distil", "__version__"]


def _load_builtins() -> None:
    """The built-in tasks, student kinds and methods register the names the config schema accepts. Loaded when a
    config first asks (they load torch and transformers), not with the package."""
    from distilkit import methods  # noqa: F401


config.register_builtins_loader(_load_builtins)


def __getattr__(name: str):
    """`distil` is the runner's: imported when asked for, so the layers below never load it."""
    if name in ("distil", "Distilled"):
        from distilkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'distilkit' has no attribute {name!r}")
