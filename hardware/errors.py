"""Errors every surface shows to the user. Each names its cause in plain words."""


class RewindError(Exception):
    """Base class: a problem the user can act on (bad input, unsupported op, ...)."""


class ProgramLoadError(RewindError):
    """The user's model file could not be turned into a Program."""


class UnsupportedOpError(RewindError):
    """A driver cannot run one or more ops of the Program."""


class DriverError(RewindError):
    """A driver spec is unknown or its device is not available."""


class NotStoppedError(RewindError):
    """An inspection was asked for while the session is running or not launched."""


class ExpressionError(RewindError):
    """An expression (condition, watch, evaluate) is invalid or refused."""
