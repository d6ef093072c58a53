"""Typed errors for bad input. Messages are one line and name the culprit."""


class InputError(ValueError):
    """Bad input from a user: a file, a config value, a matrix. One line, names the culprit."""


class NotStochasticError(InputError):
    """A matrix that is not row-stochastic (or not square, or holds NaN/inf)."""


class ExtractionError(RuntimeError):
    """A model that cannot deliver one attention matrix per layer, or an empty capture."""


class EnvironmentFault(RuntimeError):
    """The machine, not the input: a missing device, an unusable path. Exit code 3."""


class StoreDamagedError(RuntimeError):
    """A store whose chunks or metadata no longer match what its markers vouch for. Exit 4."""
