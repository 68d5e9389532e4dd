"""The configuration reference (docs/config-reference.md), generated from the config models themselves: every key
with its type, the default the code gives it and its field description. The descriptions are the one source; a test
keeps the committed page equal to `render()` (regenerate: `.venv/bin/regen config-reference --output
docs/config-reference.md`).
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from regen.config import RegenConfig

HEADER = """# Configuration reference

Generated from the config models (`include/regen/config/`: `__init__.py`, `defaults.py`, `datasets.py`;
`profiles.py`, `storage/s3.py`) by `.venv/bin/regen config-reference --output docs/config-reference.md`;
`tests/unit/config/test_config_reference.py` keeps this page equal to what the command writes. The defaults are the
code's: a key the file leaves out takes this value (the project's demo `config/regen.yaml` sets some of them
otherwise). The file itself: see [configuration](configuration.md).
"""
TABLE = "| key | type | default | what it is |\n| --- | --- | --- | --- |\n"
SKIPPED = {"base_dir"}  # set by load_config from the file's folder, not written in the file


def render() -> str:
    """The whole page: one table per section of the file."""
    parts = [HEADER]
    for title, prefix, model in sections():
        about = _describe(RegenConfig, title.split(".")[0], RegenConfig.model_fields[title.split(".")[0]])
        parts.append(f"\n## `{title}`\n\n{about[0].upper()}{about[1:]}.\n\n{TABLE}")
        parts.extend(f"| {row} |\n" for row in rows(model, prefix))
    return "".join(parts)


def sections() -> Iterator[tuple[str, str, type[BaseModel]]]:
    for name, info in RegenConfig.model_fields.items():
        if name in SKIPPED:
            continue
        model, key = _nested(info.annotation)
        if model is None:
            raise TypeError(f"RegenConfig.{name}: a section must be a model or a dict of models")
        prefix = f"{name}.<name>" if key else name
        yield prefix, prefix, model


def rows(model: type[BaseModel], prefix: str) -> Iterator[str]:
    """A row per field, nested models flattened into their own rows (`defaults.sampling.top_p`); a tagged union
    (a profile's `tool_calls`) gives each member's fields under its tag."""
    for name, info in model.model_fields.items():
        if name in SKIPPED:
            continue
        key = f"{prefix}.{name}"
        members = [m for m in _members(info.annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
        yield " | ".join((f"`{key}`", _type(info.annotation), _default(info), _describe(model, name, info)))
        for member in members:
            tag = _tag(member)
            yield from rows(member, f"{key}[{tag}]" if tag and len(members) > 1 else key)


def _describe(model: type[BaseModel], name: str, info: FieldInfo) -> str:
    if not info.description:
        raise ValueError(f"{model.__name__}.{name} has no description: give it Field(description=...)")
    return info.description.replace("|", "\\|").replace("\n", " ")


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "(below)"
    return f"`{json.dumps(value, default=str)}`"


def _type(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is Annotated:  # a validated value (an endpoint URL): what its JSON schema says it is, else its type
        uri = any(getattr(m, "json_schema", {}).get("format") == "uri" for m in args[1:])
        return "URL" if uri else _type(args[0])
    if origin in (Union, types.UnionType):
        names = [_type(a) for a in args if a is not type(None) and not isinstance(a, FieldInfo)]
        optional = " or null" if type(None) in args else ""
        return " \\| ".join(names) + optional
    if origin in (list, tuple):
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type(args[1])}" if args else "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _tag(model: type[BaseModel]) -> str:
    field = model.model_fields.get("format")
    if field is None or get_origin(field.annotation) is not Literal:
        return ""
    return "format: " + " or ".join(get_args(field.annotation))


def _members(annotation: Any) -> list[Any]:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType, Annotated):
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def _nested(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The section's model, and whether it is a map of them (datasets, profiles)."""
    if get_origin(annotation) is dict:
        value = get_args(annotation)[1]
        return (value, True) if issubclass(value, BaseModel) else (None, True)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False
