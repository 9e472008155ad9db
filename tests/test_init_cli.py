"""``sweeper init`` where no one can answer a question (a script, CI, a pipe): a missing
option is said by its name with exit 2, not a question read from EOF and 'Aborted.'; nothing
is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, make_tiny_job


def test_init_without_a_terminal_names_the_missing_option(tmp_path: Path) -> None:
    data = tmp_path / "chats.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    data.write_text(json.dumps(chat) + "\n")
    out = tmp_path / "mine.yaml"
    ran = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "init", "--model", "org/m", "--data", str(data),
         "--out", str(out)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "Missing option '--price'" in ran.stderr and "Aborted" not in ran.stderr
    assert not out.exists()


def _init(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    ran = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "init", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "COLUMNS": "400", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    return ran, " ".join((ran.stdout + ran.stderr).split())


def test_init_writes_the_space_of_ones_own_script_from_its_command(tmp_path: Path) -> None:
    """A walk's `init --engine script` was refused, pointed at --engine loop (for a Trainer
    script): init has the model, the data and the price, and now the command too."""
    from sweeper.space import load_space

    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"text": "hello"}) + "\n")
    base = ["--model", "org/m", "--data", str(data), "--price", "1", "--engine", "script"]
    out = tmp_path / "spaces" / "mine.yaml"
    ran, said = _init(tmp_path, *base, "--out", str(out))  # no command: said how
    assert ran.returncode == 2 and "Traceback" not in said and not out.exists(), said
    assert "--engine script needs your run's own command: --command 'python train.py" in said
    assert "README: 'Your own training script as the trial'" in said
    for example in ("examples/trainer/space.yaml", "examples/amp_loop/space.yaml"):
        assert example in said and (REPO / example).is_file()
    command = "python train.py --model_name_or_path org/m --output_dir 'my out' --bf16 True"
    ran, said = _init(tmp_path, *base, "--command", command, "--knobs", "sft_flags",
                      "--out", str(out))  # fmt: skip
    # a script that is not where the command runs: said now, not by doctor later (a walk)
    assert ran.returncode == 2 and not out.exists(), said
    assert f"--command: train.py is not a file in {tmp_path}, where the command will run" in said
    (tmp_path / "train.py").write_text("import sweeper\n")
    ran, said = _init(tmp_path, *base, "--command", command, "--knobs", "sft_flags",
                      "--out", str(out))  # fmt: skip
    assert ran.returncode == 0, said
    assert "add sweeper's one line to your script: callbacks=[sweeper.callback()] in" in said
    # a script that has the line already is not told to add it (a walk's train.py was)
    (tmp_path / "train.py").write_text("import sweeper\n\nCALLBACKS = [sweeper.callback()]\n")
    ran, said = _init(tmp_path, *base, "--command", command, "--knobs", "sft_flags",
                      "--out", str(out), "--force")  # fmt: skip
    assert ran.returncode == 0, said
    assert "your command is the trial: train.py already calls sweeper's recorder" in said, said
    assert "add sweeper's one line" not in said
    space = load_space(out)
    script = space.workload.script
    assert space.workload.engine == "script" and script is not None
    assert script.command == ["python", "train.py", "--model_name_or_path", "org/m",
                              "--output_dir", "my out", "--bf16", "True"]  # fmt: skip
    assert script.knobs == "sft_flags" and script.cwd == str(tmp_path)  # runs where it was said
    assert space.search.values("precision") == ["bf16"]  # from the command's words
    for wrong, words in (
        (["--knobs", "argv"], "--knobs argv: use flags, sft_flags or env"),
        (["--command", "python 'train.py"], '--command "python \'train.py": No closing quotation'),
    ):
        ran, said = _init(tmp_path, *base, "--command", "python t.py", *wrong, "--out",
                          str(tmp_path / "x.yaml"))  # fmt: skip
        assert ran.returncode == 2 and words in said and "Traceback" not in said, said
    ran, said = _init(tmp_path, "--model", "org/m", "--data", str(data), "--price", "1",
                      "--command", "python t.py", "--out", str(tmp_path / "x.yaml"))  # fmt: skip
    assert ran.returncode == 2 and "--command is your own program's (--engine script)" in said
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.torch  # transformers writes the tokenizer and the config, as save_pretrained does
def test_init_refuses_chat_records_for_a_tokenizer_without_a_chat_template(
    tmp_path: Path,
) -> None:
    """A model directory whose tokenizer has no chat template, with chat data: the sweep's
    prepare step stops on it ('the tokenizer has no chat template'), so init says so before it
    writes the space, and writes it once the tokenizer carries one."""
    from transformers import AutoTokenizer, GPT2Config

    from sweeper.trial.corpus import CHATML, train_tokenizer

    model = tmp_path / "model"
    train_tokenizer(["hello there, how are you?", "fine, thank you."] * 50, 300, model)
    GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=300).save_pretrained(model)
    data = tmp_path / "chats.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    data.write_text(json.dumps(chat) + "\n")
    out = tmp_path / "mine.yaml"
    command = [sys.executable, "-m", "sweeper.cli", "init", "--model", str(model), "--data",
               str(data), "--price", "1", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "COLUMNS": "300"}
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert f"--model {model}: its tokenizer has no chat template" in ran.stderr, ran.stderr
    assert "workload.tokenizer.chat_template" in ran.stderr
    assert not out.exists()

    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(model)
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "messages_field: messages" in out.read_text()
    assert "set workload.dataset.loss: completion in" in " ".join(ran.stdout.split())


def test_init_refuses_a_misspelt_relative_model_directory(tmp_path: Path) -> None:
    """`--model job/modle` beside job/model was written as a hub id (exit 0); offline, the
    sweep's prepare step failed on it much later. "job" is a directory here: it is a path."""
    (tmp_path / "job" / "model").mkdir(parents=True)
    (tmp_path / "job" / "model" / "config.json").write_text("{}")
    data = tmp_path / "job" / "chats.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    data.write_text(json.dumps(chat) + "\n")
    env = {**os.environ, "COLUMNS": "300", "PYTHONPATH": str(REPO)}
    for model, said in (
        ("job/modle", "--model job/modle: no such directory (did you mean job/model?); job is "
         "a directory here, so this reads as a path, not a hub id"),
        ("a/b/c", "--model a/b/c: no such directory on this machine, and a hub id has one slash"),
    ):  # fmt: skip
        out = tmp_path / "mine.yaml"
        ran = subprocess.run(
            [sys.executable, "-m", "sweeper.cli", "init", "--model", model, "--data", str(data),
             "--price", "1", "--device", "cpu", "--out", str(out)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
            cwd=tmp_path, env=env,
        )  # fmt: skip
        assert ran.returncode == 2, ran.stdout + ran.stderr
        assert said in " ".join(ran.stderr.split()), ran.stderr
        assert "Traceback" not in ran.stderr and not out.exists()


def test_init_lora_writes_the_adapter_and_the_base_s_quantization(tmp_path: Path) -> None:
    """Seed 003's QLoRA run (SFTTrainer, LoRA on a 4-bit NF4 base) had no way to get its
    adapter from init: `--lora` writes workload.adapter, `--quantization 4bit` the base as the
    run loads it; what a space cannot hold is refused by name, exit 2, nothing written."""
    from sweeper.space import load_space

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"text": "hello"}) + "\n" + json.dumps({"text": "there"}) + "\n")
    base = ["--model", "org/m", "--data", str(data), "--price", "2.5"]
    out = tmp_path / "spaces" / "qlora.yaml"
    ran, said = _init(tmp_path, *base, "--lora", "--quantization", "4bit", "--out", str(out))
    assert ran.returncode == 0, said
    assert f"set your run's under workload.adapter in {out}" in said
    space = load_space(out)
    adapter = space.workload.adapter
    assert adapter is not None and space.workload.engine == "sft"
    assert (adapter.r, adapter.alpha, adapter.dropout, adapter.target_modules) == (
        16, 32, 0.05, "all-linear",
    )  # fmt: skip
    assert space.search.values("quantization") == ["4bit"]
    assert space.search.values("per_device_batch_size") == [4, 8, 16]  # the defaults stay
    # --lora alone: the adapter on the base as it is (no search: section)
    plain = tmp_path / "lora.yaml"
    ran, said = _init(tmp_path, *base, "--engine", "trainer", "--lora", "--out", str(plain))
    assert ran.returncode == 0, said
    assert load_space(plain).workload.adapter is not None
    assert "\nsearch:" not in plain.read_text()
    (tmp_path / "train.py").write_text("import sweeper\n")
    for wrong, words in (
        (["--quantization", "4bit"], "--quantization 4bit: quantized base weights cannot be "
         "trained directly, only a LoRA adapter on them (QLoRA); add --lora"),
        (["--lora", "--quantization", "nf4"], "--quantization nf4: use none, 4bit or 8bit"),
        (["--lora", "--engine", "script", "--command", "python train.py"],
         "--lora: with --engine script your program builds its own model and adapter"),
    ):  # fmt: skip
        bad = tmp_path / "bad.yaml"
        ran, said = _init(tmp_path, *base, *wrong, "--out", str(bad))
        assert ran.returncode == 2 and words in said and "Traceback" not in said, said
        assert not bad.exists()


@pytest.mark.torch  # doctor loads the tiny model and counts the adapter peft builds on it
def test_init_lora_space_trains_an_adapter_on_the_tiny_job(tmp_path: Path) -> None:
    job = tmp_path / "job"
    make_tiny_job(job, 60)
    out = tmp_path / "lora.yaml"
    ran, said = _init(tmp_path, "--model", str(job / "model"), "--data", str(job / "chats.jsonl"),
                      "--price", "0.1", "--hardware", "CPU", "--device", "cpu", "--lora",
                      "--out", str(out))  # fmt: skip
    assert ran.returncode == 0, said
    doctor = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "doctor", "--space", str(out), "--json",
         "--write-mb", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert doctor.returncode == 0, doctor.stdout[-2000:] + doctor.stderr[-2000:]
    model = json.loads(doctor.stdout)["facts"]["model"]
    # only the adapter trains: fewer parameters than the base holds
    assert 0 < model["trainable"] < model["params"], model
