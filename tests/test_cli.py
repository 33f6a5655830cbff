"""The command line a newcomer meets: every flag explained, no markup, mistakes answered."""

from __future__ import annotations

import argparse
import importlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from prorl_async import cli
from prorl_async.config import load_config
from prorl_async.demo import DemoOptions, DemoRun
from prorl_async.demo import _header as demo_header

# What a flag's help must mention besides itself: its default, unless it is required.
_NO_DEFAULT = (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)


def _module_parser(module: str) -> argparse.ArgumentParser:
    mod = importlib.import_module(module)
    build = getattr(mod, "build_parser", None) or mod._parser
    parser: argparse.ArgumentParser = build()
    return parser


def _walk(
    path: str, parser: argparse.ArgumentParser
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if sub.add_help:  # the top level's stand-ins for delegated commands parse nothing
                    yield from _walk(f"{path} {name}", sub)


def _parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield from _walk("prorl-async", cli.build_parser())
    for name, (module, _) in cli.DELEGATED.items():
        yield from _walk(f"prorl-async {name}", _module_parser(module))


PARSERS = dict(_parsers())


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = action.help or ""
    formatter = parser.formatter_class
    if isinstance(formatter, type) and issubclass(
        formatter, argparse.ArgumentDefaultsHelpFormatter
    ):
        text += " (default: %(default)s)"
    return text


def test_every_subcommand_is_covered() -> None:
    names = {path.split()[1] for path in PARSERS if len(path.split()) > 1}
    assert names == {"serve", *cli.DELEGATED}


@pytest.mark.parametrize("path", sorted(PARSERS))
def test_every_flag_has_help_with_its_default_and_explains_its_choices(path: str) -> None:
    parser = PARSERS[path]
    for action in parser._actions:
        if isinstance(action, _NO_DEFAULT):
            continue
        flag = "/".join(action.option_strings) or action.dest
        text = _help(parser, action)
        assert text.strip() and text != argparse.SUPPRESS, f"{path} {flag}: no help"
        required = action.required or any(
            g.required and action in g._group_actions for g in parser._mutually_exclusive_groups
        )
        if action.option_strings and not required:
            assert "default" in text, f"{path} {flag}: help does not give the default: {text!r}"
        for choice in action.choices or ():
            assert str(choice) in text, f"{path} {flag}: help does not explain {choice!r}"


def test_fixed_sets_are_choices() -> None:
    serve = PARSERS["prorl-async serve"]
    choices = {a.dest: a.choices for a in serve._actions if a.choices}
    assert set(choices) >= {"store", "on_restart", "runtime", "log_level"}
    for dest in ("store", "on_restart", "runtime"):
        for value in choices[dest]:  # each one the server accepts
            load_config(overrides={dest: value}, env={})
    policy = next(a for a in PARSERS["prorl-async scripted-llm"]._actions if a.dest == "policy")
    assert set(policy.choices or ()) == {"finish", "echo", "random_tools"}
    mode = next(a for a in PARSERS["prorl-async build-image"]._actions if a.dest == "mode")
    assert set(mode.choices or ()) == {"scratch", "versioned", "lock"}


@pytest.mark.parametrize("path", sorted(PARSERS))
def test_help_prints_without_markup(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main([*path.split()[1:], "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: " + path), out[:200]
    for markup in ("``", ":class:", ":func:", ":meth:", "`_"):
        assert markup not in out, f"{path} --help shows {markup!r}"


def test_serve_rejects_a_value_outside_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["serve", "--store", "postgres"])
    assert done.value.code == 2
    assert "invalid choice: 'postgres' (choose from 'sqlite', 'memory')" in capsys.readouterr().err


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "prorl_async.cli", "serve", "--store", "memory"]
    argv += ["--state-dir", str(tmp_path / "state"), "--runtime", "local", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_serve_on_a_busy_port_exits_2_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        quiet = _serve(tmp_path, "--port", str(port), "--log-level", "warning")
        chatty = _serve(tmp_path, "--port", str(port))
    assert quiet.returncode == 2, quiet.stderr
    (line,) = quiet.stderr.splitlines()
    assert line.startswith(f"prorl-async serve: port {port} on 127.0.0.1 is already in use")
    assert f"--port {port + 1}" in line and "--port 0" in line
    # At the default log level the same line ends the output: start-up logs, no traceback.
    assert chatty.returncode == 2 and "Traceback" not in chatty.stderr
    assert chatty.stderr.splitlines()[-1] == line


def test_serve_on_an_address_not_of_this_machine_exits_2(tmp_path: Path) -> None:
    done = _serve(tmp_path, "--host", "192.0.2.1", "--port", "0", "--log-level", "warning")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert "cannot bind 192.0.2.1:0" in line and "--host" in line


@pytest.mark.parametrize(
    ("asked", "used", "shown"),
    [
        ("auto", "bwrap", "runtime bwrap (auto);"),
        ("auto", "local", "runtime local (auto);"),
        ("local", "local", "runtime local;"),
    ],
)
def test_demo_summary_names_the_runtime_used(asked: str, used: str, shown: str) -> None:
    run = DemoRun(tasks=[], runtime=used)
    assert shown in demo_header(DemoOptions(runtime=asked), run)
