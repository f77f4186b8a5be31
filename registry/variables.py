"""`${VAR}` expansion as MCP client config files write it: `${VAR}`, `${env:VAR}`, `${VAR:-default}`, plus
named values a caller supplies (e.g. VS Code's `${workspaceFolder}`).

An unset variable, or a reference we cannot resolve (VS Code's `${input:id}` prompts), is a ValueError that
names where it was found, so one bad config entry is reported alone and the others still register.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

_REF = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def expand(text: str, where: str, named: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None,
           keep_env: bool = False) -> str:
    """`text` with every `${...}` reference replaced. `named` values come first (`${workspaceFolder}`), then
    environment variables of `environ` (default `os.environ`). With `keep_env=True` environment references are
    only checked (the variable must be set) and left as written, to be resolved again when the server starts.
    `where` names the value in errors, e.g. "server 'github': headers.Authorization"."""
    named = named or {}
    environ = os.environ if environ is None else environ

    def sub(m: re.Match) -> str:
        ref = m.group(1)
        if ref in named:
            return named[ref]
        name, default = ref.removeprefix("env:"), None
        if ":-" in name:
            name, default = name.split(":-", 1)
        if not _ENV_NAME.match(name):
            raise ValueError(f"{where}: cannot expand ${{{ref}}}: only ${{VAR}}, ${{env:VAR}}, ${{VAR:-default}}"
                             f"{''.join(', ${' + k + '}' for k in named)} are supported; put the value in an "
                             "environment variable and write ${VAR}")
        value = environ.get(name, default)
        if value is None:
            raise ValueError(f"{where}: environment variable {name} is not set (referenced as ${{{ref}}})")
        return m.group(0) if keep_env else value

    return _REF.sub(sub, text)


def expand_values(values: Mapping[str, str], where: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every value of `values` expanded from the environment (see `expand`); `where` prefixes each key."""
    return {k: expand(v, f"{where}.{k}", environ=environ) for k, v in values.items()}
