"""What `sweep plan --cluster` prints of a cluster file, its secrets masked: the value of every
environment variable whose name looks like a credential (`storage.location.CREDENTIAL_WORDS`:
AWS_SECRET_ACCESS_KEY, HF_TOKEN, ...) becomes `***`, in the `env:` mappings, the Kubernetes
containers' `env` lists and `NAME=value` in job script lines, and a URL's userinfo is hidden."""

from __future__ import annotations

import re
from typing import Any

from storage.location import CREDENTIAL_WORDS, redact_url

MASK = "***"
_ASSIGNMENT = re.compile(r"\b(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>\"[^\"]*\"|'[^']*'|\S+)")


def secret_looking(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential."""
    return any(word in name.lower() for word in CREDENTIAL_WORDS)


def masked_text(text: str) -> str:
    """`text` with every `NAME=value` of a secret-looking NAME as `NAME=***`, and URLs'
    userinfo hidden (`storage.location.redact_url`)."""
    def hide(match: re.Match) -> str:
        if secret_looking(match["name"]):
            return f"{match['name']}={MASK}"
        return f"{match['name']}={masked_text(match['value'])}"  # --export=ALL,HF_TOKEN=...

    return _ASSIGNMENT.sub(hide, redact_url(text))


def masked(value: Any) -> Any:
    """`value` (JSON data: a cluster file's dump, Kubernetes specs) with secret-looking
    environment variables' values masked: in a mapping under an `env` key, in `{name, value}`
    entries (a container's env list), and in strings (`masked_text`)."""
    if isinstance(value, str):
        return masked_text(value)
    if isinstance(value, list | tuple):
        return [masked(item) for item in value]
    if not isinstance(value, dict):
        return value
    if set(value) >= {"name", "value"} and secret_looking(str(value["name"])):
        return {**masked({k: v for k, v in value.items() if k != "value"}), "value": MASK}
    return {key: _masked_env(item) if key == "env" and isinstance(item, dict) else masked(item)
            for key, item in value.items()}


def _masked_env(env: dict[str, Any]) -> dict[str, Any]:
    return {name: MASK if secret_looking(str(name)) else masked(item)
            for name, item in env.items()}
