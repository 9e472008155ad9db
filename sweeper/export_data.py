"""The data part of the Trainer, SFT and DataLoader exports: the tokenizer and the data as
the space names them, each sample cut as the trials cut it, and a collate that pads each batch
as the engine padded it (``workload.padding``), or the packed blocks. Split from
``sweeper.export``."""

from __future__ import annotations

from typing import Any

from sweeper import knobs
from sweeper.errors import SpaceError
from sweeper.job import CHATML, Workload
from sweeper.space import Space, parse_space

_BUILDERS = (
    ((".jsonl", ".json", ".jsonl.gz", ".json.gz"), "json"),
    ((".parquet",), "parquet"),
    ((".csv", ".csv.gz"), "csv"),
    ((".txt", ".txt.gz"), "text"),
)


def space_of(space_yaml: str) -> Space | None:
    try:
        return parse_space(space_yaml)
    except SpaceError:
        return None


def padded_to_max(config: dict[str, Any], space_yaml: str) -> bool:
    """Whether the trials padded every (unpacked, not padding-free) batch to max_seq_length:
    the loop and Trainer engines pad as ``workload.padding`` says (its default: max_length);
    SFTTrainer's collator pads each batch to its longest sample, and a script pads its own
    way (the trainer and dataloader exports then pad to the longest too)."""
    if config.get("packing") or config.get("padding_free"):
        return False
    space = space_of(space_yaml)
    if space is None:
        return Workload.model_fields["padding"].default == "max_length"
    return space.workload.engine in ("loop", "trainer") and space.workload.padding == "max_length"


def _tokenizer_source(space: Space) -> str | None:
    """Where the trials' tokenizer loads from: workload.tokenizer.id, else the model's own;
    None for a model built from an architecture (sweeper trained its tokenizer)."""
    return space.workload.tokenizer.id or space.workload.model.id


def _template_line(space: Space) -> list[str]:
    """The chat template the trials rendered chat records with, where the space set one."""
    template = space.workload.tokenizer.chat_template
    if space.workload.dataset.messages_field is None or template is None:
        return []
    return [
        "tokenizer.chat_template = "
        + (repr(CHATML) if template == "chatml" else repr(template))
        + "  # the template the trials rendered with (workload.tokenizer.chat_template)"
    ]


def _load_lines(space: Space) -> list[str]:
    """``dataset = ...``: the space's data file (or save_to_disk directory) as rows."""
    spec = space.workload.dataset
    assert spec.path is not None
    builder = next((b for ends, b in _BUILDERS if spec.path.lower().endswith(ends)), None)
    if builder is None:  # a save_to_disk directory
        return [
            f"dataset = load_from_disk({spec.path!r})",
            f"dataset = dataset[{spec.split!r}] if hasattr(dataset, 'keys') else dataset",
        ]
    return [f"dataset = load_dataset({builder!r}, data_files={spec.path!r}, split='train')"]


def sft_data_lines(space_yaml: str, replies: bool = False) -> str:
    """The tokenizer and the space's data as SFTTrainer takes them: chat records from a
    'messages' column (renamed from the space's messages_field) where ``replies``
    (assistant_only_loss), else, for an sft study, rendered to text with the chat template as
    the trial handed them to SFTTrainer (which then closes a text with EOS unless it ends
    with it: a chat record SFTTrainer renders itself gets none); plain text from
    dataset_text_field; the chat template the trials rendered with, where the space set one.
    Without a dataset path in the space, a line to fill in."""
    space = space_of(space_yaml)
    tokenizer_id = None if space is None else space.workload.tokenizer.id
    lines = [
        "from transformers import AutoTokenizer",
        "",
        "tokenizer = AutoTokenizer.from_pretrained("
        + (repr(tokenizer_id) if tokenizer_id else "MODEL_ID")
        + ")",
    ]
    spec = space.workload.dataset if space is not None else None
    if space is None or spec is None or spec.path is None:
        lines.append("# dataset = load_dataset(...)  # your training data")
        return "\n".join(lines) + "\n"
    lines[0:0] = ["from datasets import load_dataset, load_from_disk"]
    lines += _template_line(space)
    lines += _load_lines(space)
    if spec.messages_field is not None and not replies and space.workload.engine == "sft":
        lines += [
            "dataset = dataset.map(  # rendered as the trials rendered it for SFTTrainer, which "
            "then",
            "    # closes each text with its EOS unless it ends with it, as in the trials",
            "    lambda row: {'text': tokenizer.apply_chat_template("
            f"row[{spec.messages_field!r}], tokenize=False)}},",
            "    remove_columns=dataset.column_names,",
            ")",
        ]
    elif spec.messages_field is not None and spec.messages_field != "messages":
        lines.append(
            f"dataset = dataset.rename_column({spec.messages_field!r}, 'messages')"
            "  # SFTTrainer reads chat records from 'messages'"
        )
    elif spec.messages_field is None and spec.text_field != "text":
        lines.append(
            f"sft_config.dataset_text_field = {spec.text_field!r}  # the space's text_field"
        )
    return "\n".join(lines) + "\n"


_TOKENIZE = '''

def tokenize(tokenizer, text, max_length={length}):
    """One sample as the trials read it: its token ids (no special tokens added) cut so that
    with the EOS that closes it they are at most max_length (max_seq_length)."""
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    cut = tokenizer(
        text, add_special_tokens=False, truncation=True, max_length=max_length - len(eos)
    )
    return {{"input_ids": cut["input_ids"] + eos}}
'''

# packing: each sample whole, closed by its EOS (sweeper.trial.workload's PackedStream)
_TOKENIZE_WHOLE = '''

def tokenize(tokenizer, text):
    """One sample as the trials packed it: its token ids (no special tokens added), whole,
    and the EOS that closes it."""
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    return {{"input_ids": tokenizer(text, add_special_tokens=False)["input_ids"] + eos}}
'''

_PACK = '''

def pack(rows, block={block}):
    """Whole samples (each closed by EOS) concatenated and cut into {block}-token blocks, as
    the trials packed them: no padding, and a long sample continues in the next block
    instead of being cut. For dataset.map(pack, batched=True): the tokens of each batch of
    rows that fill no whole block are dropped."""
    ids = [token for row in rows["input_ids"] for token in row]
    own = rows["labels"] if "labels" in rows else rows["input_ids"]
    labels = [token for row in own for token in row]
    whole = len(ids) // block * block
    return {{
        "input_ids": [ids[i : i + block] for i in range(0, whole, block)],
        "labels": [labels[i : i + block] for i in range(0, whole, block)],
    }}


def collate(rows):
    """Packed blocks are full: no padding; each block's labels are its own (every token, or
    the replies only)."""
    ids = torch.tensor([row["input_ids"] for row in rows], dtype=torch.long)
    labels = torch.tensor([row["labels"] for row in rows], dtype=torch.long)
    return {{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}}
'''

# engine: sft: SFTTrainer tokenized the rendered text itself (sweeper.trial.engines.trainer's
# train_sft; TRL's SFTTrainer._prepare_dataset): it appends the EOS to a text that does not
# already end with it (a chat text ending in EOS and a newline, as ChatML's, gets a second
# one), tokenizes it with the tokenizer's special tokens and keeps its first max_length tokens
_TOKENIZE_SFT = '''

def tokenize(tokenizer, text, max_length={length}):
    """One sample as SFTTrainer read it in the trials: the EOS appended to the text unless
    the text already ends with it (one ending in EOS and a newline gets a second one), its
    token ids with the tokenizer's special tokens, the first max_length (max_seq_length) of
    them kept: a longer sample loses its end, EOS included."""
    eos = tokenizer.eos_token
    if eos is not None and not text.endswith(eos):
        text += eos
    return {{"input_ids": tokenizer(text)["input_ids"][:max_length]}}
'''

_TOKENIZE_SFT_WHOLE = '''

def tokenize(tokenizer, text):
    """One sample as SFTTrainer packed it in the trials: the EOS appended to the text unless
    the text already ends with it (one ending in EOS and a newline gets a second one), and
    its token ids, whole, with the tokenizer's special tokens."""
    eos = tokenizer.eos_token
    if eos is not None and not text.endswith(eos):
        text += eos
    return {{"input_ids": tokenizer(text)["input_ids"]}}
'''

# loss: completion: the trials' labels were the tokens starting inside an assistant's reply
# (sweeper.trial.corpus.render_chat and completion_mask), and the EOS that closes the sample
_REPLIES_HEAD = '''

def tokenize_replies(tokenizer, messages{limit}):
    """One chat record as the trials read it, the loss on the assistant's replies only
    (dataset.loss: completion): rendered with the chat template, {cut}, and 'labels' -100 on
    every token that does not start inside a reply (a reply: what rendering the record up
    to it adds to the prompt before it); the EOS is a label."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    replies = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            before = tokenizer.apply_chat_template(
                messages[:i], tokenize=False, add_generation_prompt=True
            ) if i else ""
            upto = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
            replies.append((len(before), len(upto)))
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    cut = tokenizer(
        text, add_special_tokens=False, {truncation}return_offsets_mapping=True,
    )
    labels = [
        token if any(start <= begin < end for start, end in replies) else -100
        for token, (begin, _) in zip(cut["input_ids"], cut["offset_mapping"])
    ]
'''

# how tokenize_replies cuts a sample: sweeper's engines (and SFTTrainer padding-free) cut the
# text's tokens to leave room for the EOS; SFTTrainer unpacked kept the first max_length
# tokens of the whole sample and its EOS; packed, nothing is cut
_REPLIES_CUTS = {
    "cut": (
        ", max_length={length}",
        "its token ids cut so that\n    with the EOS that closes it they are at most max_length",
        "truncation=True, max_length=max_length - len(eos),\n        ",
        '    return {{"input_ids": cut["input_ids"] + eos, "labels": labels + eos}}\n',
    ),
    "keep_start": (
        ", max_length={length}",
        "its token ids and\n    the EOS that closes them, the first max_length kept (as SFTTrainer "
        "cut them)",
        "",
        '    return {{\n        "input_ids": (cut["input_ids"] + eos)[:max_length],\n'
        '        "labels": (labels + eos)[:max_length],\n    }}\n',
    ),
    "whole": (
        "",
        "its token ids whole\n    with the EOS that closes it",
        "",
        '    return {{"input_ids": cut["input_ids"] + eos, "labels": labels + eos}}\n',
    ),
}


def _tokenize_replies(length: int, how: str) -> str:
    """The exported ``tokenize_replies``, cutting as ``_REPLIES_CUTS[how]`` says."""
    limit, cut, truncation, ret = _REPLIES_CUTS[how]
    head = _REPLIES_HEAD.format(limit=limit.format(length=length), cut=cut, truncation=truncation)
    return head + ret.format()


_PADDED = '''

class Padded:
    """Batches padded as the trials padded theirs: {how}. The pads are masked out of
    attention and of the loss (labels -100); a sample's own 'labels' (-100 where it is not
    trained) are kept."""

    def __init__(self, pad_id, width={width}):
        self.pad_id, self.width = pad_id, width

    def __call__(self, rows):
        rows = [row if isinstance(row, dict) else {{"input_ids": row}} for row in rows]
        width = self.width or max(len(row["input_ids"]) for row in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        labels = torch.full_like(input_ids, -100)
        for i, row in enumerate(rows):
            ids = list(row["input_ids"])[:width]
            input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, : len(ids)] = 1
            own = row.get("labels")
            labels[i, : len(ids)] = torch.tensor(
                ids if own is None else list(own)[:width], dtype=torch.long
            )
        return {{"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}}
'''


def _padding_why(config: dict[str, Any], space_yaml: str) -> str:
    """How the trials padded an unpacked batch, as the exports say it."""
    length = config["max_seq_length"]
    if padded_to_max(config, space_yaml):
        return f"every batch padded to {length} tokens (workload.padding: max_length)"
    space = space_of(space_yaml)
    engine = None if space is None else space.workload.engine
    if engine == "sft":
        return "each batch padded to its longest sample, as SFTTrainer's collator padded them"
    if engine == "script":
        return "each batch padded to its longest sample (your script's trials padded their own way)"
    return "each batch padded to its longest sample (workload.padding: longest)"


def data_lines(config: dict[str, Any], space_yaml: str, loss_labels: str | None = None) -> str:
    """The samples and their batches as the trials made them, for the Trainer and DataLoader
    exports: ``tokenize`` (token ids without special tokens, cut at max_seq_length with the
    EOS that closes them: sweeper.trial.workload's datasets; whole when packed), ``collate``
    (padded as the trial's engine padded, ``Padded``; or padding-free, flattened; or packed
    blocks, ``pack``), the tokenizer and the space's data file tokenized, where the space
    names them."""
    length = config["max_seq_length"]
    space = space_of(space_yaml)
    flattened = knobs.code_lines(config, "collate_fn")  # padding-free
    packed = bool(config.get("packing"))
    replies = _replies(space, loss_labels)
    # SFTTrainer tokenized an sft trial's text itself, unless the engine handed it token ids
    # cut as sweeper's own engines cut them (padding-free)
    trl = space is not None and space.workload.engine == "sft" and not flattened
    closed = (
        "each closed by its EOS unless its text ends with it, as SFTTrainer closed them"
        if trl
        else "each closed by its EOS"
    )
    lines = [
        f"# packing: the samples tokenized whole, {closed},",
        f"# concatenated and split into {length}-token blocks (max_seq_length), as the trials "
        "packed them",
    ]
    if not packed:
        lines = [
            f"# the samples as the trials read them: tokenized, cut at {length} tokens "
            "(max_seq_length)",
            "# with the EOS that closes each; "
            + (
                "the batches padding-free (see above)"
                if flattened
                else _padding_why(config, space_yaml)
            ),
        ]
        if trl:
            lines[:1] = [
                f"# the samples as SFTTrainer read them in the trials: its first {length} tokens "
                "(max_seq_length)",
                "# kept, "
                + (
                    "the EOS that closes each a label"
                    if replies
                    else "the EOS appended unless the text ends with it"
                ),
            ]
            lines[-1] = "# " + _padding_why(config, space_yaml)
    lines += ["import torch", ""]
    if trl and not replies:
        code = _TOKENIZE_SFT_WHOLE.format() if packed else _TOKENIZE_SFT.format(length=length)
    else:
        code = _TOKENIZE_WHOLE.format() if packed else _TOKENIZE.format(length=length)
    if replies:
        how = "whole" if packed else "keep_start" if trl else "cut"
        code += _tokenize_replies(length, how)[1:]
    if packed:
        code += _PACK.format(block=length)
    elif not flattened:
        width = length if padded_to_max(config, space_yaml) else None
        how = (
            f"every row to width={length}\n    tokens (max_seq_length; None: to the batch's "
            "longest row)"
            if width
            else "each batch to its longest\n    row (width=None; a number: every row to it)"
        )
        code += _PADDED.format(width=width, how=how)
    lines += code.split("\n")[1:]
    source = None if space is None else _tokenizer_source(space)
    collate = flattened[0] if flattened else "Padded(pad_id=tokenizer.pad_token_id)"
    packing = ["dataset = dataset.map(pack, batched=True, remove_columns=dataset.column_names)"]
    if source is None:
        yours = (
            "# dataset = [tokenize_replies(tokenizer, messages) for messages in chats]"
            "  # your chat records"
            if replies
            else "# dataset = [tokenize(tokenizer, text) for text in texts]  # your training data"
        )
        lines += [
            "",
            "# tokenizer = AutoTokenizer.from_pretrained(...)  # the tokenizer you train with",
        ]
        if packed:
            lines += [
                yours.replace(
                    "# dataset = [", "# dataset = datasets.Dataset.from_list([", 1
                ).replace("]  #", "])  #", 1),
                *packing,
            ]
            return "\n".join(lines) + "\n"
        lines += [
            yours,
            f"collate = {collate}"
            if flattened
            else "collate = Padded(pad_id=0)  # your tokenizer's pad_token_id (the pads are "
            "masked: any id runs the same)",
        ]
        return "\n".join(lines) + "\n"
    assert space is not None
    lines += [
        "",
        "from transformers import AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({source!r})",
        *_template_line(space),
        "if tokenizer.pad_token is None:  # as the trials did",
        "    tokenizer.pad_token = tokenizer.eos_token",
    ]
    if not packed:
        lines.append(f"collate = {collate}")
    spec = space.workload.dataset
    if spec.path is None:
        if packed:
            lines += [
                "# dataset = datasets.Dataset.from_list([tokenize(tokenizer, text) for text "
                "in texts])  # your training data",
                *packing,
            ]
            return "\n".join(lines) + "\n"
        lines.append(
            "# dataset = [tokenize(tokenizer, text) for text in texts]  # your training data"
        )
        return "\n".join(lines) + "\n"
    text = (
        f"tokenizer.apply_chat_template(row[{spec.messages_field!r}], tokenize=False)"
        if spec.messages_field is not None
        else f"row[{spec.text_field!r}]"
    )
    call = (
        f"tokenize_replies(tokenizer, row[{spec.messages_field!r}])"
        if replies
        else f"tokenize(tokenizer, {text})"
    )
    lines += [
        "from datasets import load_dataset, load_from_disk",
        "",
        *_load_lines(space),
        "dataset = dataset.map(",
        f"    lambda row: {call},"
        + ("  # the loss on the replies only, as measured" if replies else ""),
        "    remove_columns=dataset.column_names,",
        ")",
        *(packing if packed else []),
    ]
    if trl and replies and not packed:
        lines += [
            "dataset = dataset.filter(  # as SFTTrainer dropped a record cut before its reply",
            "    lambda row: any(label != -100 for label in row['labels'])",
            ")",
        ]
    return "\n".join(lines) + "\n"


def _replies(space: Space | None, loss_labels: str | None = None) -> bool:
    """Whether the trials took the loss on the assistant's replies only (loss: completion,
    chat records), unless they recorded training on every token (``loss_labels``: an sft
    trial whose chat template has no {% generation %} markers); and where they recorded the
    replies only whatever the space says (a script of the user's that masks its prompts)."""
    if space is None or loss_labels == "all":
        return False
    spec = space.workload.dataset
    if loss_labels == "replies" and spec.messages_field is not None:
        return True
    return spec.loss == "completion" and spec.messages_field is not None
