"""Preflight's checks of a script space's program (``engine: script``), before any trial:
its python, its file, sweeper's line in it, and what its own python says of its imports
(nothing of the user's code runs). Split from ``sweeper.preflight``."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any


def _script_program(script: Any) -> tuple[Path, str | None]:
    """Where ``workload.script.command`` runs, and its program's path (None: not there)."""
    import shutil

    cwd = Path(script.cwd).expanduser() if script.cwd else Path.cwd()
    program = script.command[0]
    if "/" not in program:
        return cwd, shutil.which(program, path=os.environ.get("PATH"))
    return cwd, str(cwd / program) if (cwd / program).is_file() else None


def program_fingerprint(script: Any) -> str | None:
    """What identifies the user's program as it is now: ``workload.script`` (its command,
    where it runs, how the knobs reach it) and the bytes of each Python file the command
    names. A failure of the program's own (a crash, a knob it ignored) is its config's only
    until the program changes (``sweeper.sweep.queue.enqueue_changed``); None: no script."""
    import hashlib
    import json

    if script is None:
        return None
    cwd, _ = _script_program(script)
    digest = hashlib.sha256(json.dumps(script.model_dump(mode="json"), sort_keys=True).encode())
    for word in script.command[1:]:
        if word.endswith(".py") and not word.startswith("-"):
            try:
                digest.update((cwd / word).read_bytes())
            except OSError:
                digest.update(b"absent")
    return digest.hexdigest()[:16]


def absent_programs(command: list[str], cwd: Path) -> list[str]:
    """The words of ``command`` naming a Python file that is not in ``cwd``, where it runs."""
    return [
        word
        for word in command[1:]
        if word.endswith(".py") and not word.startswith("-") and not (cwd / word).is_file()
    ]


_DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".tsv", ".parquet", ".arrow", ".txt")


# a flag whose value the program writes (--output_file, --save_path, --log_file): not an input
_WRITTEN_FLAG = re.compile(r"^--?[\w-]*(out|save|log|dump|write|report|result)", re.IGNORECASE)


def absent_inputs(script: Any) -> list[str]:
    """Notes on the data files the command names that are not where it runs (a walk's
    `--dataset_path` to a file not there: doctor said the space can run, and every trial
    failed at the program's load): the words after the program ending as a data file does,
    but not the value of a flag the program writes to (``--output_file results.json``)."""
    cwd, _ = _script_program(script)
    words = script.command[1:]
    return [
        f"workload.script.command: {word} is not a file in {cwd} (the command runs there): a "
        "trial whose program reads it fails at its start; fix the path or create the file (if "
        "your program writes it, ignore this)"
        for i, word in enumerate(words)
        if word.lower().endswith(_DATA_SUFFIXES)
        and not word.startswith("-")
        and not (i > 0 and _WRITTEN_FLAG.match(words[i - 1]))
        and not (cwd / Path(word).expanduser()).exists()
    ]


def reads_training_arguments(script: Any) -> bool:
    """Whether the command's Python program reads TrainingArguments (HfArgumentParser, TRL's
    SFTConfig or TrlParser), so that a command silent on its length trains their 3 epochs; a
    program of its own parser's (a walk's `--epochs`, default 1) does not. True where the
    program cannot be read (a module, a launcher's script elsewhere): as before."""
    cwd, _ = _script_program(script)
    program = next((w for w in script.command[1:] if w.endswith(".py")), None)
    if program is None:
        return True
    try:
        source = (cwd / program).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True
    return bool(re.search(r"TrainingArguments|SFTConfig|HfArgumentParser|TrlParser", source))


def script_python(script: Any) -> str | None:
    """The Python that runs ``workload.script.command``: its program when that is a python, or
    the interpreter a launcher's ``#!`` line names (torchrun, accelerate: console scripts of
    the environment they are installed in); None when neither says."""
    import shutil

    _, found = _script_program(script)
    if found is None:
        return None
    if Path(script.command[0]).name.startswith("python"):
        return found
    try:
        with open(found, "rb") as handle:
            first = handle.readline(512).decode(errors="replace")
    except OSError:
        return None
    words = first.removeprefix("#!").split() if first.startswith("#!") else []
    interpreter = words[0] if words else ""
    if Path(interpreter).name == "env" and len(words) > 1:
        interpreter = shutil.which(words[1]) or ""
    return interpreter if Path(interpreter).name.startswith("python") else None


# an import of sweeper, and a call of its hook (sweeper.callback(), sweeper.step(...), or the
# names imported from it): a file with both has the line, wherever it is in the file
_IMPORTS_SWEEPER = re.compile(r"^\s*(import\s+sweeper\b|from\s+sweeper\s+import\b)", re.M)
_CALLS_THE_HOOK = re.compile(r"\b(callback|step)\s*\(")


def names_the_hook(program: Path, limit: int = 50) -> bool:
    """Whether ``program``, or a module of its own that it imports (a .py file or package
    under its folder, followed up to ``limit`` files), imports sweeper and calls its hook.
    Read as text: a file that only says so in a comment passes, as does one Python cannot
    parse, which errs on the side of running the trial (a timeout in it then says the line
    was never reached)."""
    import ast

    root, queue, seen = program.parent, [program], set[Path]()
    while queue and len(seen) < limit:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")[: 1 << 20]
            tree = ast.parse(text)
        except (OSError, SyntaxError, ValueError):
            return True
        if _IMPORTS_SWEEPER.search(text) and _CALLS_THE_HOOK.search(text):
            return True
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for name in names:
                base = root.joinpath(*name.split("."))
                for found in (base.with_suffix(".py"), base / "__init__.py"):
                    if found.is_file():
                        queue.append(found)
    return False


# Run in the script's own python with the program's path: does the file parse, and is each
# module it imports findable there (importlib.util.find_spec of its top-level package: nothing
# is imported, no code of the user's runs)? Prints a JSON object: "syntax" [line, message,
# text] or null; "missing" [[line, module, certain], ...], certain when the import runs
# whenever the program starts (its module body, a class body, a with block, the body of
# ``if __name__ == "__main__":``), not when it sits in a function, a loop or another if. An
# import inside a try, or under ``if TYPE_CHECKING``, is the program's own guarded choice.
_IMPORT_CHECK = r"""
import ast, importlib.util, json, os, sys
path = sys.argv[1]
here = os.path.dirname(os.path.abspath(path))  # python train.py: the script's folder, not -c's ''
if sys.path and sys.path[0] in ("", os.getcwd()):
    sys.path[0] = here
else:
    sys.path.insert(0, here)
found = {"syntax": None, "missing": []}
try:
    with open(path, "rb") as handle:
        tree = ast.parse(handle.read(), path)
except SyntaxError as e:
    found["syntax"] = [e.lineno, e.msg, (e.text or "").strip()]
    tree = None
except (OSError, ValueError):
    tree = None

def main_guard(test):
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__")

def type_checking(test):
    return getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING"

def walk(node, certain):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            continue
        if isinstance(child, ast.Import):
            names = [alias.name for alias in child.names]
        elif isinstance(child, ast.ImportFrom):
            names = [child.module] if child.module and not child.level else []
        else:
            names = None
        if names is not None:
            for name in names:
                top = name.split(".")[0]
                try:
                    spec = importlib.util.find_spec(top)
                except (ImportError, ValueError):
                    spec = None
                if spec is None:
                    found["missing"].append([child.lineno, name, certain])
        elif isinstance(child, ast.If):
            if type_checking(child.test):
                continue
            if main_guard(child.test):
                for part in child.body:
                    walk(ast.Module(body=[part], type_ignores=[]), certain)
                for part in child.orelse:
                    walk(ast.Module(body=[part], type_ignores=[]), False)
            else:
                walk(child, False)
        elif isinstance(child, (ast.ClassDef, ast.With, ast.AsyncWith)):
            walk(child, certain)
        elif isinstance(child, ast.stmt):
            walk(child, False)

if tree is not None:
    walk(tree, True)
print(json.dumps(found))
"""


def script_imports(script: Any) -> tuple[list[str], list[str]]:
    """What the script's own python says of its program before any trial loads a model:
    (problems, notes). A problem: the file does not parse, or an import it runs whenever it
    starts names a module that python cannot find (every trial would crash at its start; the
    1-based line named). A note: such an import inside a function or a condition, which may
    never run. Nothing of the user's code runs; a program run as a module, or one whose
    python is another machine's, is not read."""
    import subprocess

    from sweeper.space_script import script_of

    cwd, _ = _script_program(script)
    python = script_python(script)
    program = script_of(script.command)
    if python is None or program is None or program[2] or not cwd.is_dir():
        return [], []
    word = program[1]
    path = cwd / Path(word).expanduser()
    if not path.is_file():
        return [], []  # said by script_problems
    try:
        check = subprocess.run(
            [python, "-c", _IMPORT_CHECK, str(path)],
            cwd=cwd, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        found = json.loads(check.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return [], []  # the check could not run: the trial will say what happens
    problems, notes = [], []
    if found.get("syntax"):
        line, message, text = found["syntax"]
        problems.append(
            f"workload.script.command: {word}:{line}: {message} ({text}): {python} cannot "
            "start it, so every trial would fail at its first line; fix the script"
        )
    for line, module, certain in found.get("missing") or []:
        top = module.split(".")[0]
        said = f"{word}:{line}: import {module}: {python} finds no module named {top!r}"
        if certain:
            problems.append(
                f"workload.script.command: {said}, and the script imports it whenever it "
                "starts, so every trial would fail there; install it in that environment "
                "(or fix the import)"
            )
        else:
            notes.append(
                f"workload.script.command: {said} (inside a function or a condition: a trial "
                "that reaches it fails)"
            )
    return problems, notes


def script_problems(script: Any) -> list[str]:
    """What stops ``workload.script.command`` before any trial: a program that is not there,
    a Python file that is not where the command runs, a Python that cannot import sweeper
    (the hook in the script needs it; the command's python, or its launcher's)."""
    import subprocess

    cwd, found = _script_program(script)
    if not cwd.is_dir():
        return [f"workload.script.cwd: {cwd} is not a directory"]
    program = script.command[0]
    if found is None:
        return [
            f"workload.script.command: {program!r} is not a program here (not on PATH, not a "
            f"file in {cwd}); name your python (e.g. {sys.executable}) or the launcher"
        ]
    problems = [
        f"workload.script.command: {word} is not a file in {cwd} (the command runs there; set "
        "workload.script.cwd, or give the path from there)"
        for word in absent_programs(script.command, cwd)
    ]
    from sweeper.trial.script import THE_LINE

    problems += [
        f"workload.script.command: {word} never calls sweeper's recorder (no import of sweeper "
        f"and call of callback() or step() in it, or in a module of its own that it imports), "
        f"so every trial would train it to its end unmeasured until trial.timeout_s: {THE_LINE}"
        for word in script.command[1:]
        if word.endswith(".py") and (cwd / word).is_file() and not names_the_hook(cwd / word)
    ]
    python = script_python(script)
    if python is not None:
        # the line (sweeper.trial.hook, with pydantic) and torch: the trials and the
        # preflight probes run in this python
        check = subprocess.run(
            [python, "-c", "import sweeper.trial.hook, torch"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check.returncode != 0:
            said = (check.stderr.strip().splitlines() or ["no output"])[-1]
            named = re.search(r"No module named '([\w.]+)'", said)
            what = named.group(1).split(".")[0] if named else "sweeper"
            problems.append(
                f"workload.script.command: {python} cannot import {what} ({said}), which the "
                f"script's one line and its trials need (sweeper's line, and torch to train): "
                f"install them in that environment, or run the script with the python "
                f"sweeper runs in ({sys.executable})"
            )
    return problems


PARSE_CHECK_S = 120  # the program's imports (torch, transformers, TRL) and its parse


def _own_length(reached: str, config: Any, space: Any, shown: str) -> list[str]:
    """A note when the program's parse gave it a sequence length other than the trial's
    (``parse_check`` writes it): its own default, not passed by the space's knobs form (a
    walk's --max_seq_length 512 where auto chose 320; every trial failed as a mismatch)."""
    found = re.fullmatch(r"parsed length (\d+)", reached.strip())
    if found is None or int(found.group(1)) == config.max_seq_length:
        return []
    own, asked = int(found.group(1)), config.max_seq_length
    listed = "max_seq_length" in space.search.model_fields_set
    return [
        f"your script's parser gives it a sequence length of {own} ({shown} does not set "
        f"it), where the space has {asked}: "
        + (
            "a trial whose program cuts at its own length fails as a mismatch; give the "
            f"length on the command (--max_seq_length {asked}), list {own} in search:, or "
            "read it from sweeper.trial_config()"
            if listed
            else f"the trials run {own} and record it as the script's own; to measure "
            f"{asked}, give it on the command (--max_seq_length {asked})"
        )
    ]


def script_parses(space: Any, cache_dir: Path) -> tuple[list[str], list[str]]:
    """(problems, notes): whether the program's own parser takes the words a trial gives it
    (the space's command with the knobs as flags, of the baseline or the first config of the
    search), run in its python as far as its parse and no further
    (``sweeper.trial.parse_check``): a required argument the command lacks, a flag the parser
    does not know, a value a TrainingArguments refuses would fail every trial before it trains.
    Only a program that parses its arguments (argparse, HfArgumentParser, TrlParser) is run;
    one that gets as far as sweeper's line without a parse stops there."""
    import subprocess
    import tempfile

    from sweeper.errors import TrialError
    from sweeper.trial.failures import classify_output, raised_at
    from sweeper.trial.parse_check import PARSE_ENV
    from sweeper.trial.protocol import ChildRequest
    from sweeper.trial.script import CONFIG_ENV, _unparsed_hint, launch_of

    script = space.workload.script
    config = (
        space.baseline.as_config(space.search)
        if space.baseline is not None
        else next(space.search.grid(), None)
    )
    if config is None:
        return [], []
    request = ChildRequest.for_space("trial", space, cache_dir, config=config)
    try:
        words, env = launch_of(request)
    except TrialError:
        return [], []  # said by the other checks (flag_drops, the launch line's own parser)
    at = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if at is None or not Path(words[0]).name.startswith("python") or "-m" in words[1:at]:
        return [], []  # not `python [-u] train.py ...`: a module, a shell script
    cwd = Path(script.cwd).expanduser() if script.cwd else Path.cwd()
    program = cwd / words[at]
    try:
        source = program.read_text(errors="replace")
    except OSError:
        return [], []  # said by script_problems
    if not re.search(r"ArgumentParser|TrlParser|parse_args", source):
        return [], []
    shown = " ".join(words[at:])
    with tempfile.TemporaryDirectory(prefix="sweeper-parse-") as folder:
        reached = Path(folder) / "reached"
        environ = {
            **os.environ,
            **env,
            CONFIG_ENV: json.dumps(config.model_dump()),
            PARSE_ENV: str(reached),
        }
        command = [words[0], "-m", "sweeper.trial.parse_check", *words[at:]]
        try:
            run = subprocess.run(
                command,
                cwd=cwd,
                env=environ,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=PARSE_CHECK_S,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            return [], [
                f"whether your script's parser takes the words a trial gives it ({shown}) was "
                f"not checked: it did not parse them within {PARSE_CHECK_S} s"
            ]
        if reached.is_file():
            if "trial_config" in source:  # it may set its length from the trial's config
                return [], []
            return [], _own_length(reached.read_text(), config, space, shown)
    if run.returncode == 0:
        return [], [
            f"your script ({shown}) ran to its end without parsing its arguments or reaching "
            "sweeper's line, so whether it takes the trial's flags was not checked"
        ]
    said = _without_frames(run.stderr, ("parse_check.py", "runpy.py"))
    kind, message = classify_output(said)
    raised = raised_at(said, str(cwd.resolve()))
    where = f" (raised at {raised})" if raised else ""
    hint = _unparsed_hint(message, script.knobs, script.command)
    if not hint and "unrecognized arguments" in message and script.knobs != "env":
        hint = (
            f"; with workload.script.knobs: {script.knobs} each trial appends the knobs as "
            "flags in TrainingArguments' names (--per_device_train_batch_size 4 ...), and your "
            "parser does not take these: add them to it, parse TrainingArguments with "
            "HfArgumentParser, or set workload.script.knobs: env and take each knob from "
            "sweeper.trial_config()"
        )
    if not hint and "arguments are required" in message:
        hint = "; add them to workload.script.command"
    # what went wrong first, the words last: a terminal cuts a long line at its width
    return [
        f"workload.script.command: your script stops before it trains (exit {run.returncode}), "
        f"as every trial would: {message}{where}{hint} (the words a trial gives it: {shown})"
    ], []


def _without_frames(traceback: str, files: tuple[str, ...]) -> str:
    """``traceback`` without the frames of ``files`` (the parse check's own, which would be
    named as where the program raised) and the source lines Python showed under them.

    >>> print(_without_frames(
    ...     '  File "/w/train.py", line 4, in main\\n    parse()\\n'
    ...     '  File "/s/parse_check.py", line 45, in wrapper\\n    result = method()\\n'
    ...     "ValueError: no", ("parse_check.py",)))
      File "/w/train.py", line 4, in main
        parse()
    ValueError: no
    """
    kept, skipping = [], False
    for line in traceback.splitlines():
        if line.startswith('  File "'):
            skipping = any(f'{os.sep}{name}"' in line for name in files)
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept)
