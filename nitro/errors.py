"""Error types shared across the library and the services."""

from __future__ import annotations

from collections.abc import Sequence


class NitroError(Exception):
    """Base class for errors raised by the nitro library."""


class ConfigError(NitroError, ValueError):
    """A setting (field, flag, environment variable, file) is missing or invalid; the message names it."""


class UnknownEnvironmentError(NitroError, LookupError):
    """A Gymnasium environment id that is not registered and could not be imported."""

    def __init__(self, env_id: str, suggestions: Sequence[str] = (), hint: str = ""):
        self.env_id = env_id
        self.suggestions = list(suggestions)
        extra = f"; did you mean {', '.join(repr(s) for s in self.suggestions)}?" if self.suggestions else ""
        if hint:
            extra += f"; {hint}"
        super().__init__(f"unknown environment id {env_id!r}{extra}")


class PolicyError(NitroError, ValueError):
    """A trained policy cannot be loaded, or does not fit the environment or observations it is given."""


class LocalSystemError(NitroError, RuntimeError):
    """A component could not be started, or the system is already up."""


class StartupAborted(LocalSystemError):
    """stop was requested while the system was starting."""
