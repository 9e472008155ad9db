"""``sweeper`` command line: one function per command; the docstring is the help.

Heavy modules (optuna, sqlalchemy, fastapi; torch only ever in the trial child) are imported
inside the commands, so ``sweeper --help`` is instant and ``import sweeper.cli`` stays light.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sweeper.errors import SpaceError, SweeperError, Terminated

if TYPE_CHECKING:
    from sweeper.doctor import DoctorReport
    from sweeper.recommend import Comparison, Constraints, Recommendation
    from sweeper.space import TrialConfig
    from sweeper.store import Store, TrialRow
    from sweeper.trial.protocol import PreparedData

# -h as well as --help, on every command
_CONTEXT = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    help="Find the cheapest way to run a training job: timed trials, priced per run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=_CONTEXT,
)


def _flags_take_no_value() -> None:
    """typer 0.29's help labels every flag ``<bool>``, which reads as ``--json true``: a flag
    gets no label (options that take a value keep theirs)."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()


def _version(value: bool) -> None:
    if value:
        from sweeper import __version__

        typer.echo(f"sweeper {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """Find the cheapest way to run a training job: timed trials, priced per run."""


def _make_console(stderr: bool = False) -> Console:
    """A terminal's console; piped to a file or CI (no terminal, no COLUMNS), lines are not
    wrapped at rich's default 80 columns mid-sentence and tables get room for the config."""
    made = Console(stderr=stderr)
    if made.is_terminal or os.environ.get("COLUMNS"):
        return made
    return Console(stderr=stderr, width=160, soft_wrap=True)


console = _make_console()
err_console = _make_console(stderr=True)

StorageOption = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help="SQLAlchemy URL: sqlite:///file.db or postgresql+psycopg://user@host/db, or a path "
        "to an SQLite file (default: $SWEEPER_STORAGE, then the space's storage, then "
        "sqlite:///sweeper.db in the current directory)",
    ),
]


def _count(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless there is one: "1 trial", "9 trials"."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _absent_sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL when it does not exist (opening it would create it); None for
    an existing file, an in-memory database, another backend or a URL Store will refuse."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    return None if Path(path).is_file() else Path(path)


def _reading_store(storage: str | None) -> Store:
    """The storage a reading command (best, export, study export) reads: an SQLite file that
    does not exist is an error that says where it looked, never a new empty database."""
    from sweeper.settings import resolve_storage
    from sweeper.store import Store

    url = resolve_storage(storage)
    absent = _absent_sqlite_file(url)
    if absent is not None:
        where = "--storage" if storage else "the default storage"
        raise _fail(
            f"no database at {absent.resolve()} ({where}, {url}): `sweeper launch` "
            "writes its database where it runs (sqlite:///sweeper.db in that directory); "
            "run this there, or pass --storage with that file's path",
            code=2,
        )
    try:
        return Store(url)
    except SweeperError as e:
        raise _fail(str(e), code=2) from None


def _with_storage(error: SweeperError, store: Store) -> str:
    """The error, naming the storage when a study was not found in it."""
    from sweeper.errors import StudyNotFoundError

    if isinstance(error, StudyNotFoundError):
        return str(error).replace("in this storage", f"in {store.redacted_url}", 1)
    return str(error)


@app.command()
def launch(
    space: Annotated[Path, typer.Option("--space", help="a space file, e.g. spaces/h100.yaml")],
    storage: StorageOption = None,
    n_trials: Annotated[
        int | None,
        typer.Option(
            "--n-trials",
            min=1,
            help="trials this launch runs (default: the space's budget.n_trials); launching a "
            "study again resumes it and adds this many more",
        ),
    ] = None,
    max_minutes: Annotated[
        float | None,
        typer.Option(
            "--max-minutes",
            min=0.1,
            help="time budget: start no trial the minutes left cannot hold (overrides the "
            "space's budget.max_minutes)",
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            help="sweep with this many worker processes on one study (one per visible GPU, "
            "or N on a CPU); the trials are shared out among them",
        ),
    ] = 1,
    fill: Annotated[
        bool,
        typer.Option(
            "--fill",
            help="run only the trials the study still lacks of its budget (budget.n_trials or "
            "--n-trials, less the trials it has): launching a finished study again runs none",
        ),
    ] = False,
) -> None:
    """Run a sweep: each trial trains the workload with one config in a child process."""
    from sweeper.space import load_space

    try:
        parsed = load_space(space)
    except SpaceError as e:
        raise _fail(f"invalid space file\n{e}", code=2) from None
    from sweeper.settings import resolve_storage

    url = resolve_storage(storage, parsed.storage)
    if fill:
        n_trials = _missing_trials(url, parsed.study, n_trials or parsed.budget.n_trials)
        if n_trials == 0:
            _print_leaderboard(url, parsed.study)
            return
    if workers > 1:
        _launch_workers(
            ["launch", "--space", str(space)],
            parsed.study,
            url,
            _visible_gpus(),
            workers,
            n_trials or parsed.budget.n_trials,
            max_minutes,
        )
        _print_leaderboard(url, parsed.study)
        return
    _sweep_and_report(
        parsed, url, space.read_text(encoding="utf-8"), str(space), n_trials, max_minutes
    )


@app.command(
    short_help="Join a study that `sweeper launch` created (here or on another machine, through "
    "the same Postgres URL) and run trials of it."
)
def worker(
    study: Annotated[str, typer.Option("--study", help="the study to join")],
    storage: StorageOption = None,
    n_trials: Annotated[
        int | None, typer.Option("--n-trials", min=1, help="trials this worker runs")
    ] = None,
    max_minutes: Annotated[
        float | None, typer.Option("--max-minutes", min=0.1, help="this worker's time budget")
    ] = None,
    devices: Annotated[
        str | None,
        typer.Option(
            "--devices",
            help="GPUs to work on, e.g. 0,1: one worker process per GPU, each seeing only its "
            "own (CUDA_VISIBLE_DEVICES); the trials are shared out among them",
        ),
    ] = None,
) -> None:
    """Join a study that `sweeper launch` created (on this machine or another one, through
    the same Postgres URL): run trials of its space until its budget is spent. Workers never
    run a config another worker runs or ran."""
    from sweeper.errors import StudyNotFoundError
    from sweeper.settings import resolve_storage
    from sweeper.space import parse_space
    from sweeper.store import Store

    gpus = _parse_devices(devices) if devices is not None else []
    url = resolve_storage(storage)
    store = Store(url)
    try:
        row = store.get_study(study)
    except StudyNotFoundError as e:
        raise _fail(f"{e}; create it first with `sweeper launch --space FILE`", code=2) from None
    except SweeperError as e:
        raise _fail(str(e)) from None
    finally:
        store.dispose()
    try:
        parsed = parse_space(row.space_yaml, source=row.space_path or f"study {study}")
    except SpaceError as e:
        raise _fail(f"the study's stored space no longer loads\n{e}", code=2) from None
    if len(gpus) > 1:
        command = ["worker", "--study", study]
        total = n_trials or parsed.budget.n_trials
        _launch_workers(command, study, url, gpus, len(gpus), total, max_minutes)
        _print_leaderboard(url, study)
        return
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[0]
    _sweep_and_report(parsed, url, row.space_yaml, row.space_path, n_trials, max_minutes)


def _launch_workers(
    command: list[str],
    name: str,
    url: str,
    devices: list[str],
    count: int,
    n_trials: int,
    max_minutes: float | None,
) -> None:
    """``count`` worker processes running ``sweeper COMMAND`` on one study, each with its
    share of the trials and, when ``devices`` are given, its own GPU; their output goes to log
    files. SIGINT and SIGTERM are passed on to every worker (each marks its running trial)."""
    import subprocess
    import sys

    from sweeper.settings import Settings

    if devices and count > len(devices):
        raise _fail(f"--workers {count}: only {len(devices)} GPU(s) are visible ({devices})", 2)
    logs = Settings().cache_dir / "workers"
    logs.mkdir(parents=True, exist_ok=True)
    share = -(-n_trials // count)
    processes = []
    for index in range(count):
        env = dict(os.environ)
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = devices[index]
        log = logs / f"{name}-{index}.log"
        argv = [sys.executable, "-m", "sweeper.cli", *command]
        argv += ["--storage", url, "--n-trials", str(share)]
        if max_minutes is not None:
            argv += ["--max-minutes", str(max_minutes)]
        with log.open("w") as out:
            processes.append(
                (log, subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT))
            )
        console.print(
            f"worker {index}"
            + (f" on GPU {devices[index]}" if devices else "")
            + f": {share} trials, log {log}",
            highlight=False,
        )
    failed = []
    try:
        for log, process in processes:
            if process.wait() != 0:
                failed.append((log, process.returncode))
    except KeyboardInterrupt as stop:
        terminated = isinstance(stop, Terminated)
        # pass it on once; a second signal must not cut the wait for the workers short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for _, process in processes:
            process.send_signal(signal.SIGTERM if terminated else signal.SIGINT)
        for _, process in processes:
            process.wait()
        said = "terminated (SIGTERM)" if terminated else "interrupted"
        code = 143 if terminated else 130
        raise _fail(f"{said}; each worker marked its running trial", code) from None
    if failed:
        raise _fail(
            "; ".join(f"a worker exited {code} (see {log})" for log, code in failed), code=1
        )


def _missing_trials(url: str, study: str, planned: int) -> int:
    """``launch --fill``: how many of ``planned`` trials the study still lacks, said aloud. An
    SQLite file that does not exist holds no trial (and is not created here)."""
    from sweeper.store import Store, redact
    from sweeper.study import trials_done

    done = 0
    if _absent_sqlite_file(url) is None:
        try:
            store = Store(url)
        except SweeperError as e:
            raise _fail(str(e), code=2) from None
        try:
            store.migrate()
            done = trials_done(store, study)
        except SweeperError as e:
            raise _fail(str(e)) from None
        finally:
            store.dispose()
    if done >= planned:
        console.print(
            f"study {study} in {redact(url)} already has {done} of its {planned} trials: nothing "
            f"to run (--fill); its results follow, and `sweeper best --study {study}` prints the "
            "recommendation",
            highlight=False,
        )
        return 0
    if done:
        console.print(
            f"study {study} has {done} of its {planned} trials: running the {planned - done} "
            "missing (--fill)",
            highlight=False,
        )
    return planned - done


def _parse_devices(text: str) -> list[str]:
    """``--devices 0,1`` (GPU indexes or UUIDs, as CUDA_VISIBLE_DEVICES takes them)."""
    devices = [d.strip() for d in text.split(",")]
    if not all(devices) or len(set(devices)) != len(devices):
        raise _fail(
            f"--devices {text!r}: give distinct GPUs separated by commas, e.g. --devices 0,1",
            code=2,
        )
    return devices


def _visible_gpus() -> list[str]:
    """The GPUs a worker may take: CUDA_VISIBLE_DEVICES if set, else what nvidia-smi lists."""
    import shutil
    import subprocess

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def _sweep_and_report(
    parsed: Any,
    url: str,
    space_text: str,
    space_path: str | None,
    n_trials: int | None,
    max_minutes: float | None,
) -> None:
    """Run this process's share of the sweep (as one worker of the study) and print what it
    found."""
    from sweeper.preflight import PreflightError
    from sweeper.settings import Settings
    from sweeper.store import redact
    from sweeper.study import run_sweep

    observer = RichObserver(parsed.study, n_trials or parsed.budget.n_trials)
    console.print(
        f"sweep [bold]{parsed.study}[/] on {parsed.hardware.name} "
        f"(${parsed.hardware.usd_per_hour:.2f}/h) → {redact(url)}",
        highlight=False,
    )
    try:
        with observer:
            report = run_sweep(
                parsed,
                storage_url=url,
                cache_dir=Settings().cache_dir,
                space_text=space_text,
                space_path=space_path,
                n_trials=n_trials,
                max_minutes=max_minutes,
                observer=observer,
            )
    except Terminated:
        raise _fail(
            "terminated (SIGTERM); finished trials are kept, the running one is marked interrupted",
            143,
        ) from None
    except KeyboardInterrupt:
        raise _fail(
            "interrupted; finished trials are kept, the running one is marked", 130
        ) from None
    except PreflightError as e:
        raise _fail(f"preflight: {e}", code=2) from None
    except SweeperError as e:
        raise _fail(str(e)) from None
    _print_leaderboard(url, parsed.study)
    console.print(
        f"{_count(report.trials_run, 'trial')} ({report.completed} complete, "
        f"{report.failed} failed) in {report.wall_s:.0f} s"
        + (
            f"; {report.predicted_oom} not run (as heavy as a config that ran out of memory)"
            if report.predicted_oom
            else ""
        )
        + (
            f"; {report.remeasured} re-measure{'s' if report.remeasured != 1 else ''} of "
            "measured configs (shared machine, drift, the best configs' noise)"
            if report.remeasured
            else ""
        )
        + (f"; stopped: {report.stop_reason}" if report.stop_reason else ""),
        highlight=False,
    )
    if report.best is not None:
        _print_recommendation(report.best)
    elif report.no_best_reason:
        console.print(
            f"\n[yellow]no recommendation:[/] {escape(report.no_best_reason)}", highlight=False
        )


def _address_taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be served (taken, or not an address here), with a free port
    to use instead; None if it is free. Checked before anything slow runs."""
    import socket

    def bind(p: int) -> OSError | None:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                s.bind((host, p))
            except OSError as e:
                return e
        return None

    error = bind(port)
    if error is None:
        return None
    free = next((p for p in range(port + 1, min(port + 100, 65536)) if bind(p) is None), None)
    hint = f"; use --port {free}, which is free" if free is not None else ""
    return f"cannot serve on {host}:{port}: {error.strerror or error}{hint}"


@app.command()
def serve(
    storage: StorageOption = None,
    host: Annotated[str | None, typer.Option(help="bind address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="port (default 8000)")] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="only check that the address is free (exit 3 if not) and exit"
        ),
    ] = False,
) -> None:
    """Serve the REST API and the dashboard."""
    import uvicorn
    from pydantic import ValidationError

    from api.app import create_app
    from sweeper.settings import Settings, resolve_storage
    from sweeper.store import redact

    try:
        settings = Settings()
    except ValidationError as e:
        raise _fail(f"invalid SWEEPER_* environment: {e}", 2) from None
    taken = _address_taken(host or settings.host, port or settings.port)
    if taken is not None:
        raise _fail(taken, code=3)
    if check:
        return
    url = resolve_storage(storage)
    token = None if settings.api_token is None else settings.api_token.get_secret_value()
    try:
        application = create_app(url, api_token=token, cors_origins=settings.cors_origins)
    except SweeperError as e:
        raise _fail(str(e)) from None
    bind_host, bind_port = host or settings.host, port or settings.port
    console.print(
        f"dashboard on http://{bind_host}:{bind_port}/  (storage {redact(url)})", highlight=False
    )
    console.print(
        "writes (enqueue, stop, delete) need the bearer token in SWEEPER_API_TOKEN"
        if token
        else "read-only: set SWEEPER_API_TOKEN to enable enqueue, stop and delete",
        highlight=False,
    )
    uvicorn.run(application, host=bind_host, port=bind_port, log_level="warning")


UsdPerHourOption = Annotated[
    float | None, typer.Option("--usd-per-hour", min=0.0, help="re-price at this $/h")
]
MaxHoursOption = Annotated[
    float | None,
    typer.Option("--max-hours", min=0.0, help="the run must finish within this many hours"),
]
MaxCostOption = Annotated[
    float | None, typer.Option("--max-cost", min=0.0, help="the run must cost at most ($)")
]
MinHeadroomOption = Annotated[
    float | None,
    typer.Option(
        "--min-headroom",
        min=0.0,
        max=0.99,
        help="share of device memory that must stay free at peak, e.g. 0.1",
    ),
]
AllowTruncationOption = Annotated[
    bool,
    typer.Option(
        "--allow-truncation", help="consider configs whose max_seq_length truncates the data"
    ),
]


def _constraints(
    max_hours: float | None,
    max_cost: float | None,
    min_headroom: float | None,
    allow_truncation: bool,
    usd_per_hour: float | None = None,
) -> Constraints:
    """The options `best` and `export` share, as the recommendation's constraints."""
    from sweeper.recommend import Constraints

    return Constraints(
        usd_per_hour=usd_per_hour,
        max_hours=max_hours,
        max_cost_usd=max_cost,
        min_memory_headroom=min_headroom,
        allow_truncation=allow_truncation,
    )


@app.command("best")
def best_command(
    study: Annotated[str, typer.Option("--study", help="study name")],
    storage: StorageOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    usd_per_hour: UsdPerHourOption = None,
    max_hours: MaxHoursOption = None,
    max_cost: MaxCostOption = None,
    min_headroom: MinHeadroomOption = None,
    allow_truncation: AllowTruncationOption = False,
    across_hardware: Annotated[
        bool,
        typer.Option(
            "--across-hardware",
            help="compare every study of the same workload (other machines at their own "
            "prices): the cheapest option and the Pareto front of $ vs hours",
        ),
    ] = False,
) -> None:
    """Print the recommended (cheapest per run) config of a study, within the constraints."""
    from sweeper.recommend import best, compare

    if across_hardware and usd_per_hour is not None:
        raise _fail("--usd-per-hour re-prices one study; drop it with --across-hardware", 2)
    constraints = _constraints(max_hours, max_cost, min_headroom, allow_truncation, usd_per_hour)
    store = _reading_store(storage)
    try:
        store.migrate()
        result = (
            compare(store, study, constraints)
            if across_hardware
            else best(store, study, constraints)
        )
    except SweeperError as e:
        raise _fail(_with_storage(e, store)) from None
    finally:
        store.dispose()
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    elif across_hardware:
        _print_comparison(result)  # type: ignore[arg-type]
    else:
        _print_recommendation(result)  # type: ignore[arg-type]


@app.command()
def export(
    study: Annotated[str, typer.Option("--study", help="study name")],
    fmt: Annotated[
        str, typer.Option("--format", help="trainer | sft | dataloader | yaml | json")
    ] = "trainer",
    storage: StorageOption = None,
    max_hours: MaxHoursOption = None,
    max_cost: MaxCostOption = None,
    min_headroom: MinHeadroomOption = None,
    allow_truncation: AllowTruncationOption = False,
) -> None:
    """Print the recommended config as a TrainingArguments, TRL SFTConfig or DataLoader snippet,
    YAML or JSON."""
    from sweeper.export import FORMATS, render
    from sweeper.recommend import best

    if fmt not in FORMATS:
        raise _fail(f"--format {fmt!r} is not one of {', '.join(FORMATS)}", code=2)
    constraints = _constraints(max_hours, max_cost, min_headroom, allow_truncation)
    store = _reading_store(storage)
    try:
        store.migrate()
        recommendation = best(store, study, constraints)
        space_yaml = store.get_study(study).space_yaml
    except SweeperError as e:
        raise _fail(_with_storage(e, store)) from None
    finally:
        store.dispose()
    sys.stdout.write(render(recommendation, fmt, space_yaml))  # type: ignore[arg-type]


@app.command(
    short_help="Say what this machine can do before a sweep (devices, precisions, attention, "
    "compile, memory, cores, disk); with --space, exit 1 naming each fix."
)
def doctor(
    space: Annotated[
        Path | None,
        typer.Option("--space", help="also check that this space can run here (exit 1 if not)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    write_mb: Annotated[
        int, typer.Option("--write-mb", min=1, help="MiB written to time the checkpoint disk")
    ] = 256,
) -> None:
    """Say what this machine can do before a sweep: devices, driver, CUDA, torch and
    transformers, bf16/fp16/tf32, which attention implementations train, torch.compile, free
    memory, CPU cores for DataLoader workers, checkpoint write speed. With --space, exit 1 and
    name the fix for each thing the space asks for that this machine cannot do."""
    from sweeper.doctor import DoctorError, diagnose
    from sweeper.settings import Settings
    from sweeper.space import load_space

    parsed = None
    if space is not None:
        try:
            parsed = load_space(space)
        except SpaceError as e:
            raise _fail(f"invalid space file\n{e}", code=2) from None
    quiet = as_json or not sys.stderr.isatty()
    with err_console.status("examining this machine") as status:

        def progress(message: str) -> None:
            if not quiet:
                status.update(message)

        try:
            report = diagnose(
                parsed,
                Settings().cache_dir,
                space_path=None if space is None else str(space),
                write_mb=write_mb,
                progress=progress,
            )
        except DoctorError as e:
            raise _fail(str(e)) from None
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2, default=str) + "\n")
    else:
        _print_doctor(report)
    raise typer.Exit(report.exit_code)


study_app = typer.Typer(
    help="Recorded sweeps as files: export a study to studies/NAME.json, import one anywhere.",
    no_args_is_help=True,
    context_settings=_CONTEXT,
)
app.add_typer(study_app, name="study")


@study_app.command("export")
def study_export(
    study: Annotated[str, typer.Option("--study", help="study name")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="file to write (default studies/NAME.json)")
    ] = None,
    storage: StorageOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="export a study whose sweep is still running")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="replace the file if it exists")
    ] = False,
) -> None:
    """Write a study (every trial's measurement, fingerprint and projection, Optuna's record,
    the space) to a JSON file that `sweeper study import` loads into any storage. An existing
    file is kept unless --overwrite says to replace it (studies/ holds recorded sweeps)."""
    from sweeper.studyfile import export_study, write_study_file

    path = out or Path("studies") / f"{study}.json"
    if path.exists() and not overwrite:
        raise _fail(
            f"{path} exists and was left as it is; write elsewhere with --out FILE, or replace "
            "it with --overwrite",
            code=2,
        )
    store = _reading_store(storage)
    try:
        store.migrate()
        document = export_study(store, study, allow_running=force)
    except SweeperError as e:
        raise _fail(_with_storage(e, store)) from None
    finally:
        store.dispose()
    try:
        write_study_file(document, path)
    except OSError as e:
        raise _fail(f"cannot write {path}: {e.strerror or e}") from None
    completed = sum(1 for t in document.trials if t["state"] == "complete")
    console.print(
        f"wrote {path}: study {study!r}, {len(document.trials)} trials ({completed} complete)",
        highlight=False,
    )


@study_app.command("import")
def study_import(
    file: Annotated[Path, typer.Argument(help="a study file, e.g. studies/cpu-demo.json")],
    storage: StorageOption = None,
    as_name: Annotated[
        str | None, typer.Option("--as", help="import under this name instead")
    ] = None,
) -> None:
    """Load a study file into a storage, so `best`, `serve` and the REST API work on it."""
    from sweeper.settings import resolve_storage
    from sweeper.store import Store
    from sweeper.studyfile import StudyFileError, import_study, read_study_file

    try:
        document = read_study_file(file)
    except StudyFileError as e:
        raise _fail(str(e), code=2) from None
    store = Store(resolve_storage(storage))
    try:
        store.migrate()
        name = import_study(store, document, name=as_name)
    except StudyFileError as e:
        raise _fail(str(e), code=2) from None
    except SweeperError as e:
        raise _fail(str(e)) from None
    finally:
        store.dispose()
    console.print(
        f"imported study {name!r} ({len(document.trials)} trials) into {store.redacted_url}; "
        f"see it with `sweeper best --study {name}` or `sweeper serve`",
        highlight=False,
    )


def main() -> None:
    # A shell starts a background job (`sweeper launch ... &`, nohup, CI runners) with SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler: `kill -INT` would do
    # nothing. An interrupt asked for explicitly must stop the sweep cleanly wherever it runs.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # SIGTERM (docker stop, Kubernetes, and PID 1 in a container, where a signal without a
    # handler is ignored) stops the sweep the same way, with its own exit code
    signal.signal(signal.SIGTERM, _terminate)
    app()


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


# ---------------------------------------------------------------------------- output


class RichObserver:
    """Shows the sweep while it runs: a progress bar and one line per finished trial."""

    def __init__(self, study: str, n_trials: int) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.progress.add_task(f"{study}: starting", total=n_trials)
        self.total, self.done = n_trials, 0
        self.first_trial_at: float | None = None

    def __enter__(self) -> RichObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def prepare_started(self) -> None:
        self.progress.update(self.task, description="preparing dataset and tokenizer")

    def prepare_done(self, prepared: PreparedData, wall_s: float) -> None:
        stats = prepared.stats
        self.progress.console.print(
            f"data: {stats['dataset_rows']} rows, tokens per sample p50 {stats['tokens_p50']}, "
            f"p90 {stats['tokens_p90']}, max {stats['tokens_max']} (prepared in {wall_s:.1f} s)",
            highlight=False,
        )
        # preflight (when the space has it) comes next; the first trial replaces this
        self.progress.update(self.task, description="preflight: what can run here")

    def trial_started(self, number: int, config: TrialConfig) -> None:
        if self.first_trial_at is None:
            self.first_trial_at = time.monotonic()
        self.progress.update(self.task, description=f"trial {number}: {_describe(config)}")

    def _eta(self) -> str:
        """`[3/8, about 4 min left]`: the mean trial so far times the trials left (an
        estimate: re-measuring at the end adds to it)."""
        left = self.total - self.done
        if self.first_trial_at is None or left <= 0:
            return f" [{self.done}/{self.total}]"
        per_trial = (time.monotonic() - self.first_trial_at) / self.done
        minutes = per_trial * left / 60
        about = f"{minutes:.0f} min" if minutes >= 1 else f"{per_trial * left:.0f} s"
        return f" [{self.done}/{self.total}, about {about} left]"

    def trial_done(self, row: TrialRow) -> None:
        self.done += 1
        config = _describe_dict(row.config)
        if row.state == "complete":
            line = (
                f"[green]✓[/] #{row.number} {config} → {_num(row.samples_per_s, ',.1f')} "
                f"samples/s, {_num(row.it_per_s, '.2f')} it/s, "
                f"${_num(row.cost_per_run_usd, ',.2f')}/run"
            )
        else:
            message = (row.failure_message or "")[:160]
            line = f"[red]✗[/] #{row.number} {config} → {row.failure_kind}: {escape(message)}"
        self.progress.console.print(line + escape(self._eta()), highlight=False)
        self.progress.advance(self.task)

    def note(self, message: str) -> None:
        self.progress.console.print(f"[yellow]note:[/] {escape(message)}", highlight=False)


def _num(value: float | None, spec: str) -> str:
    """Format a figure that may be unknown (NULL in the store) as '—'."""
    return "—" if value is None else format(value, spec)


def _describe(config: TrialConfig) -> str:
    return _describe_dict(config.model_dump())


def _describe_dict(config: dict[str, Any]) -> str:
    from sweeper.knobs import describe

    return describe(config)


def _print_leaderboard(url: str, study: str, top: int = 10) -> None:
    from sweeper.recommend import padding_share
    from sweeper.store import Store

    store = Store(url)
    trials = store.list_trials(study)
    store.dispose()
    completed = sorted(
        (t for t in trials if t.state == "complete" and t.cost_per_run_usd is not None),
        key=lambda t: (t.cost_per_run_usd, t.number),
    )
    table = Table(title=f"{study}: cheapest per run", title_justify="left")
    headers = ("#", "config", "samples/s", "tokens/s", "it/s", "data wait", "padding", "h/run")
    for header in (*headers, "$/run", "±95%"):
        if header == "config":  # the config is the point of the table: it folds, never cut
            table.add_column(header, justify="left", overflow="fold", min_width=40, ratio=1)
        else:
            table.add_column(header, justify="right", no_wrap=True)
    for t in completed[:top]:
        padding = padding_share(t.tokens_per_s, t.padded_tokens_per_s)
        table.add_row(
            str(t.number),
            _describe_dict(t.config),
            _num(t.samples_per_s, ",.1f"),
            _num(t.tokens_per_s, ",.0f"),
            _num(t.it_per_s, ".2f"),
            _num(None if t.data_wait_share is None else t.data_wait_share * 100, ".0f") + "%",
            _num(None if padding is None else padding * 100, ".0f") + "%",
            _num(t.hours_per_run, ",.1f"),
            _num(t.cost_per_run_usd, ",.2f"),
            _num(None if t.cost_ci95_rel is None else t.cost_ci95_rel * 100, ".1f")
            + "%"
            + (f" ×{len(t.remeasures)}" if t.remeasures else "")
            + (" [yellow]*[/]" if t.contended else ""),
        )
    console.print(table)
    if any(t.remeasures for t in completed[:top]):
        console.print("  ×N: measured N times, pooled (sweeper.noise)", highlight=False)
    contended = [f"#{t.number}" for t in completed[:top] if t.contended]
    if contended:
        console.print(
            f"  [yellow]*[/] measured only while the machine was shared: {', '.join(contended)}",
            highlight=False,
        )
    failed = [t for t in trials if t.state == "failed"]
    for t in failed:
        console.print(
            f"[red]failed[/] #{t.number} {_describe_dict(t.config)}: {t.failure_kind}: "
            f"{escape((t.failure_message or '')[:200])}",
            highlight=False,
        )


def _print_recommendation(rec: Recommendation) -> None:
    config = rec.config
    console.print(
        f"\n[bold]recommended[/] for {rec.study} on {rec.hardware_name} "
        f"(${rec.usd_per_hour:.2f}/h): trial #{rec.trial_number}, "
        + (
            f"picked among the {len(rec.ties) + 1} that tie within the noise "
            f"({_count(rec.completed_trials, 'trial')} completed)"
            if rec.ties
            else f"the cheapest of {_count(rec.completed_trials, 'trial')} completed"
        ),
        highlight=False,
    )
    for key, value in config.items():  # as YAML writes them, to paste into a space's baseline
        shown = (
            "null" if value is None else str(value).lower() if isinstance(value, bool) else value
        )
        console.print(f"  {key}: {escape(str(shown))}", highlight=False)
    console.print(
        f"  → {rec.throughput_text()}, "
        f"{_num(rec.it_per_s, '.2f')} it/s; {_num(rec.hours_per_run, ',.1f')} h/run, "
        f"[bold]{rec.interval_text()}[/]",
        highlight=False,
    )
    if rec.tie_note:
        console.print(f"    {rec.tie_note}", highlight=False)
    part = rec.projection
    if part:
        console.print(
            f"    training {part['train_hours']:,.2f} h + start-up {part['startup_s']:,.0f} s + "
            f"compile {part['compile_s']:,.0f} s + {part['checkpoint_saves']} checkpoint saves "
            f"{part['checkpoint_s']:,.0f} s",
            highlight=False,
        )
    details = []
    if rec.padding_share is not None:
        details.append(f"padding {rec.padding_share:.0%} of computed tokens")
    if rec.truncated_tokens_share is not None:
        details.append(f"truncates {rec.truncated_tokens_share:.1%} of tokens")
    if rec.memory_headroom is not None:
        details.append(f"memory headroom {rec.memory_headroom:.0%}")
    if rec.trainable_text():
        details.append(str(rec.trainable_text()))
    if rec.measured_on:
        details.append(f"measured on {rec.measured_on}")
    if details:
        console.print("    " + "; ".join(details), highlight=False)
    if rec.keeps_baseline:
        console.print(
            f"  this is your baseline (trial #{rec.trial_number}): {rec.KEEP_BASELINE}",
            highlight=False,
        )
    elif rec.speedup_vs_baseline is not None and rec.usd_saved_per_run is not None:
        console.print(
            f"  vs baseline (trial #{rec.baseline_trial_number}): "
            f"{_num(rec.baseline_hours_per_run, ',.1f')} h, "
            f"${_num(rec.baseline_cost_per_run_usd, ',.2f')}/run, "
            f"{rec.baseline_throughput_text()} → "
            f"{rec.speedup_vs_baseline:.2f}× faster, ${rec.usd_saved_per_run:,.2f} saved per run",
            highlight=False,
        )
    if rec.sweep_cost_usd is not None:
        payback = (
            f"; it pays for itself after {rec.payback_runs} run"
            f"{'s' if rec.payback_runs != 1 else ''}"
            if rec.payback_runs is not None
            else ""
        )
        console.print(
            f"  the sweep used {_num(rec.sweep_hours, ',.2f')} h of this machine "
            f"(${rec.sweep_cost_usd:,.2f}){payback}",
            highlight=False,
        )
    if rec.constraints != "no constraint":
        console.print(f"  constraints: {escape(str(rec.constraints))}", highlight=False)
    for warning in rec.warnings:
        console.print(f"  [yellow]warning:[/] {escape(warning)}", highlight=False)
    for note in rec.excluded:
        console.print(f"  [yellow]left out:[/] {escape(note)}", highlight=False)


def _print_doctor(report: DoctorReport) -> None:
    facts = report.facts
    title = "this machine" + (f" for {report.space}" if report.space else "")
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("topic", style="bold")
    table.add_column("finding", overflow="fold")
    table.add_row(
        "versions",
        f"Python {facts['python']}, torch {facts['torch']} (CUDA {facts['torch_cuda'] or 'none'}"
        f"), transformers {facts['transformers']}"
        + (f", driver {facts['driver']}" if facts.get("driver") else ""),
    )
    installed = [
        f"{name} {info['version']}" + ("" if info["imports"] else " (does not import)")
        for name, info in facts["packages"].items()
        if info["installed"]
    ]
    missing = [name for name, info in facts["packages"].items() if not info["installed"]]
    table.add_row(
        "packages",
        (", ".join(installed) or "none of the optional ones")
        + (f"; not installed: {', '.join(missing)}" if missing else ""),
    )
    marks = {"ok": "[green]✓[/]", "warning": "[yellow]![/]", "problem": "[red]✗[/]"}
    for finding in report.findings:
        if finding.level == "ok":
            table.add_row(finding.topic, f"{marks['ok']} {finding.text}")
    console.print(table)
    for finding in report.findings:
        if finding.level == "ok":
            continue
        console.print(
            f"{marks[finding.level]} [bold]{finding.level}[/] ({finding.topic}): "
            f"{escape(finding.text)}",
            highlight=False,
        )
        if finding.fix:
            console.print(f"    fix: {escape(finding.fix)}", highlight=False)
    took = sum(report.phases_s.values())
    if report.space is None:
        console.print(f"\nexamined in {took:.0f} s", highlight=False)
    elif report.problems:
        console.print(
            f"\n[red]{len(report.problems)} problem(s)[/]: {report.space} asks for what this "
            f"machine cannot do (examined in {took:.0f} s)",
            highlight=False,
        )
    else:
        console.print(
            f"\n[green]{report.space} can run here[/] (examined in {took:.0f} s)", highlight=False
        )


def _print_comparison(comparison: Comparison) -> None:
    cheapest = comparison.cheapest
    console.print(
        f"\n[bold]cheapest[/] across {len(comparison.per_study)} machine(s): "
        f"{cheapest.hardware_name} (${cheapest.usd_per_hour:.2f}/h, study {cheapest.study}), "
        f"trial #{cheapest.trial_number}: {_num(cheapest.hours_per_run, ',.1f')} h, "
        f"[bold]${cheapest.cost_per_run_usd:,.2f}/run[/]",
        highlight=False,
    )
    table = Table(title="Pareto front: no other config is both faster and cheaper")
    for column in ("machine", "$/h", "study", "trial", "config", "h/run", "$/run"):
        table.add_column(column)
    for point in comparison.pareto:
        table.add_row(
            point.hardware_name,
            f"{point.usd_per_hour:.2f}",
            point.study,
            str(point.trial_number),
            _describe_dict(point.config),
            f"{point.hours_per_run:,.1f}",
            f"{point.cost_per_run_usd:,.2f}",
        )
    console.print(table)
    for name, why in comparison.unavailable.items():
        console.print(f"  [yellow]{escape(name)}:[/] {escape(why)}", highlight=False)


if __name__ == "__main__":
    main()
