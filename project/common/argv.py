"""Command-line options that the project reads before Lightning or argparse parse the rest."""

import argparse
from pathlib import Path

from project.errors import ConfigError

# settings that moved, old -> new: an old one fails in one line
RENAMED = {"model.head_hidden": "model.head.hidden", "model.head_dropout": "model.head.dropout",
           "model.multilabel_loss": "model.loss", "model.image_size": "model.input.size",
           **{f"model.{k}": f"model.input.{k}" for k in ("crop_ratio", "interpolation", "mean", "std")}}
GROUPS = {"head": "{kind: mlp, hidden: 512, dropout: 0.1}", "input": "{size: 224, mean: [0.5, 0.5, 0.5]}"}


def pop_option(argv: list[str], name: str) -> tuple[list[str], str | None]:
    """``argv`` without ``name VALUE`` / ``name=VALUE``, and that value."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(name)
    found, rest = parser.parse_known_args(argv)
    return rest, getattr(found, name.lstrip("-"))


def glue_values(argv: list[str], own: set[str]) -> list[str]:
    """``--key VALUE`` as ``--key=VALUE`` for every option but the command's ``own``: a value of a
    run's setting is not taken for the command's positional argument (a checkpoint)."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and out[-1] not in own \
                and not arg.startswith("-"):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def expand_shorthands(argv: list[str]) -> list[str]:
    """``--data.unlabeled=DIR`` as ``--data.unlabeled.images=DIR``: jsonargparse replaces the
    one-word form with the group's defaults when a ``--data.unlabeled.*`` comes with it."""
    out = list(argv)
    for i, arg in enumerate(out):
        name, eq, value = arg.partition("=")
        if name != "--data.unlabeled" or not eq and i + 1 == len(out):
            continue
        value = value if eq else out[i + 1]
        if value.strip().lower() not in ("", "null", "none") and not value.lstrip().startswith("{"):
            out[i: i + (1 if eq else 2)] = [f"--data.unlabeled.images={value}"]
            return expand_shorthands(out)
    return out


def check_renamed(argv: list[str]) -> None:
    """An old key (``RENAMED``) on the command line or in a ``--config`` file: one line naming the
    new; so is a config file's ``unlabeled: DIR`` that a ``--data.unlabeled.*`` given would replace."""
    import yaml

    keys = {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")}
    configs = [b for a, b in zip(argv, argv[1:], strict=False) if a == "--config"]
    configs += [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--data.unlabeled.")}
    for config in configs:
        try:
            text = yaml.safe_load(Path(config).read_text()) if Path(config).is_file() else None
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            where = getattr(err, "problem_mark", None)
            line = f" at line {where.line + 1}" if where is not None else ""
            problem = getattr(err, "problem", None) or type(err).__name__
            raise ConfigError(f"--config {config} is not YAML the parser can read ({problem}{line}): fix "
                              "the file (a missing ] or }, a tab for indentation, a stray colon)") from None
        if isinstance(text, dict):
            keys |= {f"{section}.{k}" for section, v in text.items() if isinstance(v, dict) for k in v}
            short = (text.get("data") or {}).get("unlabeled") if isinstance(text.get("data"), dict) else None
            if isinstance(short, str) and given and "--data.unlabeled.images" not in given:
                raise ConfigError(f"{config}: `unlabeled: {short}` is replaced by the --data.unlabeled.* "
                                  f"given with it: write `unlabeled: {{images: {short}}}` there")
    for old in sorted(keys & set(RENAMED)):
        group = RENAMED[old].split(".")[1]
        example = f" (model.{group} is a group: {GROUPS[group]})" if group in GROUPS else ""
        raise ConfigError(f"{old} is now {RENAMED[old]}: rename it{example}")


def leaves(tree: dict, prefix: str = "") -> dict:
    """A nested config as ``{"model.input.size": 48, ...}``: one entry per setting, to compare."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
