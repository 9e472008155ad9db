"""``sweeper`` command line: one function per command; the docstring is the help.

Heavy modules (optuna, sqlalchemy, fastapi; torch only ever in the trial child) are imported
inside the commands, so ``sweeper --help`` is instant and ``import sweeper.cli`` stays light.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from sweeper.cli_common import (
    HELP_CONTEXT,
    AllowTruncationOption,
    MaxCostOption,
    MaxHoursOption,
    MinHeadroomOption,
    StorageOption,
    UsdPerHourOption,
    fail,
    reading_store,
    with_storage,
)
from sweeper.cli_study import study_app
from sweeper.cli_sweep import (
    NO_TRIAL_COMPLETED,
    launch_workers,
    missing_trials,
    ran_without_completing,
    sweep_and_report,
)
from sweeper.cluster import cluster_app
from sweeper.console import (
    console,
    err_console,
    print_comparison,
    print_doctor,
    print_knob_effects,
    print_leaderboard,
    print_offers,
    print_recommendation,
)
from sweeper.errors import (
    CatalogError,
    NothingMeetsError,
    SettingsError,
    SpaceError,
    SweeperError,
    Terminated,
)

if TYPE_CHECKING:
    from sweeper.recommend import Constraints
    from sweeper.space import Space

app = typer.Typer(
    help="Find the cheapest way to run a training job: timed trials, priced per run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=HELP_CONTEXT,
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


@app.command(
    short_help="Run a sweep: each trial trains the workload with one config in a child process."
)
def launch(
    space: Annotated[
        Path | None, typer.Option("--space", help="a space file, e.g. spaces/h100.yaml")
    ] = None,
    study: Annotated[
        str | None,
        typer.Option(
            "--study",
            help="resume this stored study with the space it stored (one imported --as NAME "
            "included); with --space, the file's space under this name",
        ),
    ] = None,
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
            help="sweep with this many worker processes on one study, the trials shared out "
            "among them; they share the visible GPUs as `worker --devices` does (at most GPUs ÷ "
            "the smallest search.devices workers; on a CPU, any N)",
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
    join: Annotated[
        bool,
        typer.Option(
            "--join",
            help="run beside a live worker of the study on this host and these devices "
            "(refused without it: both would measure a shared machine)",
        ),
    ] = False,
) -> None:
    """Run a sweep: each trial trains the workload with one config in a child process. Exit
    status: 0 when the study has a completed trial; 2 for a bad space file (or data), before
    anything is written; 3 when the sweep ended and the study holds no completed trial (each
    failed or was skipped; not when stopped on request, nor while other workers of the study
    still run); 1 for other errors (a lost database); 130/143 on Ctrl-C/SIGTERM."""
    from sweeper.joining import same_place_worker
    from sweeper.settings import resolve_storage
    from sweeper.space import as_study, load_space

    if space is not None:
        try:
            parsed = load_space(space, runs_here=True)
        except SpaceError as e:
            raise fail(f"invalid space file\n{e}", code=2) from None
        try:
            parsed = parsed if study is None else as_study(parsed, study)
        except SpaceError as e:
            raise fail(str(e), code=2) from None
        url = resolve_storage(storage, parsed.storage)
        text, path = space.read_text(encoding="utf-8"), str(space)  # type: str, str | None
    elif study is not None:
        url = resolve_storage(storage)
        parsed, text, path = _stored_study(storage, study)
    else:
        raise fail("pass --space FILE (a space file) or --study NAME (a stored study)", code=2)
    busy = None if join else same_place_worker(url, parsed.study)
    if busy is not None:
        raise fail(busy, code=2)
    if fill:
        n_trials = missing_trials(url, parsed.study, n_trials or parsed.budget.n_trials)
        if n_trials == 0:
            print_leaderboard(url, parsed.study)
            if ran_without_completing(url, parsed.study):  # its plan is spent on failures
                raise fail(
                    f"study {parsed.study} has run its trials and none completed, so there is "
                    "nothing to recommend; each failure is named above: fix what they say, "
                    "then launch again without --fill (or with a larger --n-trials) "
                    f"(exit {NO_TRIAL_COMPLETED})",
                    NO_TRIAL_COMPLETED,
                )
            return
    if workers > 1:
        from sweeper.sweep.fleet import visible_gpus

        command = ["launch", "--join"]  # the N workers share on purpose
        command += ["--space", str(space)] if space is not None else []
        command += ["--study", study] if study is not None else []
        total = n_trials or parsed.budget.n_trials
        gpus, sizes = visible_gpus(), list(parsed.search.devices)
        launch_workers(command, parsed.study, url, gpus, workers, total, max_minutes, sizes)
        print_leaderboard(url, parsed.study)
        return
    sweep_and_report(parsed, url, text, path, n_trials, max_minutes)


def _stored_study(storage: str | None, study: str) -> tuple[Space, str, str | None]:
    """The space study ``study`` stored (as that study, though imported ``--as`` another
    name), its text and the path it came from."""
    from sweeper.errors import StudyNotFoundError
    from sweeper.space import stored_space

    store = reading_store(storage)  # a missing SQLite file is said, never created
    try:
        row = store.get_study(study)
    except StudyNotFoundError as e:
        said = with_storage(e, store)
        raise fail(f"{said}; create it first with `sweeper launch --space FILE`", code=2) from None
    except SweeperError as e:
        raise fail(str(e)) from None
    finally:
        store.dispose()
    try:
        parsed = stored_space(row.space_yaml, row.name, row.space_path or f"study {study}")
    except SpaceError as e:
        raise fail(f"the study's stored space no longer loads\n{e}", code=2) from None
    return parsed, row.space_yaml, row.space_path


def _ask(question: str) -> str | None:
    """init's question for a missing option, on a terminal; elsewhere (a script, CI, a pipe)
    no question: the option is missing, said with its name (a prompt there read EOF and
    printed only 'Aborted.')."""
    return question if sys.stdin.isatty() else None


@app.command(
    short_help="Write the minimal space for your own fine-tune (model, data, engine, machine "
    "and price, the job's size); then sweeper launch --space FILE."
)
def init(
    model: Annotated[
        str,
        typer.Option("--model", prompt=_ask("model (a save_pretrained directory or a hub id)")),
    ],
    data: Annotated[
        Path,
        typer.Option("--data", prompt=_ask("training data (.jsonl: chat records or text)")),
    ],
    price: Annotated[
        float,
        typer.Option(
            "--price", min=0.0001, prompt=_ask("one device's price, $ per hour (a GPU's)")
        ),
    ],
    hardware: Annotated[
        str, typer.Option("--hardware", help="the machine the real job rents (its name)")
    ] = "H100 SXM 80GB",
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="sft (TRL's SFTTrainer), trainer (transformers.Trainer), loop, or script (your "
            "own program: --command)",
        ),
    ] = "sft",
    command: Annotated[
        str | None,
        typer.Option(
            "--command",
            help="--engine script: your run's command line, e.g. 'python train.py "
            "--output_dir out' (an accelerate launch or torchrun line too)",
        ),
    ] = None,
    knobs_form: Annotated[
        str,
        typer.Option(
            "--knobs",
            help="--engine script: how the knobs reach it: flags (TrainingArguments flags), "
            "sft_flags (SFTConfig's too) or env (sweeper.trial_config())",
        ),
    ] = "flags",
    samples: Annotated[
        int | None,
        typer.Option(
            "--samples", min=1, help="samples in one epoch of the real job (default: the file's)"
        ),
    ] = None,
    epochs: Annotated[float, typer.Option("--epochs", min=0.01)] = 1.0,
    lora: Annotated[
        bool,
        typer.Option(
            "--lora",
            help="train a LoRA adapter through peft, the base frozen (workload.adapter: r 16, "
            "alpha 32, dropout 0.05, all-linear; edit them to your run's)",
        ),
    ] = False,
    quantization: Annotated[
        str,
        typer.Option(
            "--quantization",
            help="with --lora: the base weights as your run loads them: none, 4bit (QLoRA's "
            "NF4) or 8bit (bitsandbytes, CUDA)",
        ),
    ] = "none",
    device: Annotated[str, typer.Option("--device", help="auto, cuda or cpu")] = "auto",
    out: Annotated[Path, typer.Option("--out", "-o", help="the space file to write")] = Path(
        "spaces/mine.yaml"
    ),
    force: Annotated[bool, typer.Option("--force", help="replace an existing file")] = False,
) -> None:
    """Write the minimal space for your own fine-tune: your model, your data, the engine, the
    machine and its price, the job's size, and with --lora its LoRA adapter (--quantization
    4bit: QLoRA); everything else defaulted (max_seq_length from the data). Then: sweeper
    launch --space FILE."""
    import shlex
    from importlib.util import find_spec

    from sweeper.starter import ENGINES, OWN_SCRIPT, line_said, minimal_space, study_name

    words: list[str] = []
    if engine == "script":
        if not command:
            raise fail(OWN_SCRIPT, code=2)
        try:
            words = shlex.split(command)
        except ValueError as e:  # a quote left open
            raise fail(
                f"--command {command!r}: {e}; quote it as your shell would", code=2
            ) from None
        if knobs_form not in ("flags", "sft_flags", "env"):
            raise fail(f"--knobs {knobs_form}: use flags, sft_flags or env", code=2)
        from sweeper.preflight_script import absent_programs

        missing = absent_programs(words, Path.cwd())
        if missing:  # the space's cwd is here: its trials would each fail to start
            raise fail(
                f"--command: {missing[0]} is not a file in {Path.cwd()}, where the command "
                "will run (init writes workload.script.cwd as this directory): run init where "
                "your script is, or give its path from here",
                code=2,
            )
    elif command is not None:
        raise fail(
            f"--command is your own program's (--engine script); --engine {engine} builds the "
            "run itself: leave --command out, or say --engine script",
            code=2,
        )
    elif engine not in ENGINES:
        raise fail(f"--engine {engine}: use one of {', '.join(ENGINES)}, or script", code=2)
    if device not in ("auto", "cuda", "cpu"):
        raise fail(f"--device {device}: use auto, cuda or cpu", code=2)
    if not data.is_file():
        raise fail(f"--data {data}: no such file", code=2)
    if out.exists() and not force:
        raise fail(f"{out} exists; pick another --out, or --force to replace it", code=2)
    study = study_name(out)
    try:
        text = minimal_space(
            study=study, model=model, data=data, engine=engine, hardware=hardware,
            usd_per_hour=price, samples=samples, epochs=epochs, device=device,
            command=words, knobs=knobs_form, lora=lora, quantization=quantization,
        )  # fmt: skip
    except SpaceError as e:
        raise fail(str(e), code=2) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    if "messages_field:" in text:
        console.print(
            "chat records: the loss is taken on every token (loss: all, TRL's default); for the "
            f"replies only, set workload.dataset.loss: completion in {out}",
            highlight=False,
        )
    if lora:
        console.print(
            f"LoRA: r 16, alpha 32, dropout 0.05 on all-linear layers, peft's usual settings; "
            f"set your run's under workload.adapter in {out}"
            + ("" if find_spec("peft") else "; peft is not installed here: pip install peft"),
            highlight=False,
        )
    if engine == "script":
        console.print(escape(f"your command is the trial: {line_said(words)}"), highlight=False)
    console.print(
        f"wrote {out} (study {study}). Next:\n  sweeper doctor --space {out}   # can it run "
        f"here, and how long\n  sweeper launch --space {out}\n  sweeper best --study {study}",
        highlight=False,
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
            help="GPUs to work on, e.g. 0,1,2,3: as many worker processes as trials of the "
            "smallest search.devices fit on them side by side (4 for devices [1, 2]); each "
            "trial holds as many as its devices knob says and sees only those "
            "(CUDA_VISIBLE_DEVICES), never a GPU another trial holds; the trials are shared "
            "out among the workers",
        ),
    ] = None,
) -> None:
    """Join a study that `sweeper launch` created (on this machine or another one, through
    the same Postgres URL): run trials of its space until its budget is spent. Workers never
    run a config another worker runs or ran."""
    from sweeper.settings import resolve_storage
    from sweeper.sweep.devicepool import DevicePool
    from sweeper.sweep.fleet import FleetError, check_pool, parse_devices

    try:
        gpus = parse_devices(devices) if devices is not None else []
        url = resolve_storage(storage)
        parsed, text, path = _stored_study(storage, study)
        sizes = list(parsed.search.devices)
        count = check_pool(gpus, sizes, None) if gpus else 1
    except FleetError as e:
        raise fail(str(e), e.code) from None
    if count > 1:
        command = ["worker", "--study", study]
        total = n_trials or parsed.budget.n_trials
        launch_workers(command, study, url, gpus, count, total, max_minutes, sizes)
        print_leaderboard(url, study)
        return
    if gpus:  # one worker: its trials hold the pool's GPUs all the same
        os.environ.update(DevicePool(gpus).env())
    sweep_and_report(parsed, url, text, path, n_trials, max_minutes)


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

    from api.app import create_app
    from sweeper.ports import address_taken
    from sweeper.settings import Settings, resolve_storage
    from sweeper.store import redact

    settings = Settings()
    taken = address_taken(host or settings.host, port or settings.port)
    if taken is not None:
        raise fail(taken, code=3)
    if check:
        return
    url = resolve_storage(storage)
    token = None if settings.api_token is None else settings.api_token.get_secret_value()
    try:
        application = create_app(url, api_token=token, cors_origins=settings.cors_origins)
    except SweeperError as e:
        raise fail(str(e)) from None
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
            "prices), and price the job on every GPU of the catalog: measured or estimated",
        ),
    ] = False,
    catalog: Annotated[
        Path | None,
        typer.Option("--catalog", help="GPU catalog to price from (implies --across-hardware)"),
    ] = None,
    gpus: Annotated[
        list[str] | None,
        typer.Option(
            "--gpu",
            help="a catalog GPU type to show (repeatable, or comma-separated as the "
            "dashboard's form takes them); N x key for N of them (--gpu '2x h100-sxm' "
            "--gpu '4x a100-40gb', or --gpu 'h100-sxm,2x h100-sxm')",
        ),
    ] = None,
) -> None:
    """Print the recommended (cheapest per run) config of a study, within the constraints."""
    from sweeper.compare import compare
    from sweeper.recommend import best
    from sweeper.verdict import study_knob_effects

    if gpus:  # a walk typed the dashboard's comma list: "... is not an offer"
        gpus = [offer.strip() for given in gpus for offer in given.split(",") if offer.strip()]
    across_hardware = across_hardware or catalog is not None or bool(gpus)
    if across_hardware and usd_per_hour is not None:
        raise fail("--usd-per-hour re-prices one study; drop it with --across-hardware", 2)
    constraints = _constraints(max_hours, max_cost, min_headroom, allow_truncation, usd_per_hour)
    store = reading_store(storage)
    try:
        store.migrate()
        result = (
            compare(store, study, constraints, offers=True, catalog=catalog, gpus=gpus)
            if across_hardware
            else best(store, study, constraints)
        )
        effects = None if across_hardware else study_knob_effects(store, study, constraints)
    except SweeperError as e:  # a wrong catalog or GPU type is the user's input: exit 2
        offers = getattr(e, "offers", None)
        if isinstance(e, NothingMeetsError) and offers is not None and not as_json:
            # the table says how far each offer is from the limits, as the study page does
            print_offers(offers, constraints.describe())
        raise fail(with_storage(e, store), 2 if isinstance(e, CatalogError) else 1) from None
    finally:
        store.dispose()
    if as_json:
        extra = {} if effects is None else {"knob_effects": effects.model_dump(mode="json")}
        sys.stdout.write(json.dumps(result.model_dump(mode="json") | extra, indent=2) + "\n")
    elif effects is None:
        print_comparison(result)  # type: ignore[arg-type]
    else:
        print_recommendation(result)  # type: ignore[arg-type]
        print_knob_effects(effects, study)


@app.command(
    short_help="Print the recommended config as a TrainingArguments, TRL SFTConfig or "
    "DataLoader snippet, a launch command, YAML or JSON."
)
def export(
    study: Annotated[str, typer.Option("--study", help="study name")],
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="trainer | sft | dataloader | yaml | json | command | accelerate; default: "
            "the study's own (trainer for sweeper's engines; for a script of yours, its command)",
        ),
    ] = None,
    storage: StorageOption = None,
    max_hours: MaxHoursOption = None,
    max_cost: MaxCostOption = None,
    min_headroom: MinHeadroomOption = None,
    allow_truncation: AllowTruncationOption = False,
) -> None:
    """Print the recommended config as a TrainingArguments, TRL SFTConfig or DataLoader snippet,
    YAML or JSON."""
    from sweeper.export import FORMATS, render, study_formats
    from sweeper.recommend import best

    if fmt is not None and fmt not in FORMATS:
        raise fail(f"--format {fmt!r} is not one of {', '.join(FORMATS)}", code=2)
    constraints = _constraints(max_hours, max_cost, min_headroom, allow_truncation)
    store = reading_store(storage)
    try:
        store.migrate()
        recommendation = best(store, study, constraints)
        space_yaml = store.get_study(study).space_yaml
        if fmt is None:  # the study's own first form: what its program is, as its trial ran
            forms = study_formats(store, recommendation, space_yaml)
            fmt = forms[0]
            if forms[0] != "trainer":
                err_console.print(
                    f"exported as --format {fmt}, this study's own form (--format also takes "
                    f"{', '.join(forms[1:])}, json)",
                    highlight=False,
                )
    except SweeperError as e:
        raise fail(with_storage(e, store)) from None
    finally:
        store.dispose()
    try:
        text = render(recommendation, fmt, space_yaml)  # type: ignore[arg-type]
    except SweeperError as e:  # a format this study cannot give (command: not a script study)
        raise fail(str(e), code=2) from None
    sys.stdout.write(text)


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
            parsed = load_space(space, runs_here=True)
        except SpaceError as e:
            raise fail(f"invalid space file\n{e}", code=2) from None
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
            raise fail(str(e)) from None
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2, default=str) + "\n")
    else:
        print_doctor(report)
    raise typer.Exit(report.exit_code)


app.add_typer(study_app, name="study")
app.add_typer(cluster_app, name="cluster")


def main() -> None:
    # A shell starts a background job (`sweeper launch ... &`, nohup, CI runners) with SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler: `kill -INT` would do
    # nothing. An interrupt asked for explicitly must stop the sweep cleanly wherever it runs.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # SIGTERM (docker stop, Kubernetes, and PID 1 in a container, where a signal without a
    # handler is ignored) stops the sweep the same way, with its own exit code
    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    except SettingsError as e:  # read by whichever command needs the environment
        raise SystemExit(fail(str(e), 2).exit_code) from None


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


if __name__ == "__main__":
    main()
