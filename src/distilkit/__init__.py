"""distilkit: compress a BERT-family teacher into a small, fast student, and prove what was kept."""

__version__ = "0.1.0"

# The built-in tasks, student kinds and methods register the names the config schema accepts.
from distilkit import methods as _methods  # noqa: E402,F401
