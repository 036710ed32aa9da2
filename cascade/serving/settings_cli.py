"""Command lines generated from settings classes.

A service declares each setting once, as a field of a pydantic model: its type, default, bounds
(``ge``, ``le``, ...), help text (the field's description) and environment variable
(``env("CASCADE_...")``). ``settings_command`` turns the model into a command line (typer) whose
flags are the fields in kebab case (``--redis-url``; ``--playground/--no-playground`` for a bool); a
field that is itself a settings model (the mesh block every service shares) adds its own fields
as flags. The command validates the values with the model, so a bad value is a usage error that
names its flag.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import annotated_types
import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

Settings = TypeVar("Settings", bound=BaseModel)


def command_line(**options) -> typer.Typer:
    """A command-line app with click's plain help: paragraphs wrapped to the terminal (up to
    100 columns), one compact column of flags, no type tags on flags that take no value."""
    return typer.Typer(add_completion=False, rich_markup_mode=None,
                       context_settings={"max_content_width": 100}, **options)


def env(name: str) -> dict[str, Any]:
    """A field's environment variable (``Field(..., json_schema_extra=env("CASCADE_X"))``; a
    secret there stays out of the process list)."""
    return {"env": name}


def aliases(*flags: str) -> dict[str, Any]:
    """A field's other flag names (``json_schema_extra=aliases("--k")``)."""
    return {"aliases": list(flags)}


def borrowed(settings_type: type[BaseModel], name: str) -> Any:
    """``settings_type``'s field ``name``, to declare in another settings class as it is there
    (default, bounds, help, environment variable): ``dtype: Dtype = borrowed(PodSettings,
    "dtype")``. Typed Any: a field's declaration, not its value."""
    return settings_type.model_fields[name]


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def settings_command(settings_type: type[Settings], run: Callable[[Settings], object],
                     name: str | None = None) -> typer.Typer:
    """A command line taking ``settings_type``'s fields as flags and calling ``run`` with the
    validated settings."""
    app = command_line()
    app.command(name=name)(settings_function(settings_type, run))
    return app


def settings_function(settings_type: type[Settings], run: Callable[[Settings], object]
                      ) -> Callable[..., None]:
    """``run`` as a function typer makes a command of (``app.command()(...)``): one keyword
    parameter per flag."""

    def command(**values: Any) -> None:
        run(build(settings_type, values))

    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [_parameter(n, f) for n, f in flat_fields(settings_type)])
    command.__doc__ = settings_type.__doc__
    return command


def to_flags(values: BaseModel, settings_type: type[BaseModel], names: tuple[str, ...]
             ) -> tuple[str, ...]:
    """The flags of ``settings_type`` that pass ``values``' fields ``names`` on, for those that
    differ from its defaults (how one command line starts another service)."""
    args: list[str] = []
    for name, field in flat_fields(settings_type):
        if name not in names:
            continue
        value, default = getattr(values, name), field.get_default(call_default_factory=True)
        if value == default:
            continue
        if isinstance(value, bool):
            args.append(flag(name) if value else "--no-" + flag(name)[2:])
        else:
            args += [flag(name), str(getattr(value, "value", value))]
    return tuple(args)


def flat_fields(settings_type: type[BaseModel]) -> Iterator[tuple[str, FieldInfo]]:
    """The fields that are flags: a nested settings model's fields in its place."""
    for name, field in settings_type.model_fields.items():
        nested = _settings_model(field.annotation)
        yield from flat_fields(nested) if nested else [(name, field)]


def build(settings_type: type[Settings], values: dict[str, Any]) -> Settings:
    """The settings from the flags' values, or a usage error naming the flag at fault."""
    fields = {}
    for name, field in settings_type.model_fields.items():
        nested = _settings_model(field.annotation)
        fields[name] = build(nested, values) if nested else values[name]
    return validated(settings_type, **fields)


def validated(settings_type: type[Settings], **fields: Any) -> Settings:
    """``settings_type(**fields)``, or a usage error naming the flag at fault."""
    try:
        return settings_type(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = flag(str(error["loc"][0])) if error["loc"] else None
        message = error["msg"].removeprefix("Value error, ")
        if error["type"].startswith("path_"):  # "Path does not point to a directory": which
            message += f": {error['input']}"
        raise typer.BadParameter(message, param_hint=where) from None


def _parameter(name: str, field: FieldInfo) -> inspect.Parameter:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    default = ... if field.is_required() else field.get_default(call_default_factory=True)
    decl = flag(name)
    if _plain(field.annotation) is bool:
        decl += "/--no-" + decl[2:]
    listed, variable = extra.get("aliases"), extra.get("env")
    names = [str(name) for name in listed] if isinstance(listed, list) else []
    option = typer.Option(default, decl, *names, help=field.description,
                          envvar=variable if isinstance(variable, str) else None,
                          show_default=default not in (None, "", ...), **_bounds(field))
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=_option_type(field.annotation))


def _bounds(field: FieldInfo) -> dict[str, Any]:
    """typer's min and max from the field's ge/gt/le/lt (a strict bound on an integer moves by
    one; on a float, the model refuses the bound itself)."""
    step = 1 if _plain(field.annotation) is int else 0
    bounds: dict[str, Any] = {}
    for rule in field.metadata:
        if isinstance(rule, annotated_types.Ge):
            bounds["min"] = rule.ge
        elif isinstance(rule, annotated_types.Gt):
            bounds["min"] = cast(Any, rule.gt) + step
        elif isinstance(rule, annotated_types.Le):
            bounds["max"] = rule.le
        elif isinstance(rule, annotated_types.Lt):
            bounds["max"] = cast(Any, rule.lt) - step
    return bounds


def _plain(annotation: Any) -> Any:
    """``X`` of ``X | None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        return kinds[0] if len(kinds) == 1 else str
    return annotation


def _option_type(annotation: Any) -> Any:
    """The type typer parses a flag's value as: ``X`` of ``X | None`` and of ``Annotated[X,
    ...]``, and ``list[str]`` of a list of literals (typer takes no other list elements); the
    model checks the rest (that a ``DirectoryPath`` is a folder, that each element is one of the
    literals)."""
    kind = _unannotated(_plain(annotation))
    if typing.get_origin(kind) is list:
        element = _unannotated(typing.get_args(kind)[0])
        if typing.get_origin(element) is typing.Literal:
            return list[type(typing.get_args(element)[0])]  # type: ignore[misc]
    return kind


def _unannotated(kind: Any) -> Any:
    return typing.get_args(kind)[0] if typing.get_origin(kind) is typing.Annotated else kind


def _settings_model(annotation: Any) -> type[BaseModel] | None:
    kind = _plain(annotation)
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None
