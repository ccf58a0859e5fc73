"""No secret on a command line (docs/security.md, "Command lines").

Every process's argv is readable by any user of the host (`ps`, /proc/PID/cmdline) and lands in shell
history, so nitro takes tokens, passwords and keys only from files and the environment. The flags that
would carry one refuse it here, naming where the secret goes instead and never echoing the value:

- `RefusedSecretFlag`: a flag that used to take a secret's value (`nitro ... --token`);
- `URLWithoutPassword`: a Redis URL flag (`--redis-url`, `--actor-redis-url`) given a URL with a password;
- `looks_secret`: which `NAME=VALUE` settings must not carry a literal value (`nitro deploy-lambda --env`).

A flag's default taken from the environment (e.g. `--redis-url` from NITRO_REDIS_URL) is not checked:
argparse calls an action only for what is on the command line.
"""

from __future__ import annotations

import argparse
import re
from urllib.parse import urlsplit

# Names of settings that hold a secret: NITRO_HMAC_KEY, NITRO_REDIS_PASSWORD, NITRO_TOKEN, AWS_SECRET_ACCESS_KEY,
# REDISCLI_AUTH, ... A name ending in _FILE holds a path (NITRO_TOKEN_FILE), not the secret.
_SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|KEY|CREDENTIAL|AUTH", re.IGNORECASE)


def looks_secret(name: str) -> bool:
    """Whether the setting `name` holds a secret, so its value must not be written on a command line."""
    return bool(_SECRET_NAME.search(name)) and not name.upper().endswith("_FILE")


class RefusedSecretFlag(argparse.Action):
    """A flag that took a secret's value: using it is an error (exit 2) that says where the secret goes.

    add_argument("--token", action=RefusedSecretFlag, instead="--token-file FILE, or $NITRO_TOKEN_FILE ...")"""

    def __init__(self, option_strings, dest, instead: str, what: str = "a secret", **kwargs):
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.instead, self.what = instead, what

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is refused: {self.what} on a command line shows in `ps` and in shell "
                     f"history (the value is not shown here); use {self.instead}")


class URLWithoutPassword(argparse.Action):
    """A URL flag that refuses a URL with a password on the command line (exit 2); `instead` says where the
    password goes."""

    def __init__(self, option_strings, dest, instead: str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.instead = instead

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            password = urlsplit(values).password if values else None
        except ValueError:
            password = None  # not a URL at all: the command's own check says so
        if password:
            parser.error(f"{option_string}: the URL carries a password, and a command line shows in `ps` and in "
                         f"shell history (the URL is not shown here); pass the URL without it and {self.instead}")
        setattr(namespace, self.dest, values)


# What the Redis URL flags of the services say instead (one wording for learner, detector, scaler, minions).
REDIS_PASSWORD_INSTEAD = ("the password as NITRO_REDIS_PASSWORD_FILE (or NITRO_REDIS_PASSWORD, with "
                          "NITRO_REDIS_USERNAME), or the whole URL in the environment as NITRO_REDIS_URL")
