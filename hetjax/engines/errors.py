"""The one error of this package."""


class EngineError(RuntimeError):
    """A cluster engine's environment or allocation does not fit the job."""
