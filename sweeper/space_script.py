"""A script space's program, checked when the space file is read: the file its command runs
(``python train.py``, ``accelerate launch train.py``, ``torchrun train.py``, ``python -m
pkg.train``) must be there, so a misspelt path is said with its YAML line before the data is
prepared, not by preflight a minute later.

Read from the words alone (no launcher is imported): the program is the first word after the
interpreter's or launcher's own options. Relative paths resolve as the trial runs them: against
``workload.script.cwd``, else the directory sweeper was started in.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from sweeper import yamllines
from sweeper.trial import accelerate_line
from sweeper.trial.launch_line import launcher

# python's own options that take a value (``python -W ignore train.py``)
_PYTHON_VALUED = frozenset({"-W", "-X", "--check-hash-based-pycs"})
# torchrun's options that take no value (torch.distributed.run's parser)
_TORCHRUN_FLAGS = frozenset(
    {"standalone", "no_python", "no-python", "module", "run_path", "run-path", "help"}
)


def _program(words: Sequence[str], start: int, flags: frozenset[str]) -> tuple[int, bool] | None:
    """Where a launcher's program starts (its index) after options from ``start``, and whether
    it is a module (``-m``/``--module``); None when the line names none."""
    index, module = start, False
    while index < len(words):
        word = words[index]
        if word == "--":
            index += 1
            break
        if not word.startswith("-"):
            break
        name = word.lstrip("-").partition("=")[0]
        if name in ("m", "module"):
            module = True
        index += 1 if name in flags or name == "m" or "=" in word else 2
    return (index, module) if index < len(words) else None


def script_of(command: Sequence[str]) -> tuple[int, str, bool] | None:
    """The command's program: its index in ``command``, the word, and whether it is a module
    (None: a form this does not read, e.g. ``python -c ...`` or a program run as it is).

    >>> script_of(["python", "-u", "train.py", "--bf16"])
    (2, 'train.py', False)
    >>> script_of(["accelerate", "launch", "--num_processes", "2", "src/train.py"])
    (4, 'src/train.py', False)
    >>> script_of(["torchrun", "--standalone", "--nproc-per-node=2", "-m", "pkg.train"])
    (4, 'pkg.train', True)
    >>> script_of(["python", "-c", "print(1)"]) is None
    True
    """
    words = list(command)
    name = Path(words[0]).name
    found: tuple[int, bool] | None = None
    said_by = launcher(words)
    if said_by == "accelerate":
        spans, index = accelerate_line._spans(words)
        found = (index, "module" in spans) if index < len(words) else None
    elif said_by == "torchrun":
        start = 3 if name.startswith("python") else 1
        found = _program(words, start, _TORCHRUN_FLAGS)
    elif name.startswith("python"):
        index = 1
        while index < len(words) and words[index].startswith("-"):
            word = words[index]
            if word == "-c":
                return None
            if word == "-m":
                return (index + 1, words[index + 1], True) if index + 1 < len(words) else None
            index += 2 if word in _PYTHON_VALUED else 1
        found = (index, False) if index < len(words) else None
    if found is None:
        return None
    index, module = found
    return index, words[index], module


def _module_here(module: str, cwd: Path, python: str | None) -> bool:
    """Whether ``module`` is a file or package under ``cwd``, or importable by ``python`` (the
    command's interpreter, when it is this one: another environment is not looked into)."""
    import importlib.util

    parts = module.split(".")
    base = cwd.joinpath(*parts)
    if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
        return True
    if (cwd / parts[0]).is_dir() or (cwd / f"{parts[0]}.py").is_file():
        return True  # a package of the directory: its inner modules are its own business
    if python is None or Path(python).resolve() != Path(sys.executable).resolve():
        return True  # not this environment's: preflight asks that python
    try:
        return importlib.util.find_spec(parts[0]) is not None
    except (ImportError, ValueError):
        return False


def program_problem(
    command: Sequence[str], cwd: str | None, source: str, lines: yamllines.Lines
) -> str | None:
    """``source:line: workload.script.command[i]: ...`` when the command's program (its
    interpreter given as a path, its script or module) is not there; None when it is, or when
    the form is not one this reads."""
    if not command:
        return None
    here = Path(cwd).expanduser() if cwd else Path.cwd()
    where = f"workload.script.cwd ({cwd})" if cwd else "the directory sweeper was started in"
    if not here.is_dir():
        line = yamllines.line_for(("workload", "script", "cwd"), lines)
        return (
            f"{source}:{line}: workload.script.cwd: {here.resolve()} is not a directory; give "
            "the directory your command runs in"
        )
    interpreter = command[0]
    first = yamllines.line_for(("workload", "script", "command", 0), lines)
    if "/" in interpreter and not (here / Path(interpreter).expanduser()).is_file():
        return (
            f"{source}:{first}: workload.script.command[0]: {interpreter} does not exist "
            f"(resolved against {here.resolve()}, {where}); give the path of your python "
            "or launcher, or its name on PATH (python, accelerate, torchrun)"
        )
    if "/" not in interpreter and shutil.which(interpreter, path=os.environ.get("PATH")) is None:
        return (
            f"{source}:{first}: workload.script.command[0]: {interpreter} is not a program on "
            f"PATH; give your python's path (this one is {sys.executable}) or install the "
            "launcher in the environment sweeper runs in"
        )
    program = script_of(command)
    if program is None:
        return None
    index, word, module = program
    line = yamllines.line_for(("workload", "script", "command", index), lines)
    field = f"workload.script.command[{index}]"
    if module:
        python = shutil.which(interpreter, path=os.environ.get("PATH"))
        if "/" in interpreter:
            python = str(here / interpreter)
        if not Path(interpreter).name.startswith("python"):
            return None  # a launcher's module: its python is the launcher's (preflight's)
        if _module_here(word, here, python):
            return None
        return (
            f"{source}:{line}: {field}: module {word} is neither under {here.resolve()} "
            f"({where}) nor importable by {python}; fix the module's name, set "
            "workload.script.cwd to the directory that holds it, or install it"
        )
    path = here / Path(word).expanduser()
    if path.is_file():
        return None
    said = "is a directory, not a file" if path.is_dir() else "does not exist"
    if not Path(word).expanduser().is_absolute():
        said += f" (resolved against {here.resolve()}, {where}: {path.resolve()})"
    return (
        f"{source}:{line}: {field}: {word} {said}; fix the script's path, give it from that "
        "directory or as an absolute path, or set workload.script.cwd to the directory it is "
        "relative to"
    )
