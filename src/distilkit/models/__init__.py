"""Teacher, students and the Features view of their internals. Every student kind registers on import."""

from distilkit.models import bilstm, refbert, student  # noqa: F401
