"""One line for a command line or config that the parser refused, in place of jsonargparse's usage
text and nested trace: the key, the value given and what the key takes, or the nearest key to a
misspelt one. Loaded only when the parser refuses something."""

from __future__ import annotations

import difflib
import re

PARSER_KEY = re.compile(r'Parser key "([^"]+)":?\s*(.*)')
NAMES = {"NoneType": "null", "str": "text", "int": "an integer", "float": "a number", "bool": "true or false",
         "dot import path string": "an import path (package.module.Class)"}


def user_key(key: str) -> str:
    """``data.augmentation.init_args.hflip`` as a user writes it: ``data.augmentation.hflip``."""
    return ".".join(p for p in key.split(".") if p != "init_args")


def one_line(message: str, keys: list[str], command: str) -> str:
    """The error as one line; ``keys``: those the command takes, for a misspelt one's nearest."""
    hint = f"python -m project {command} --help lists every key"
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()] or ["not understood"]
    unknown = re.match(r"unrecognized arguments: (.*)", lines[0])
    if unknown:
        return unknown_arguments(unknown.group(1).split(), keys, hint)
    in_config = re.search(r"does not accept option '([^']+)'", lines[0])  # a --config file's key
    if in_config:
        return unknown_arguments([f"--{in_config.group(1)}"], keys, hint, " in the config", "")
    found = [(m.group(1), m.group(2), i) for i, line in enumerate(lines) if (m := PARSER_KEY.match(line))]
    if not found:
        return f"{lines[0]}; {hint}"
    key = user_key(".".join(dict.fromkeys(k for k, _, _ in found)))
    detail, deepest = found[-1][1], found[-1][2]
    rest = lines[deepest + 1:]
    text = "\n".join([detail, *rest])
    given = re.search(r"(?:Given|Got) value: (.*?)\.?$", text, re.MULTILINE)
    given = given and given.group(1)
    nested = given and re.fullmatch(r"NestedArg\(key='([^']*)', val='(.*)'\)", given)
    if nested:  # --model.optimizer.class_path=X: the key's last part and its value
        key, given = user_key(f"{key}.{nested.group(1)}"), nested.group(2)
    choices = [c.strip(" '") for group in re.findall(r"Literal\[(.*?)\]", text) for c in group.split(",")]
    types = [NAMES.get(t, t) for t in re.findall(r"Expected a <class '(?:\w+\.)*(\w+)'>", text)]
    described = re.findall(r"Expected an? ([^<:.\n][^:\n]*?)(?::|$)", text, re.MULTILINE)  # in words
    types += [NAMES.get(t, t) for t in described if not t.startswith("typing.")]
    if choices:
        types.append("one of " + ", ".join(dict.fromkeys(choices)))
    expected = list(dict.fromkeys(types))
    if expected and given is not None:
        return f"{key}={given} is not valid: it takes {' or '.join(expected)}; {hint}"
    reason = detail if detail and not detail.startswith("Does not validate") else (
        next((line.lstrip("- ") for line in rest if not line.startswith(("Subtypes", "Errors", "Given"))),
             detail or "not valid"))
    return f"{key}: {reason}; {hint}"


def unknown_arguments(args: list[str], keys: list[str], hint: str, where: str = "",
                      dashes: str = "--") -> str:
    """``--data.labls=x.csv``: no such key, and the nearest one the command takes (``where``: a
    config file's, written there without ``dashes``)."""
    named = [a for a in args if a.startswith("-")]
    if not named:
        return f"unexpected argument{'s' if len(args) > 1 else ''} {' '.join(args)}; {hint}"
    known = sorted({user_key(k) for k in keys if not k.endswith("__subclasses_disabled__")})
    parts = []
    for arg in named:
        key = arg.lstrip("-").split("=", 1)[0]
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        parts.append(f"{dashes}{key}" + (f" (did you mean {dashes}{close[0]}?)" if close else ""))
    return f"no such key{where}: {', '.join(parts)}; {hint}"
