"""sweeper installs where GPU users train: Python 3.11-3.13, next to the torch they have.

The install tests build a real wheelhouse with scripts/wheelhouse.sh (this needs the package
registry, as the script does), then install from it with no index into a fresh environment that
already holds a torch: the project's own torch, hard-linked file by file with its dependencies,
as a CUDA image holds its own. pip must use that torch as it is.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.helpers import REPO

# What a current CUDA image ships (read on the lent H100 machines, 2026-11).
GPU_IMAGE = {"python": "3.12.3", "torch": "2.11.0+cu130", "transformers": "5.17.0"}


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _dependency(name: str) -> Requirement:
    (requirement,) = [
        Requirement(r) for r in _project()["dependencies"] if Requirement(r).name == name
    ]
    return requirement


def test_ranges_admit_what_gpu_images_ship_and_never_cap_torch() -> None:
    python = SpecifierSet(_project()["requires-python"])
    assert all(v in python for v in ("3.11.7", "3.12.1", GPU_IMAGE["python"], "3.13.0"))
    assert "3.10.13" not in python
    torch = _dependency("torch").specifier
    assert torch.contains(GPU_IMAGE["torch"]) and torch.contains("2.13.0+cpu")
    assert not torch.contains("2.10.0")
    # no upper bound: pip would otherwise replace a newer torch the user already has
    assert torch.contains("2.99.0") and torch.contains("3.1.0")
    transformers = _dependency("transformers").specifier
    assert transformers.contains(GPU_IMAGE["transformers"]) and transformers.contains("5.23.0")
    assert not transformers.contains("5.16.1")
    constraints = (REPO / "constraints.txt").read_text().splitlines()
    assert "torch==2.13.0" in constraints, "CI and the demo keep the exact CPU pin"


def _distribution_closure(name: str) -> list[importlib.metadata.Distribution]:
    """``name`` and every installed distribution it needs, in this environment."""
    found: dict[str, importlib.metadata.Distribution] = {}
    pending = [name]
    while pending:
        current = pending.pop()
        dist = importlib.metadata.distribution(current)
        key = dist.metadata["Name"].lower()
        if key in found:
            continue
        found[key] = dist
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return list(found.values())


def _copy_installed(dist: importlib.metadata.Distribution, site: Path) -> None:
    """Install ``dist`` into ``site`` as pip had: its RECORDed files, hard-linked."""
    for file in dist.files or []:
        if str(file).startswith(".."):  # console scripts outside site-packages
            continue
        source = Path(str(dist.locate_file(file)))
        if not source.is_file():
            continue
        target = site / file
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:  # another filesystem
            target.write_bytes(source.read_bytes())


def _record_digest(python: Path) -> str:
    """torch's version, location and RECORD in ``python``'s environment: changes if pip
    touches it."""
    code = (
        "import importlib.metadata as m, hashlib; d = m.distribution('torch'); "
        "print(d.version, d.locate_file(''), hashlib.sha256(d.read_text('RECORD').encode())"
        ".hexdigest())"
    )
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    result = subprocess.run(
        ["bash", "scripts/wheelhouse.sh", "--python", version, "--tests", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = {p.name.split("-")[0].lower() for p in out.glob("*.whl")}
    assert {"sweeper", "optuna", "transformers", "pytest"} <= wheels
    # what gpu-record.sh installs beside: DeepSpeed built with no kernels, the levers' packages
    assert {"deepspeed", "hjson", "liger_kernel", "torchao"} <= wheels
    assert [p.name for p in out.glob("deepspeed-*.whl")][0].endswith("-py3-none-any.whl")
    assert not {w for w in wheels if w == "torch" or w.startswith(("nvidia_", "triton"))}
    return out


# what the device tool carries to a lent GPU: the working tree and the wheelhouse together
CARRY_LIMIT_BYTES = 64 * 1024**2


def test_the_gpu_wheelhouse_fits_the_carry_limit_beside_the_tree(tmp_path: Path) -> None:
    """The wheelhouse a GPU session carries (the image's Python, without what the image has,
    with DeepSpeed and the levers) and the tracked tree stay under the tool's 64 MiB, with room
    for the untracked files that travel too (8 MiB)."""
    out = tmp_path / "whl"
    result = subprocess.run(
        ["bash", "scripts/wheelhouse.sh", "--python", GPU_IMAGE["python"].rsplit(".", 1)[0],
         "--tests", "--out", str(out), "--skip-file", "scripts/gpu-image-packages.txt"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = {p.name.split("-")[0].lower(): p.stat().st_size for p in out.glob("*.whl")}
    assert {"deepspeed", "liger_kernel", "torchao", "sweeper"} <= set(wheels)
    assert "pyarrow" not in wheels and "transformers" not in wheels  # the image has them
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    tree = sum(
        (REPO / f.decode()).stat().st_size for f in tracked if f and (REPO / f.decode()).is_file()
    )
    room = 8 * 1024**2
    assert sum(wheels.values()) + tree + room < CARRY_LIMIT_BYTES, (sum(wheels.values()), tree)


@pytest.fixture
def users_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment that has torch (and only what torch needs), like a CUDA
    image before sweeper is installed. Returns its python."""
    root = tmp_path_factory.mktemp("users-env")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
    python = root / "venv" / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for dist in _distribution_closure("torch"):
        _copy_installed(dist, site)
    subprocess.run([str(python), "-c", "import torch"], check=True, timeout=120)
    return python


def _levers_space(tmp_path: Path) -> Path:
    """The tiny space searching the issue-36 levers, preflight on: as spaces/h100.yaml does."""
    text = (REPO / "tests" / "spaces" / "tiny.yaml").read_text()
    search = (
        "search:\n"
        "  precision: [fp32, fp8]\n"
        "  liger_kernel: [false, true]\n"
        "  padding_free: [false, true]\n"
    )
    text = text.replace("search:\n", search).replace(
        "compile_mode: [none]", "compile_mode: [none, reduce-overhead]"
    )
    text = text.replace("preflight: false", "preflight: true")
    path = tmp_path / "tiny-levers.yaml"
    path.write_text(text)
    return path


def test_gpu_record_script_runs_end_to_end(
    wheelhouse: Path, users_env: Path, tmp_path: Path, cache_dir: Path
) -> None:
    """The GPU session's one command, on this CPU with the tiny space and the levers: it
    installs sweeper from the wheelhouse with no index next to the user's torch (pip must not
    plan to install torch, and torch's RECORD must not change), DeepSpeed and the levers'
    packages, runs doctor, the GPU tests (the levers' first; skipped here), a sweep, fidelity
    and the summary (verdicts, MFU against the goal) into one folder. On this CPU preflight
    drops Liger, fp8 and reduce-overhead for the CPU, though torchao imports. A lent GPU is
    rare: the script must not be what fails there."""
    torch_before = _record_digest(users_env)
    out = tmp_path / "record"
    space = _levers_space(tmp_path)
    env = {
        **os.environ,
        "PYTHON": str(users_env),
        "SWEEPER_CACHE_DIR": str(cache_dir),
        "PATH": f"{users_env.parent}:{os.environ['PATH']}",
    }
    env.pop("SWEEPER_STORAGE", None)
    result = subprocess.run(
        [
            "bash",
            "scripts/gpu-record.sh",
            "run",
            "--wheelhouse",
            str(wheelhouse),
            "--out",
            str(out),
            "--minutes",
            "8",
            "--space",
            str(space),
            "--study",
            "tiny",
            "--fidelity-configs",
            "best,baseline",
            # recorded as on an H200 of the catalog (its name and price): --gpu's twin
            "--gpu",
            "h200-sxm",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + log
    assert (out / "status").read_text().strip() == "done"
    assert (out / "torch-before.txt").read_text() == (out / "torch-after.txt").read_text()
    assert _record_digest(users_env) == torch_before, "installing sweeper changed torch"
    help_text = subprocess.run(
        [str(users_env.parent / "sweeper"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # the installed package, not this checkout
    )
    assert help_text.returncode == 0 and "doctor" in help_text.stdout, help_text.stderr
    report = json.loads((out / "pip-report.json").read_text())
    planned = {i["metadata"]["name"].lower() for i in report["install"]}
    assert "torch" not in planned and "sweeper" in planned
    doctor = json.loads((out / "doctor.json").read_text())
    twin = out / "space.yaml"
    assert f"{twin}: {space} on h200-sxm, study tiny" in log, log
    assert doctor["exit_code"] == 0 and doctor["space"] == str(twin), doctor
    # the levers' packages installed (liger-kernel without triton cannot import on a CPU
    # torch); preflight drops the CUDA levers for the device, not for a missing package
    assert "install: torchao 0.18.0 imports" in log, log
    assert "install: liger_kernel.transformers" in log and "triton" in log, log
    dropped = doctor["preflight"]["dropped"]
    for knob, value in (("precision", "fp8"), ("liger_kernel", "True")):
        assert "the trial device is the CPU" in dropped[knob][value], dropped
    assert "CUDA graphs" in dropped["compile_mode"]["reduce-overhead"], dropped
    assert "padding_free" not in dropped
    said = [f["text"] for f in doctor["findings"] if f["level"] == "warning"]
    for lever in ("precision: fp8", "liger_kernel: True", "compile_mode: reduce-overhead"):
        assert any(t.startswith(f"search.{lever} cannot run here") for t in said), said
    levers_tests = (out / "gpu-levers-tests.log").read_text()
    assert "tests: levers exit 0;" in log and "skipped" in levers_tests.splitlines()[-1]
    gpu_tests = (out / "gpu-tests.log").read_text()
    assert "tests: exit 0;" in log and "error" not in gpu_tests.splitlines()[-1], gpu_tests[-3000:]
    study = json.loads((out / "tiny.json").read_text())
    assert study["format"] == "sweeper-study" and study["trials"]
    assert study["study"]["hardware_name"] == "H200 SXM 141GB"
    assert study["study"]["usd_per_hour"] == 3.5
    fidelity = (out / "fidelity.md").read_text()
    assert "Fidelity: trial vs a run 10x longer" in fidelity
    table = fidelity.split("Fidelity: trial vs a run 10x longer")[1].split("###")[0]
    summary = (out / "summary.md").read_text()
    # the recommendation and the baseline (trial #0), one row each; one row when they are the
    # same config (3-step windows tie, and among ties the baseline's batch 2 needs least memory)
    same = "| **recommended** | #0 |" in summary
    assert table.count("| bs") == (1 if same else 2), (table, summary)
    for part in ("Named configs side by side", "**recommended**", "Every trial", "sweeper doctor"):
        assert part in summary
    assert "| **recommended** | #" in summary  # a measured row, not "not run"
    # every named config ran first and is found among trials (doctor's lines may say what
    # "cannot run here")
    assert "| not run" not in summary
    verdicts = summary.split("Each knob's verdict at the recommendation")[1]
    assert "| knob | value | recommended |" in verdicts
    # a CPU has no peak: no MFU, said so (a GPU's line reads 'MFU on real tokens ... goal')
    assert "no MFU (no peak for this device)" in verdicts, verdicts


def test_gpu_record_wait_brings_back_what_is_there_while_the_run_goes_on(tmp_path: Path) -> None:
    """A lease can end before the run: `wait` packs the folder as it is into $OUT each time it
    returns, running (exit 3) or ended (on the H200 of 2026-11-28 a timed-out wait would have
    brought back nothing)."""
    out, returned = tmp_path / "record", tmp_path / "OUT"
    out.mkdir()
    returned.mkdir()
    (out / "log.txt").write_text("[00:00:00] sweep: spaces/h100.yaml for at most 7.0 min\n")
    (out / "study.db").write_bytes(b"trials so far")
    (out / "study.db-wal").write_bytes(b"in flight")
    env = {**os.environ, "OUT": str(returned)}
    args = ["bash", "scripts/gpu-record.sh", "wait", "--out", str(out), "--seconds", "1"]
    running = subprocess.run(args, cwd=REPO, capture_output=True, text=True, env=env, timeout=60)
    assert running.returncode == 3 and "still running" in running.stdout, running
    with tarfile.open(returned / "gpu-record.tgz") as packed:
        names = {Path(n).name for n in packed.getnames()}
    assert {"log.txt", "study.db"} <= names and "study.db-wal" not in names
    (out / "status").write_text("done\n")
    (out / "summary.md").write_text("# summary\n")
    ended = subprocess.run(args, cwd=REPO, capture_output=True, text=True, env=env, timeout=60)
    assert ended.returncode == 0, ended
    assert (returned / "summary.md").read_text() == "# summary\n"
