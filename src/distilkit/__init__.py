"""distilkit: compress a BERT-family teacher into a small, fast student, and prove what was kept."""

__version__ = "0.1.0"
