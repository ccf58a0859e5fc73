"""Exceptions shared across nitro packages."""

from __future__ import annotations

from collections.abc import Sequence


class ConfigError(ValueError):
    """A required setting (environment variable, file, flag) is missing or invalid."""


class UnknownEnvironmentError(LookupError):
    """An environment id that neither Gymnasium nor ALE knows."""

    def __init__(self, env_id: str, suggestions: Sequence[str] = ()):
        self.env_id = env_id
        self.suggestions = list(suggestions)
        hint = f"; did you mean {', '.join(self.suggestions)}?" if self.suggestions else ""
        super().__init__(f"unknown environment id {env_id!r}{hint}")
