"""The command line's manners: --help with examples everywhere, --version, shell completion."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import unihub
from unihub.cli import build_parser, main
from unihub.version import UNKNOWN, checkout_version, package_version


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name)
                yield from _subcommands(sub, (*path, name))


SUBCOMMANDS = list(_subcommands(build_parser()))


def test_the_subcommands_are_all_found() -> None:
    assert {"inspect", "convert", "verify", "copy", "add-schema", "throughput", "demo", "cache", "completion",
            ("cache", "list"), ("cache", "rm")} <= {c[0] if len(c) == 1 else c for c in SUBCOMMANDS}


@pytest.mark.parametrize("command", [(), *SUBCOMMANDS], ids=lambda c: " ".join(c) or "unihub")
def test_every_help_exits_0_and_shows_examples(command: tuple[str, ...], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "\nexamples:\n  " in out, out
    examples = out.split("\nexamples:\n", 1)[1]
    assert f"unihub {' '.join(command)}".rstrip() in examples, examples  # examples of this very command


def test_version_is_the_package_version(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"unihub {unihub.__version__}\n"
    assert unihub.__version__ == package_version() and unihub.__version__ != UNKNOWN


def test_version_of_a_source_checkout_comes_from_pyproject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    pyproject = Path(unihub.__file__).with_name("pyproject.toml")
    assert package_version() == checkout_version(pyproject) != UNKNOWN
    (tmp_path / "p.toml").write_text('[build-system]\nversion = "9"\n[project]\nname = "unihub"\nversion = "1.2.3"\n'
                                     '[tool.x]\nversion = "7"\n')
    assert checkout_version(tmp_path / "p.toml") == "1.2.3"
    assert checkout_version(tmp_path / "missing.toml") == UNKNOWN


def _complete(line: str, tmp_path: Path, **env: str) -> list[str]:
    """What ``unihub`` answers when the shell asks to complete ``line`` (as argcomplete's bash code asks)."""
    out = tmp_path / "completions"
    environ = {**os.environ, "_ARGCOMPLETE": "1", "_ARGCOMPLETE_IFS": "\n", "COMP_LINE": line,
               "COMP_POINT": str(len(line)), "_ARGCOMPLETE_STDOUT_FILENAME": str(out), **env}
    done = subprocess.run([sys.executable, "-m", "unihub.cli"], env=environ, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return [word.rstrip(" ") for word in out.read_text().split("\n")]  # a single answer ends with a space


def test_completion_offers_subcommands_formats_options_and_format_options(tmp_path: Path) -> None:
    from unihub.formats.base import FORMATS

    assert {"convert", "inspect", "verify", "copy", "cache", "completion"} <= set(_complete("unihub ", tmp_path))
    formats = set(_complete("unihub convert a b --to ", tmp_path))
    assert formats == {"unihub", "parquet", *FORMATS.names()} and {"tfrecord", "webdataset", "hdf5"} <= formats
    assert set(_complete("unihub verify a b --from t", tmp_path)) == {"tfrecord"}
    assert {"--overwrite", "--skip-corrupt", "--workers"} <= set(_complete("unihub convert --", tmp_path))
    assert set(_complete("unihub convert a b --option comp", tmp_path)) == {"compression="}


def test_completion_prints_shell_code(capsys: pytest.CaptureFixture) -> None:
    assert main(["completion", "bash"]) == 0
    code = capsys.readouterr().out
    assert "complete " in code and "unihub" in code and "_ARGCOMPLETE" in code


def test_without_argcomplete_unihub_runs_and_completion_names_the_extra(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "argcomplete", None)  # ``import argcomplete`` now raises ImportError
    assert main(["completion", "zsh"]) == 1
    assert capsys.readouterr().err == ("unihub: error: argcomplete is needed for shell completion but is not "
                                       "installed: pip install 'unihub[cli]'\n")
    monkeypatch.setenv("_ARGCOMPLETE", "1")  # a shell asking, but nothing to answer with: the command runs
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("unihub ")


def test_a_datasets_control_characters_do_not_reach_the_terminal(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np
    import pyarrow as pa

    from unihub.cli.terminal import printable

    hostile = "\x1b]0;owned\x07\x1b[2J\r\x9b"  # retitle the window, clear the screen, hide the line
    schema = unihub.Unischema("Schema" + hostile, [
        unihub.UnischemaField("id" + hostile, np.int64, (), unihub.ScalarCodec(pa.int64()), False)])
    rows = ({"id" + hostile: i} for i in range(3))
    unihub.write_dataset(tmp_path / "ds", schema, rows)
    unihub.write_dataset(tmp_path / "ds", schema, ({"id" + hostile: 3},), mode="append", tag="t" + hostile)
    assert main(["inspect", str(tmp_path / "ds")]) == 0
    assert main(["inspect", str(tmp_path / "ds"), "--versions"]) == 0
    assert main(["show", str(tmp_path / "ds"), "--where", "idx > 1", "--out", str(tmp_path / "r.html")]) == 1
    captured = capsys.readouterr()
    for text in (captured.out, captured.err):
        assert not any(c in text for c in "\x1b\x07\r\x9b")
    assert captured.out.count(printable(hostile)) == 3  # the schema, the field and the tag, as escapes
    assert captured.err.startswith("unihub: error: filter 'idx > 1' names 'idx'") and printable(hostile) in captured.err
    assert printable("a\tb\nc\x1b[0m\x7f") == "a\tb\nc\\x1b[0m\\x7f"


def test_a_name_the_terminals_encoding_lacks_is_printed_as_an_escape(tmp_path: Path) -> None:
    import numpy as np
    import pyarrow as pa

    schema = unihub.Unischema("S", [unihub.UnischemaField("метка", np.int64, (), unihub.ScalarCodec(pa.int64()), False)])
    unihub.write_dataset(tmp_path / "ds", schema, ({"метка": i} for i in range(2)))
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "LC_ALL": "C"}  # a terminal that is not UTF-8
    done = subprocess.run([sys.executable, "-m", "unihub.cli", "inspect", str(tmp_path / "ds")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    assert "\\u043c\\u0435\\u0442\\u043a\\u0430  int64" in done.stdout


@pytest.mark.parametrize("command", [(), *SUBCOMMANDS], ids=lambda c: " ".join(c) or "unihub")
def test_no_help_shows_the_code_docs_markup(command: tuple[str, ...], capsys: pytest.CaptureFixture) -> None:
    """Help is for the command's users: no reST of the docstrings (``unihub --help`` began with the module
    docstring's "The ``unihub`` command line: a thin layer ... (``unihub.cli.main``)")."""
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":class:" not in out and ":func:" not in out, out
