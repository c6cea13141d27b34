"""The error every reader raises for data it cannot use."""


class DataError(ValueError):
    """A data file or row that cannot be used, with where it is and how to fix it."""
