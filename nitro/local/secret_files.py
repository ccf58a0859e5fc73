"""The secrets of a local system's state dir: created once (mode 0600), reused by every later start,
removed only by rotate_secrets while nothing runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from nitro.errors import LocalSystemError

HMAC_KEY_FILE = "hmac.key"


REDIS_PASSWORD_FILE = "redis.password"  # the nitro-service ACL user's


REDIS_SCALER_PASSWORD_FILE = "redis-scaler.password"  # the nitro-scaler ACL user's (it manages the job users)


# The shared nitro-actor user's, before each job had its own: removed at start when an old state dir has it.
RETIRED_ACTOR_PASSWORD_FILE = "redis-actor.password"


TOKEN_FILE = "token"


SECRET_FILES = (HMAC_KEY_FILE, REDIS_PASSWORD_FILE, REDIS_SCALER_PASSWORD_FILE, TOKEN_FILE)


def write_secret(path: Path, value: str) -> None:
    """Mode 0600 from the first byte: never readable by others, even briefly."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")


def load_or_create_secret(path: Path, generate: Callable[[], str]) -> str:
    """The secret kept in `path`, created by `generate` (mode 0600) when there is none yet.

    A file others may read is refused rather than used: it may have leaked."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        value = generate()
        write_secret(path, value)
        return value
    if mode & 0o077:
        raise LocalSystemError(f"{path} is readable by other users (mode {mode:o}): remove it for a new secret "
                               f"(`nitro up --rotate-secrets`), or `chmod 600 {path}` if it never leaked")
    value = path.read_text().strip()
    if not value:
        raise LocalSystemError(f"{path} is empty: remove it (`nitro up --rotate-secrets`) for a new secret")
    return value


