"""A config rebuilt from its JSON form (a run's config.json, a checkpoint's meta, a
metrics directory's config): every field checked against its annotation, so a damaged or
hand-edited file is a ConfigError naming the field, never a run with a wrong type."""

from __future__ import annotations

import dataclasses
import json
import types
import typing

from podrace.config import ConfigError, TrainConfig


def config_from_dict(data: dict, cls: type = TrainConfig, where: str = "config"):
    """Rebuild a config dataclass from `dataclasses.asdict` output (e.g. a run's config.json).

    Missing fields keep their defaults (configs written by older versions); unknown fields
    are a ConfigError, as is anything that is not a mapping where a section belongs.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where} has unknown field(s): {', '.join(unknown)}")
    values = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            value = config_from_dict(value, hint, f"{where}.{name}")
        else:
            if isinstance(value, list):
                value = tuple(value)  # JSON has no tuples; every sequence field is a tuple
            if not fits(value, hint):
                raise ConfigError(
                    f"{where}.{name} must be {type_name(hint)}, "
                    f"got {json.dumps(value, default=repr)[:80]}"
                )
        values[name] = value
    return cls(**values)


def type_name(annotation: object) -> str:
    """A field's annotation as an error message names it: `int`, `tuple[int, ...]`, `one
    of cpu, gpu, tpu, None` (a Literal, optional or not)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    literal = [a for a in args if typing.get_origin(a) is typing.Literal]
    if literal and len(args) == 2 and type(None) in args:
        return f"{type_name(literal[0])}, None"
    return (
        annotation.__name__
        if isinstance(annotation, type)
        else str(annotation).replace("typing.", "")
    )


def fits(value: object, annotation: object) -> bool:
    """Whether `value` fits a config field's annotation (a sequence field holds a tuple;
    a float field takes an int; a bool is no int; NumPy's integers are no int: config.json
    could not hold them)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:  # not `in` alone: an array's == is elementwise
        return isinstance(value, (str, int, float, type(None))) and value in args
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if annotation is type(None):
        return value is None
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return isinstance(value, tuple) and all(fits(v, args[0]) for v in value)
        return isinstance(value, tuple) and len(value) == len(args) and all(map(fits, value, args))
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    return True  # a field type this check does not know: left to validate()
