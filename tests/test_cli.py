"""Every `python -m servelab` subcommand answers --help."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from servelab import cli


def _commands(parser: argparse.ArgumentParser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _commands(sub, (*prefix, name))


ALL = list(_commands(cli.build_parser()))


def test_expected_commands_registered():
    names = {c[0] for c in ALL}
    assert {"models", "samples"} <= names
    assert ("models", "build") in ALL


@pytest.mark.parametrize("command", ALL, ids=" ".join)
def test_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*command, "--help"])
    assert e.value.code == 0
    assert "usage: servelab" in capsys.readouterr().out


def test_module_entry_point_and_bad_command():
    ok = subprocess.run([sys.executable, "-m", "servelab", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "models" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "servelab", "no-such-command"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def _leaf_funcs(parser: argparse.ArgumentParser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if "func" in sub._defaults:
                    yield (*prefix, name), sub._defaults["func"]
                yield from _leaf_funcs(sub, (*prefix, name))


def test_one_convention_add_parser_and_cmd_functions():
    """Every module exposes add_parser(sub); every command runs a `_cmd_<name>(args) -> int`."""
    leaves = list(_leaf_funcs(cli.build_parser()))
    assert len(leaves) >= len(cli.COMMAND_MODULES)
    for command, func in leaves:
        assert func.__name__.startswith("_cmd_"), (command, func.__qualname__)
        assert func.__module__.startswith("servelab."), (command, func.__module__)


def test_a_module_runs_alone_like_its_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        cli.run_alone("servelab.course.site", "site", ["--help"])
    assert e.value.code == 0 and "--out" in capsys.readouterr().out
    alone = subprocess.run([sys.executable, "-m", "servelab.measure.tour", "--help"], capture_output=True, text=True)
    assert alone.returncode == 0 and "--scale" in alone.stdout
    bad = subprocess.run([sys.executable, "-m", "servelab.measure.tour", "--scale", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--scale must be within" in bad.stderr
