"""Command-line options that the project reads before Lightning or argparse parse the rest."""

import argparse


def pop_option(argv: list[str], name: str) -> tuple[list[str], str | None]:
    """``argv`` without ``name VALUE`` / ``name=VALUE``, and that value."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(name)
    found, rest = parser.parse_known_args(argv)
    return rest, getattr(found, name.lstrip("-"))
