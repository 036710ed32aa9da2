"""The flags reference (docs/flags.md), written from the services' settings classes.

``python -m cascade.cli.flags_doc`` rewrites it; ``tests/test_settings.py`` fails when it
is out of date, so the page cannot drift from the flags.
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from cascade.cli.up import UpSettings
from cascade.serving.settings_cli import flag, flat_fields
from drafter_service.settings import DrafterPodSettings
from gateway.settings import GatewaySettings
from verifier_service.settings import VerifierPodSettings

SERVICES = (("gateway", "python -m gateway", GatewaySettings),
            ("verifier", "python -m verifier_service", VerifierPodSettings),
            ("drafter", "python -m drafter_service", DrafterPodSettings),
            ("the local cluster", "cascade up", UpSettings))
BOUNDS = {annotated_types.Ge: (">=", "ge"), annotated_types.Gt: (">", "gt"),
          annotated_types.Le: ("<=", "le"), annotated_types.Lt: ("<", "lt")}
PAGE = Path(__file__).resolve().parents[2] / "docs" / "flags.md"


def page() -> str:
    lines = ["# Flags", "",
             "Every flag of the three services and of `cascade up`, generated from their settings classes (each "
             "field declares its flag once: type, default, bounds, help, environment variable; "
             "`cascade/serving/settings_cli.py` makes the command lines from them). Rewrite "
             "with `python -m cascade.cli.flags_doc`.", ""]
    for role, command, settings in SERVICES:
        where = f"{settings.__module__}.{settings.__name__}"
        lines += [f"## {role}: `{command}`", "", f"`{where}`: {_one_line(settings.__doc__)}", "",
                  "| flag | default | bounds | environment | meaning |", "|---|---|---|---|---|"]
        lines += [_row(n, f) for n, f in flat_fields(settings)]
        lines.append("")
    return "\n".join(lines)


def _row(name: str, field: FieldInfo) -> str:
    bounds = ", ".join(f"{sign} {getattr(m, attr)}" for m in field.metadata
                       for kind, (sign, attr) in BOUNDS.items() if isinstance(m, kind))
    env = (field.json_schema_extra or {}).get("env", "") if isinstance(
        field.json_schema_extra, dict) else ""
    shown = flag(name) + (f" / --no-{name.replace('_', '-')}" if field.annotation is bool else "")
    return (f"| `{shown}` | {_default(field)} | {bounds} | {f'`{env}`' if env else ''} | "
            f"{(field.description or '').replace('|', '/')} |")


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        return "see meaning"  # computed where the command runs
    value = field.get_default(call_default_factory=True)
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, BaseModel) or value in (None, ""):
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`"


if __name__ == "__main__":
    PAGE.write_text(page())
    sys.stdout.write(f"wrote {PAGE}\n")
