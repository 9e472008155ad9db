"""The cluster recipes under deploy/ (Kubernetes, SkyPilot, Slurm): they run the worker that
docker-compose.yml runs, they are valid for their engines (the Kubernetes schemas, SkyPilot's
own parser), and workers started the way they start them share one Postgres study."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from sweeper.cluster import (
    WORKER_COMMAND,
    WORKER_ENV,
    ClusterError,
    GpuOffer,
    measured_hours,
    parse_gpu,
    skypilot_files,
    time_estimator,
)
from sweeper.errors import StorageError, StudyNotFoundError
from sweeper.recommend import best
from sweeper.settings import Settings
from sweeper.space import load_space
from sweeper.store import Store
from tests.helpers import (
    REPO,
    STUDY_FIELDS,
    TINY_SPACE,
    run_sweeper,
    tally_study,
    tiny_config,
)
from tests.test_cli import _slow_space, env  # noqa: F401 (env is a fixture)

DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
SKYPILOT = DEPLOY / "skypilot"
SLURM = DEPLOY / "slurm" / "sweeper-workers.sbatch"
SPACE = "SPACE"  # the space file's path, which each recipe names its own way
# backoffLimitPerIndex is beta (on by default) from 1.29 and GA in 1.33; the newest schema the
# package ships is checked too
KUBERNETES_VERSIONS = ("1.29", "1.37")
# how the example under deploy/skypilot was written (deploy/README.md says so too)
SKYPILOT_ARGS = [
    "cluster", "skypilot", "--space", "spaces/h100.yaml", "--gpu", "H100=2.50",
    "--gpu", "A100-80GB=1.79", "--gpu", "L40S=0.99", "--workers", "4",
    "--out", "deploy/skypilot",
]  # fmt: skip


# --- what each recipe runs -----------------------------------------------------------------


def _argv(words: list[str], space_flag: str = "--space") -> list[str]:
    """``words`` from ``sweeper`` on, the space's path replaced by SPACE."""
    argv = words[words.index("sweeper") :]
    at = argv.index(space_flag) + 1
    return [*argv[:at], SPACE, *argv[at + 1 :]]


def _compose_worker() -> tuple[list[str], set[str]]:
    worker = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["worker"]
    return _argv(worker["command"]), set(worker["environment"])


def _kubernetes_worker() -> tuple[list[str], set[str]]:
    (job,) = yaml.safe_load_all((KUBERNETES / "workers.yaml").read_text())
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return _argv(container["command"]), {e["name"] for e in container["env"]}


def _skypilot_worker(file: str) -> tuple[list[str], set[str]]:
    task = yaml.safe_load((SKYPILOT / file).read_text())
    (line,) = [x for x in task["run"].splitlines() if x.startswith("exec ")]
    return _argv(shlex.split(line)), set(task.get("envs") or {}) | set(task["secrets"])


def _slurm_worker() -> tuple[list[str], set[str]]:
    text = SLURM.read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("exec srun ")]
    exported = {x.split()[1].split("=")[0] for x in text.splitlines() if x.startswith("export ")}
    return _argv(shlex.split(line)), exported


RECIPES = {
    "kubernetes": _kubernetes_worker,
    "skypilot": lambda: _skypilot_worker("sweeper-workers.yaml"),
    "skypilot-pool": lambda: _skypilot_worker("sweeper-pool-job.yaml"),
    "slurm": _slurm_worker,
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_runs_the_compose_worker_command_with_its_environment(recipe: str) -> None:
    compose_argv, compose_env = _compose_worker()
    argv, names = RECIPES[recipe]()
    assert argv == [*WORKER_COMMAND, SPACE], argv
    # compose's worker, plus --join (each container there has a host name of its own)
    assert [w for w in argv if w != "--join"] == compose_argv
    assert compose_env == set(WORKER_ENV) and names >= compose_env, names
    # Settings ignores an unknown SWEEPER_* name: a misspelled one would be silently dropped
    settings = {f"SWEEPER_{name.upper()}" for name in Settings.model_fields}
    assert names <= settings, names - settings


# --- Kubernetes ----------------------------------------------------------------------------


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    files = sorted(KUBERNETES.glob("*.yaml")) + [KUBERNETES / "secret.yaml.template"]
    return [(f.name, doc) for f in files for doc in yaml.safe_load_all(f.read_text()) if doc]


def _kind(kind: str) -> dict[str, Any]:
    (found,) = [doc for _, doc in _manifests() if doc["kind"] == kind]
    return found


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_manifests_validate_against_the_schemas(version: str) -> None:
    validate = pytest.importorskip("kubernetes_validate").validate
    kinds = []
    for name, doc in _manifests():
        try:  # strict: a misspelled field is an error, not ignored
            validate(doc, version, strict=True)
        except Exception as e:
            pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']}: {e}")
        kinds.append(doc["kind"])
    assert sorted(kinds) == sorted(
        ["Namespace", "Secret", "Service", "StatefulSet", "Service", "Deployment", "Job"]
    )


def test_the_schema_check_rejects_what_an_api_server_would() -> None:
    """The validation above can fail: a misspelled Job field and a wrong type are errors."""
    utils = pytest.importorskip("kubernetes_validate.utils")
    job = _kind("Job")
    misspelled = json.loads(json.dumps(job))
    misspelled["spec"]["backoffLimitPerIndx"] = misspelled["spec"].pop("backoffLimitPerIndex")
    wrong_type = json.loads(json.dumps(job))
    wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "a minute"
    for doc in (misspelled, wrong_type):
        with pytest.raises(utils.ValidationError):
            utils.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)


def _dockerfile_uid() -> int:
    """The uid of the Dockerfile's user: its ``--uid``, else 1000 (Debian gives the first
    user of an image the first uid of UID_MIN, 1000)."""
    (line,) = [x for x in (REPO / "Dockerfile").read_text().splitlines() if "useradd" in x]
    words = shlex.split(line)
    return int(words[words.index("--uid") + 1]) if "--uid" in words else 1000


def test_the_worker_job_survives_preemption_and_fails_an_index_on_a_config_error() -> None:
    """What the schemas do not check, but the API server, the scheduler and sweeper need."""
    job = _kind("Job")["spec"]
    pod = job["template"]["spec"]
    (worker,) = pod["containers"]
    assert job["completionMode"] == "Indexed" and job["parallelism"] == job["completions"]
    # podFailurePolicy needs restartPolicy Never; FailIndex needs backoffLimitPerIndex
    assert pod["restartPolicy"] == "Never" and job["backoffLimitPerIndex"] >= 1
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    rules = job["podFailurePolicy"]["rules"]
    ignored = [r for r in rules if r["action"] == "Ignore"]
    assert {"type": "DisruptionTarget", "status": "True"} in ignored[0]["onPodConditions"]
    assert [r["onExitCodes"]["values"] for r in ignored[1:]] == [[143]]  # SIGTERM
    (fail_index,) = [r for r in rules if r["action"] == "FailIndex"]
    assert fail_index["onExitCodes"] == {
        "containerName": worker["name"], "operator": "In", "values": [2, 3],
    }  # fmt: skip  # 2: a config error; 3: no trial of the study completed
    assert pod["terminationGracePeriodSeconds"] >= 30


def test_every_pod_runs_as_non_root_with_the_images_user() -> None:
    pods = {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"]
        for _, doc in _manifests()
        if doc["kind"] in ("Job", "Deployment", "StatefulSet")
    }
    assert set(pods) == {"sweeper-workers", "sweeper-api", "sweeper-postgres"}
    for name, pod in pods.items():
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] > 0, name
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod["containers"]:
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            }, name  # fmt: skip
    for name in ("sweeper-workers", "sweeper-api"):  # the Dockerfile's image
        assert pods[name]["securityContext"]["runAsUser"] == _dockerfile_uid(), name
    # the restricted Pod Security Standard is enforced on the namespace
    labels = _kind("Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_secrets_come_from_the_secret_and_its_template_holds_no_real_value() -> None:
    template = _kind("Secret")
    referenced = {
        (ref["name"], ref["key"])
        for _, doc in _manifests()
        if doc["kind"] in ("Job", "Deployment", "StatefulSet")
        for container in doc["spec"]["template"]["spec"]["containers"]
        for variable in container.get("env", [])
        for ref in [variable.get("valueFrom", {}).get("secretKeyRef")]
        if ref
    }
    assert referenced == {
        ("sweeper", "storage-url"), ("sweeper", "postgres-password"), ("sweeper", "api-token"),
    }  # fmt: skip
    assert {key for _, key in referenced} == set(template["stringData"])
    assert all("CHANGE-ME" in value for value in template["stringData"].values())
    # `kubectl apply -f deploy/kubernetes/` applies *.yaml: never the template
    assert not list(KUBERNETES.glob("secret*.yaml"))


# --- SkyPilot ------------------------------------------------------------------------------


def test_the_skypilot_example_is_what_the_command_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process (the command's own path, files on disk and all, is
    test_cluster_skypilot_keeps_files_that_exist_unless_forced's): SKYPILOT_ARGS' files."""
    (tmp_path / "spaces").mkdir()
    shutil.copy(REPO / "spaces" / "h100.yaml", tmp_path / "spaces" / "h100.yaml")
    monkeypatch.chdir(tmp_path)
    gpus = [SKYPILOT_ARGS[i + 1] for i, word in enumerate(SKYPILOT_ARGS) if word == "--gpu"]
    files = skypilot_files(
        Path("spaces/h100.yaml"), [parse_gpu(g) for g in gpus], 4, Path("deploy/skypilot")
    )
    made = {path.relative_to("deploy/skypilot"): text for path, text in files.items()}
    ours = {p.relative_to(SKYPILOT) for p in SKYPILOT.rglob("*.yaml")}
    assert set(made) == ours
    for path in ours:
        assert made[path] == (SKYPILOT / path).read_text(), path


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("H100", "give NAME=USD_PER_HOUR"),
        ("H 100=2", "give NAME=USD_PER_HOUR"),
        ("H100:2=3", "one GPU per worker"),
        ("H100=free", "the price must be a positive number"),
        ("H100=-1", "the price must be a positive number"),
        ("H100=inf", "the price must be a positive number"),
    ],
)
def test_a_gpu_offer_is_a_name_and_a_positive_price(text: str, said: str) -> None:
    with pytest.raises(ClusterError, match=said):
        parse_gpu(text)
    offer = parse_gpu("A100-80GB:1=1.79")
    assert (offer.slug, offer.name_pattern) == ("a100-80gb", "*A100*80GB*")


def test_measured_hours_are_each_studys_recommended_hours(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    store.migrate()
    try:
        for name, hardware, hours in (("job-h100", "H100", 10.0), ("job-l40s", "L40S", 31.0)):
            fields = STUDY_FIELDS | {
                "hardware_name": hardware,
                "space_yaml": TINY_SPACE.read_text(),
            }
            store.upsert_study(name, **fields)
            store.start_trial(name, 0, tiny_config().model_dump())
            store.finish_trial(name, 0, "complete", samples_per_s=50.0, it_per_s=1.5,
                               hours_per_run=hours, cost_per_run_usd=25.0)  # fmt: skip
        hours = measured_hours(store, ["job-h100", "job-l40s"])
        with pytest.raises(StudyNotFoundError):
            measured_hours(store, ["no-such-study"])
    finally:
        store.dispose()
    assert hours == {"H100": 10.0, "L40S": 31.0}

    class OnAnL4:
        accelerators = {"L4": 1}

    with pytest.raises(ClusterError, match="no measured hours for {'L4': 1}"):
        time_estimator(hours)(OnAnL4())


def test_one_study_per_gpu_type_of_the_same_workload() -> None:
    source = load_space(REPO / "spaces" / "h100.yaml")
    spaces = {p.name: load_space(p) for p in sorted((SKYPILOT / "spaces").glob("*.yaml"))}
    assert {(s.study, s.hardware.name, s.hardware.usd_per_hour) for s in spaces.values()} == {
        ("h100-llama-1b-h100", "H100", 2.5),
        ("h100-llama-1b-a100-80gb", "A100-80GB", 1.79),
        ("h100-llama-1b-l40s", "L40S", 0.99),
    }
    # one workload: `sweeper best --across-hardware` compares these studies
    assert {s.workload_hash() for s in spaces.values()} == {source.workload_hash()}
    assert all(s.search == source.search and s.hardware.device == "cuda" for s in spaces.values())


def _shim(directory: Path, name: str, script: str) -> None:
    """A stand-in for a program of the cluster (nvidia-smi, srun) on PATH."""
    path = directory / name
    path.write_text("#!/bin/bash\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(
    ("gpu", "study"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-llama-1b-h100"),
        ("NVIDIA A100-SXM4-80GB", "h100-llama-1b-a100-80gb"),
        ("NVIDIA L40S", "h100-llama-1b-l40s"),
        ("Tesla T4", None),
    ],
)
def test_the_skypilot_worker_joins_the_study_of_the_gpu_it_got(
    tmp_path: Path, gpu: str, study: str | None
) -> None:
    """The task's run script, run by bash with the GPU's name as nvidia-smi gives it; the
    `sweeper` it execs prints its arguments."""
    _shim(tmp_path, "nvidia-smi", f"echo '{gpu}'\n")
    _shim(tmp_path, "sweeper", 'echo "$@"\n')
    run = yaml.safe_load((SKYPILOT / "sweeper-workers.yaml").read_text())["run"]
    done = subprocess.run(
        ["bash", "-c", run],
        cwd=REPO,
        env=dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    if study is None:
        assert done.returncode == 2 and "no study for GPU 'Tesla T4'" in done.stderr, done
        return
    assert done.returncode == 0, done.stderr
    argv = done.stdout.split()
    assert argv == [*WORKER_COMMAND[1:], f"deploy/skypilot/spaces/{study}.yaml"]
    assert load_space(REPO / argv[-1]).study == study


# SkyPilot pins click<8.2 and uvicorn<0.36, which constraints.txt's click 8.5.1 and uvicorn
# 0.54 contradict: it lives in an environment of its own, named by this variable
SKY_PYTHON = os.environ.get("SWEEPER_TEST_SKYPILOT_PYTHON")
_SKY_CHECK = """
import json, sys
sys.path.append(sys.argv[1])  # typer and rich for sweeper.cluster, after SkyPilot's own
import yaml, sky
from sweeper.cluster import time_estimator
out = {}
for name in sys.argv[2:]:
    config = yaml.safe_load(open(name))
    task = sky.Task.from_yaml_config(config, secrets_overrides=[("SWEEPER_STORAGE", "pg://x")])
    hours = {"H100": 1.5, "A100-80GB": 2.25, "L40S": 4.0}
    task.set_time_estimator(time_estimator(hours))
    out[name] = {
        "accelerators": sorted(a for r in task.resources for a in r.accelerators),
        "seconds": sorted(task.estimate_runtime(r) for r in task.resources),
        "secrets": sorted(task.secrets),
        "pool_workers": task.service.min_replicas if task.service else None,
        "recovery": [r.job_recovery for r in task.resources][0],
        "run": task.run,
    }
print(json.dumps(out))
"""


def _sky_python() -> str:
    if SKY_PYTHON:
        return SKY_PYTHON
    try:
        import sky  # noqa: F401
    except ImportError:
        pytest.skip(
            "skypilot is not installed: it pins click<8.2 and uvicorn<0.36, against this "
            "project's click 8.5.1 and uvicorn 0.54; install it in a venv of its own and set "
            "SWEEPER_TEST_SKYPILOT_PYTHON to its python"
        )
    return sys.executable


def test_skypilot_loads_the_tasks_and_takes_measured_hours_as_its_time_estimate() -> None:
    python = _sky_python()
    files = ["sweeper-workers.yaml", "sweeper-pool.yaml", "sweeper-pool-job.yaml"]
    done = subprocess.run(
        [python, "-c", _SKY_CHECK, sysconfig.get_paths()["purelib"], *files],
        cwd=SKYPILOT,
        env=dict(os.environ, PYTHONPATH=str(REPO), SKYPILOT_DISABLE_USAGE_COLLECTION="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tasks = json.loads(done.stdout.splitlines()[-1])
    for name, task in tasks.items():
        assert task["accelerators"] == ["A100-80GB", "H100", "L40S"], name
        # SkyPilot's cost of a run: the measured hours on each GPU, in seconds
        assert task["seconds"] == [5400, 8100, 14400], name
    assert tasks["sweeper-workers.yaml"]["secrets"] == list(WORKER_ENV)
    assert tasks["sweeper-pool-job.yaml"]["secrets"] == list(WORKER_ENV)
    assert tasks["sweeper-pool.yaml"]["pool_workers"] == 4
    assert tasks["sweeper-workers.yaml"]["recovery"]["recover_on_exit_codes"] == [143]


def test_time_estimator_names_an_accelerator_it_has_no_hours_for() -> None:
    class Candidate:
        accelerators = {"T4": 1}

    estimate = time_estimator({"H100": 1.0})
    with pytest.raises(Exception, match="no measured hours for {'T4': 1}; sweeper measured H100"):
        estimate(Candidate())
    assert GpuOffer(accelerator="A100-80GB", usd_per_hour=1.0).name_pattern == "*A100*80GB*"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--space", "no/such.yaml", "--gpu", "H100=2"], "no/such.yaml: cannot read space file"),
        (["--space", "BAD", "--gpu", "H100=2"], "search.attn_implementation"),
        (["--space", "TINY", "--gpu", "H100"], "--gpu 'H100': give NAME=USD_PER_HOUR"),
        (["--space", "TINY", "--gpu", "H100:2=3"], "one GPU per worker"),
        (["--space", "TINY", "--gpu", "H100=free"], "the price must be a positive number"),
        (["--space", "TINY", "--gpu", "H100=1", "--gpu", "h100=2"], "listed twice"),
        (["--space", "TINY", "--gpu", "H100=1", "--out", "/tmp/x"], "under the current one"),
    ],
)
def test_cluster_skypilot_says_what_is_wrong_in_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str], said: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY_SPACE.read_text().replace("[sdpa, eager]", "[]"))
    paths = {"TINY": str(TINY_SPACE), "BAD": str(bad)}
    done = run_sweeper("cluster", "skypilot", *[paths.get(a, a) for a in args], cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_cluster_skypilot_keeps_files_that_exist_unless_forced(tmp_path: Path) -> None:
    args = ["cluster", "skypilot", "--space", str(TINY_SPACE), "--gpu", "L4=0.7"]
    assert run_sweeper(*args, cwd=tmp_path).returncode == 0
    task = tmp_path / "skypilot" / "sweeper-workers.yaml"
    task.write_text("# mine\n")
    again = run_sweeper(*args, cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr and "Traceback" not in again.stderr
    assert task.read_text() == "# mine\n"
    assert run_sweeper(*args, "--force", cwd=tmp_path).returncode == 0
    assert "*L4*) space=skypilot/spaces/tiny-l4.yaml ;;" in task.read_text()
    assert load_space(tmp_path / "skypilot" / "spaces" / "tiny-l4.yaml").study == "tiny-l4"


def test_a_config_error_exits_2_as_the_job_fails_its_index_on(tmp_path: Path) -> None:
    """The podFailurePolicy's FailIndex code is what a worker exits with on a bad space."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY_SPACE.read_text().replace("[sdpa, eager]", "[]"))
    job = _kind("Job")["spec"]
    (fail_index,) = [r for r in job["podFailurePolicy"]["rules"] if r["action"] == "FailIndex"]
    argv, _ = _kubernetes_worker()
    done = run_sweeper(*argv[1:-1], str(bad), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.returncode in fail_index["onExitCodes"]["values"]


# --- the recipes' workers on one Postgres study --------------------------------------------


def _slurm_shims(directory: Path) -> None:
    """``srun`` as Slurm runs a one-task step here: its options dropped, the command exec'd."""
    _shim(directory, "srun", 'while [[ "$1" == -* ]]; do shift; done\nexec "$@"\n')


def _wait_until_running(store: Store, count: int, processes: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 300
    while True:
        try:
            running = store.list_trials("tiny", states=["running"])
        except (StudyNotFoundError, StorageError):  # no worker has created it yet
            running = []
        if len(running) >= count:
            return
        for process in processes:
            assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{len(running)} trial(s) running after 300 s"
        time.sleep(0.2)


def _wait_for_a_fresh_trial_of(
    store: Store, pid: int, processes: list[subprocess.Popen[str]], fresh_s: float = 1.0
) -> None:
    """Wait until the worker of process ``pid`` has a trial that started less than
    ``fresh_s`` ago: a signal sent now finds it running (its window alone outlasts that),
    not between two trials (a loaded CI machine once signalled a worker that had just
    finished one)."""
    deadline = time.monotonic() + 300
    while True:
        ids = {w.id for w, _ in store.list_workers("tiny") if w.pid == pid}
        now = datetime.now(UTC)
        for trial in store.list_trials("tiny", states=["running"]):
            started = trial.started_at
            if started is not None and started.tzinfo is None:
                started = started.replace(tzinfo=UTC)
            if trial.worker_id in ids and started and (now - started).total_seconds() < fresh_s:
                return
        for process in processes:
            assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"no fresh trial of worker pid {pid} in 300 s"
        time.sleep(0.1)


@pytest.mark.torch
@pytest.mark.postgres
def test_workers_started_as_the_recipes_start_them_share_one_study(
    tmp_path: Path,
    postgres_url: str,
    env: dict[str, str],  # noqa: F811
) -> None:
    """One worker through the Slurm script, one as the Kubernetes Job's pod runs it (its
    command, SWEEPER_STORAGE from the Secret). The Slurm one is preempted (SIGTERM): it exits
    143 within the Job's grace period, its trial is interrupted, and that config runs again
    (its replacement, the pod the Job starts again, joins the study). Meanwhile compose's
    command without --join is refused beside them, which is why the recipes pass it."""
    space = _slow_space(tmp_path, seconds=3)  # trials long enough to be caught running
    # 5 planned: a worker that joins shares the plan (b804c26), and two workers would
    # otherwise be done with 3 before the Slurm one is caught in a fresh trial
    space.write_text(space.read_text().replace("  n_trials: 3", "  n_trials: 5"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _slurm_shims(bin_dir)
    # the recipes call `sweeper` from PATH: this environment's entry point
    path = f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    worker_env = {**env, "PATH": path, "SWEEPER_STORAGE": postgres_url}
    url_file = tmp_path / "storage-url"
    url_file.write_text(postgres_url)
    slurm_env = {**env, "PATH": path, "SPACE": str(space), "STORAGE_URL_FILE": str(url_file)}
    slurm_env |= {"SLURM_SUBMIT_DIR": str(REPO), "SWEEPER_CACHE_DIR": env["SWEEPER_CACHE_DIR"]}
    kubernetes_argv = [str(space) if w == SPACE else w for w in _kubernetes_worker()[0]]
    grace_s = _kind("Job")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]

    def start(argv: list[str], environment: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            argv, env=environment, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip

    slurm = start(["bash", str(SLURM)], slurm_env)
    pod = start(kubernetes_argv, worker_env)
    replacement = None
    store = Store(postgres_url)
    try:
        _wait_until_running(store, 2, [slurm, pod])
        refused = run_sweeper(*_compose_worker()[0][1:-1], str(space), env=worker_env)
        assert refused.returncode == 2 and "--join" in refused.stderr, refused.stderr
        # the bash script exec'd srun, which exec'd sweeper: the worker's pid is slurm's
        _wait_for_a_fresh_trial_of(store, slurm.pid, [slurm, pod])
        family = psutil.Process(slurm.pid).children(recursive=True)
        sent = time.monotonic()
        slurm.send_signal(signal.SIGTERM)  # the bash script exec'd srun, which exec'd sweeper
        _, stderr = slurm.communicate(timeout=grace_s)
        took_s = time.monotonic() - sent
        assert slurm.returncode == 143, stderr[-3000:]
        assert took_s < grace_s / 2, f"{took_s:.1f} s to stop; the Job grants {grace_s} s"
        _, alive = psutil.wait_procs(family, timeout=30)
        assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
        interrupted = store.list_trials("tiny", states=["failed"])
        assert [t.failure_kind for t in interrupted] == ["interrupted"], interrupted
        replacement = start(kubernetes_argv, worker_env)
        for process in (pod, replacement):
            _, stderr = process.communicate(timeout=600)
            assert process.returncode == 0, stderr[-3000:]
        trials = store.list_trials("tiny")
        workers = store.list_workers("tiny")
    finally:
        store.dispose()
        for process in (slurm, pod, replacement):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()
    complete = [t for t in trials if t.state == "complete"]
    configs = [json.dumps(t.config, sort_keys=True) for t in complete]
    # A worker that finds a live run shares its 5 planned trials (b804c26); one that finds
    # none plans 5 of its own. Which happens depends on when each starts and ends (the pod may
    # be done before the replacement starts), so what holds either way: the plan is met (the
    # grid has 8 configs), no worker runs more than its own 5, no config runs twice, and the
    # preempted trial's config runs again (a queued retry runs beyond a shared plan).
    by_worker = [(t.number, t.state, t.worker_id) for t in trials]
    assert 5 <= len(complete) <= 8, by_worker
    assert len(workers) == 3 and all(ran <= 5 for _, ran in workers), by_worker
    assert {t.worker_id for t in complete} <= {w.id for w, _ in workers}, by_worker
    assert len(set(configs)) == len(configs), [(t.number, t.config) for t in trials]
    assert json.dumps(interrupted[0].config, sort_keys=True) in configs
    tally = tally_study(postgres_url, "tiny", "recipes' workers, one preempted", len(complete))
    assert (tally.complete, tally.interrupted, tally.lost, tally.other_failed) == (
        len(complete),
        1,
        0,
        0,
    )
    assert (tally.duplicates, tally.duplicate_numbers, tally.stuck) == (0, 0, 0), tally
    # what SkyPilot's time estimate would take from this study: its recommendation's hours
    store = Store(postgres_url)
    try:
        hours = measured_hours(store, ["tiny"])
        recommended = best(store, "tiny").hours_per_run
    finally:
        store.dispose()
    assert hours == {"CPU": recommended} and recommended and recommended > 0

    class OnThisCpu:
        accelerators = {"CPU": 1}

    assert time_estimator(hours)(OnThisCpu()) == round(recommended * 3600)
