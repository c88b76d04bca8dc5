"""Slips at the seams of the command line and the own-network backbone (fast tier), each a test
that fails when the slip comes back: an unknown or broken command, an own network's head_name or
weights, an optimizer LR nothing reads, a printed setting the fuzz does not know."""

from __future__ import annotations

import pytest

import project.cli
from tests.conftest import cli, one_error

OWN = "tests.own_backbone:tiny_net"


def test_an_unknown_command_is_one_line_with_the_nearest_and_every_command(tmp_path, capsys):
    assert cli(["stat"], tmp_path) == 2
    line = one_error(capsys.readouterr().err)
    assert line.startswith("error: 'stat' is not a command; did you mean test? Commands: fit, validate, "
                           "test, ")
    assert all(name in line for name in project.cli.COMMANDS)
    assert cli(["zzzz", "--config", "x.yaml"], tmp_path) == 2  # nothing near: no guess
    assert one_error(capsys.readouterr().err).startswith("error: 'zzzz' is not a command. Commands: fit, ")


@pytest.mark.parametrize(("entry", "cause"), [
    ("project.no_such_module:main", "ModuleNotFoundError: No module named 'project.no_such_module'"),
    ("broken_command_module:main", "SyntaxError: "),
    ("project.resume:mian", "AttributeError: "),
])
def test_a_command_that_does_not_load_is_one_line_naming_it(entry, cause, tmp_path, capsys, monkeypatch):
    (tmp_path / "broken_command_module.py").write_text("def main(argv):\n    return (\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(project.cli.COMMANDS, "broken", entry)
    assert cli(["broken", "--help"], tmp_path) == 2
    line = one_error(capsys.readouterr().err)
    assert line.startswith(f"error: command 'broken' cannot start: {entry} does not load") and cause in line
