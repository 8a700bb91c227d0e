"""The `sieverag` dispatcher: commands listed without importing them, version, errors."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import sieverag
from sieverag.cli import COMMANDS, GROUPS, main


def test_help_lists_every_command_without_importing_torch():
    probe = ("import sys, contextlib, io\nfrom sieverag.cli import main\n"
             "out = io.StringIO()\n"
             "with contextlib.redirect_stdout(out): code = main(['--help'])\n"
             "print(code, 'torch' in sys.modules, 'pydantic_settings' in sys.modules)\n"
             "print(out.getvalue())")
    shown = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                           text=True).stdout
    assert shown.startswith("0 False False")
    for name in COMMANDS:
        assert f"  {name.split(' ')[0]} " in shown


def test_every_command_names_a_settings_class_and_a_run_function():
    from sieverag.inference.core.settings import parse_settings

    for name, command in COMMANDS.items():
        module, _, settings_name = command.settings.partition(":")
        run_module, _, run_name = command.run.partition(":")
        assert callable(getattr(importlib.import_module(run_module), run_name)), name
        settings_class = getattr(importlib.import_module(module), settings_name)
        with pytest.raises(SystemExit) as done:  # --help of every command renders
            parse_settings(settings_class, ["--help"], f"sieverag {name}")
        assert done.value.code == 0
    assert {name.split(" ")[0] for name in COMMANDS if " " in name} == set(GROUPS)


def test_version_group_help_and_unknown_commands(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"sieverag {sieverag.__version__}"
    assert sieverag.__version__ != "0.0.0+unknown"
    assert main(["index", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "  build " in shown and "  search " in shown
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
    assert main(["index", "nope"]) == 2


def test_flags_the_command_line_cannot_read_are_one_clear_error(capsys, tmp_path):
    assert main(["build-dataset", "--labels", "a", "--out", str(tmp_path), "--mix", "chunk"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sieverag: error: invalid flags for sieverag build-dataset:")
    assert "mix" in err and "Traceback" not in err and err.count("\n") == 1
    # --config is never taken from an abbreviation.
    with pytest.raises(SystemExit):
        main(["eval", "--dataset", "d.jsonl", "--conf", "x.yaml"])
    assert "unrecognized arguments: --conf x.yaml" in capsys.readouterr().err


def test_none_is_a_choice_and_None_is_no_value_on_the_command_line():
    from sieverag.inference.cli.run import EvalCommand
    from sieverag.inference.core.settings import parse_settings

    command = parse_settings(EvalCommand, ["--dataset", "d.jsonl", "--amber.filter", "none",
                                           "--mcf.lexical-weight", "None"], "sieverag eval")
    assert command.amber.filter == "none" and command.mcf.lexical_weight is None
