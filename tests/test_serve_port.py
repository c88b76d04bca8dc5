"""serve on a port it cannot have: one line before any model loads, not uvicorn's log and exit 3."""

from __future__ import annotations

import socket

import pytest

from tests.conftest import cli


def test_a_taken_port_is_one_line_naming_it(tmp_path, capsys):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other_server:
        other_server.bind(("127.0.0.1", 0))
        other_server.listen()
        port = other_server.getsockname()[1]
        assert cli(["serve", "--port", str(port)], tmp_path) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --port {port} is taken") and "another --port" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("port", ["0", "70000"])
def test_a_port_out_of_range_is_one_line(port, tmp_path, capsys):
    assert cli(["serve", "--port", port], tmp_path) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --port {port} is not a TCP port") and len(err.strip().splitlines()) == 1
