"""Command-line options made from a pydantic model's fields, so that a default, a choice list, a
bound or a help text is written once, on the field. The values stay strings until the model is
built from them, which checks them and names the field it refuses."""

from __future__ import annotations

import argparse
from typing import Literal, TypeVar, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError

from chunkpilot.contract import ConfigError

M = TypeVar("M", bound=BaseModel)


def choices(annotation: object) -> tuple[str, ...] | None:
    """A Literal's values (the field's allowed spellings), also of an optional Literal, else None."""
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    return next(filter(None, (choices(member) for member in get_args(annotation))), None)


def bounds(model: type[BaseModel], name: str) -> str:
    """The field's numeric bounds as help text: `>= 1, <= 1024`, or empty."""
    said = []
    for rule in model.model_fields[name].metadata:
        for kind, attr, sign in ((Ge, "ge", ">="), (Gt, "gt", ">"), (Le, "le", "<="), (Lt, "lt", "<")):
            if isinstance(rule, kind):
                said.append(f"{sign} {getattr(rule, attr)}")
    return ", ".join(said)


Flags = dict[str, str | tuple[str, ...]]  # field -> its option (or the option and its aliases)


def add_fields(parser: argparse.ArgumentParser, model: type[BaseModel], flags: Flags, *, unset: str = "") -> None:
    """One option per field named in `flags`: a bool a switch, a Literal its choices; help is the
    field's description with its bounds and default. With `unset` (what decides a value not given,
    e.g. settings' environment) an option not given is left out, so that the model decides it."""
    for name, flag in flags.items():
        field = model.model_fields[name]
        names = (flag,) if isinstance(flag, str) else flag
        text = field.description or name.replace("_", " ")
        default = argparse.SUPPRESS if unset else field.default
        if field.annotation is bool:
            parser.add_argument(*names, dest=name, action="store_true", default=default, help=text)
            continue
        limits = bounds(model, name)
        value = field.get_default(call_default_factory=True)
        if unset:
            shown = f"; default {unset.format(name=name.upper(), default=value)}"
        else:
            shown = "" if value is None else f"; default {value}"
        parser.add_argument(
            *names,
            dest=name,
            default=default,
            choices=choices(field.annotation),
            help=f"{text}{f' ({limits})' if limits else ''}{shown}",
        )


def values(args: argparse.Namespace, flags: Flags) -> dict:
    """The parsed options of the fields in `flags` (those given, where add_fields left the others
    out), as keyword arguments for their model."""
    return {name: getattr(args, name) for name in flags if hasattr(args, name)}


def build(model: type[M], **given: object) -> M:
    """`model(**given)`, its first refusal a ConfigError naming the field (what the CLI prints)."""
    try:
        return model(**given)
    except ValidationError as exc:
        raise ConfigError.of(exc) from None
