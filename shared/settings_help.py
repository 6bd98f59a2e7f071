"""The ``LABELDP_*`` variables a settings class reads, as ``--help`` text.

Generated from the class itself, so ``serve --help`` cannot drift from the code;
docs/operations.md says what each variable does (a test checks it names them all).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic_settings import BaseSettings


def environment_names(settings: type[BaseSettings]) -> list[str]:
    """``LABELDP_*`` names of the class's fields, in declaration order."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    return [(prefix + name).upper() for name in settings.model_fields]


def settings_epilog(settings: type[BaseSettings], unset: Mapping[str, str] = {}) -> str:
    """One line per variable with its default, for an ``argparse`` epilog;
    ``unset`` says, by field name, what a variable without a default means."""
    lines = ["settings (environment variables, default):"]
    fields = settings.model_fields
    for env, (name, field) in zip(environment_names(settings), fields.items(), strict=True):
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        shown = unset.get(name, "unset") if default is None else str(default)
        lines.append(f"  {env:<34} {shown}")
    lines.append("docs/operations.md says what each does.")
    return "\n".join(lines)
