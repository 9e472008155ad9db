"""A user's program run only as far as its argument parsing: ``python -m
sweeper.trial.parse_check train.py ARGS...`` (``sweeper doctor``, engine: script).

A trial runs the user's command with the knobs as flags; a parser that refuses those words (a
required argument the command does not give, a flag the parser does not know, a
TrainingArguments value its ``__post_init__`` rejects) fails every trial before it trains. This
runs the program as ``__main__`` with those words, its parsers' entry points wrapped: the
outermost parse that returns (argparse's ``parse_args``/``parse_known_args``, or
HfArgumentParser's and TrlParser's, which also build the dataclasses and refuse the words they
did not use) ends the program there, exit 0, and so does reaching sweeper's line
(``callback()``, ``step()``: ``sweeper.trial.hook``) first. A parser that refuses exits as the
program would, with its message on stderr. What it reached is written to the file
``PARSE_ENV`` names.
"""

from __future__ import annotations

import argparse
import functools
import os
import runpy
import sys
from pathlib import Path
from typing import Any

# the file a parse check writes what the program reached to (and the hook's sign that it is one)
PARSE_ENV = "SWEEPER_PARSE_CHECK"
_depth = 0  # parser entry points running (one may call another: parse_args → parse_known_args)


def stop(reached: str) -> None:
    """End the program here: it got as far as ``reached`` (its parse, or sweeper's line)."""
    Path(os.environ[PARSE_ENV]).write_text(reached)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # not SystemExit: a program's own `except BaseException` must not go on


def _outermost(method: Any) -> Any:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _depth
        _depth += 1
        try:
            result = method(*args, **kwargs)
        finally:
            _depth -= 1
        if _depth == 0:
            length = _length(result)
            stop("parsed" if length is None else f"parsed length {length}")
        return result

    return wrapper


# the names a program's own parser gives its sequence length (its own flag or SFTConfig's)
_LENGTH_NAMES = ("max_seq_length", "max_length", "max_seq_len")


def _length(parsed: Any) -> int | None:
    """The sequence length the parse gave the program (a Namespace, a dataclass, or a tuple
    of them, as argparse and HfArgumentParser return), or None: what a trial's program runs
    where no flag of sweeper's sets it (a walk's --max_seq_length, default 512)."""
    for item in parsed if isinstance(parsed, tuple) else (parsed,):
        for name in _LENGTH_NAMES:
            value = getattr(item, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _wrap(cls: type, names: tuple[str, ...]) -> None:
    for name in names:
        if name in vars(cls):
            setattr(cls, name, _outermost(vars(cls)[name]))


def main(argv: list[str]) -> None:
    program = Path(argv[0])
    source = program.read_text(errors="replace")
    _wrap(argparse.ArgumentParser, ("parse_args", "parse_known_args", "parse_intermixed_args"))
    if "HfArgumentParser" in source or "TrlParser" in source:
        try:  # the program imports them anyway; wrapped before it does
            from transformers import hf_argparser
        except Exception:  # noqa: BLE001 - the program's own import will say what is wrong
            pass
        else:
            _wrap(
                hf_argparser.HfArgumentParser,
                ("parse_args_into_dataclasses", "parse_dict", "parse_json_file", "parse_yaml_file"),
            )
    if "TrlParser" in source:
        try:
            from trl import TrlParser
        except Exception:  # noqa: BLE001
            pass
        else:
            _wrap(TrlParser, ("parse_args_and_config",))
    sys.argv = [str(program), *argv[1:]]
    # as `python train.py` has it: the program's folder first (not -m's working directory)
    sys.path[0] = str(program.resolve().parent)
    runpy.run_path(str(program), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
