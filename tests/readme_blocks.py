"""The fenced blocks of the READMEs, as `test_readme_blocks.py` runs them.

The rule (also in docs/architecture.md, "Tests"): a fence runs when its language is `bash`,
`sh` or `console`. A `bash`/`sh` block is a script: every line is run. A `console` block is a
transcript: its lines starting with `$ ` (and the lines that continue them with a trailing
backslash) are run, every other line is sample output and is not compared. Any other fence
(`text`, `toml`, `python`, or no language) is never run; a block with no language that starts
with a command (`$ `, or one of the repository's commands) is an error, so a command block
cannot stay untested by forgetting its language.

A block that cannot run in a test carries the line `<!-- readme-test: skip: REASON -->` right
before its fence; the test reports it as a skip with REASON. A marker without a reason, or one
not followed by a fence, is an error.

Blocks run as written, except for the substitutions in `SHRINK_RULES`, which shorten what
would take minutes: the only edits between what a user reads and what the test runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUN_LANGUAGES = {"bash", "sh", "console"}
_FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*readme-test:(.*?)-->\s*$")
# the first word of a line that makes an untagged block a command block
_COMMANDS = ("$ ", "dataprep ", "trainer ", "inspect-data ", "make ", "python ", "pip ",
             "torchrun ", "source ")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and its skip reason (if any)."""

    readme: str       # path relative to the repository root
    line: int         # 1-based line of the opening fence
    language: str
    text: str
    skip: str | None

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES

    @property
    def where(self) -> str:
        return f"{self.readme}:{self.line}"


def parse_readme(path: Path, root: Path) -> tuple[list[Block], list[str]]:
    """The fenced blocks of one README in order, and the problems of its markers and fences
    (each `README:LINE: what`)."""
    name = str(path.relative_to(root))
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    pending: tuple[int, str] | None = None  # (line, reason) of a marker waiting for its fence
    i = 0
    while i < len(lines):
        marker = _MARKER.match(lines[i].strip())
        fence = _FENCE.match(lines[i])
        if marker:
            if pending:
                problems.append(f"{name}:{pending[0]}: readme-test marker not followed by a fence")
            pending = _parse_marker(name, i + 1, marker.group(1), problems)
            i += 1
            continue
        if not fence:
            if pending and lines[i].strip():
                problems.append(f"{name}:{pending[0]}: readme-test marker not right before a "
                                "fence")
                pending = None
            i += 1
            continue
        close = fence.group(1)
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith(close):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            problems.append(f"{name}:{start + 1}: fence never closed")
        i += 1
        block = Block(name, start + 1, fence.group(2).lower(), "\n".join(body) + "\n",
                      pending[1] if pending else None)
        pending = None
        if block.skip is not None and not block.runs:
            problems.append(f"{block.where}: a skip marker on a `{block.language or 'plain'}` "
                            "block, which never runs")
        if not block.language and _looks_like_commands(block.text):
            problems.append(f"{block.where}: a block of commands without a language: tag it "
                            "```bash (a script) or ```console (`$ ` lines and their output)")
        blocks.append(block)
    if pending:
        problems.append(f"{name}:{pending[0]}: readme-test marker not followed by a fence")
    return blocks, problems


def _parse_marker(name: str, line: int, body: str, problems: list[str]) -> tuple[int, str] | None:
    kind, _, reason = body.strip().partition(":")
    if kind.strip() != "skip":
        problems.append(f"{name}:{line}: unknown readme-test marker {body.strip()!r}; the one "
                        "marker is `<!-- readme-test: skip: REASON -->`")
        return None
    if not reason.strip():
        problems.append(f"{name}:{line}: readme-test skip marker without a reason; write "
                        "`<!-- readme-test: skip: REASON -->`")
        return None
    return line, reason.strip()


def _looks_like_commands(text: str) -> bool:
    first = next((line for line in text.splitlines() if line.strip()), "")
    return first.startswith(_COMMANDS)


def script(block: Block) -> str:
    """The shell text the test runs for a block: the whole block, or a console block's
    commands, with `SHRINK_RULES` applied to each command."""
    text = block.text
    if block.language == "console":
        text = _console_commands(text)
    return "\n".join(shrink(command) for command in _logical_lines(text)) + "\n"


def _console_commands(text: str) -> str:
    commands: list[str] = []
    continuing = False
    for line in text.splitlines():
        if line.startswith("$ ") or continuing:
            commands.append(line[2:] if line.startswith("$ ") and not continuing else line)
            continuing = line.endswith("\\")
    return "\n".join(commands)


def _logical_lines(text: str) -> list[str]:
    """Lines with their backslash continuations joined, so a rule sees a whole command."""
    return text.replace("\\\n", " ").splitlines()


# --- the substitutions --------------------------------------------------------------------
#
# `trainer pretrain --config configs/tiny-cpu.toml` trains 300 steps (minutes on 2 cores). In a
# test such a command trains 1/100 of its samples and saves 100 times as often:
# `train.train_samples` (the recipe's 4800) and `checkpoint.interval` (the recipe's 100) are
# divided by 100, given or not, and a checkpoint named `step_N` in any command becomes
# `step_{N/100}`. So a shrunk run saves and rotates (`checkpoint.keep_last`) the same
# checkpoints, by name, as the full run: a command that reads a checkpoint an earlier command
# rotated away fails here too. Those runs also skip the warmup (longer than the shrunk run),
# the evaluation and the matmul-peak measurement (seconds per run; no figure of a test run is
# read), and take micro-batches of 4: at the recipe's 8 the MLP's activations reach the size at
# which the CPU GELU is compiled, seconds in every new process.

SCALE = 100
_TINY_PRETRAIN = re.compile(r"\btrainer pretrain\b.*configs/tiny-cpu\.toml")
_SCALED_KEYS = {"train.train_samples": 4800, "checkpoint.interval": 100}  # the recipe's values
_STEP_DIR = re.compile(r"\bstep_(\d{8})\b")
_TINY_EXTRA = ("schedule.warmup=0 train.eval_interval=0 monitor.peak_flops=1e11 "
               "train.micro_batch_size=4")
SHORT_RUN_SAMPLES = 1000  # below this a README's run is already short: it runs as written
SHRINK_RULES = (
    "trainer pretrain on configs/tiny-cpu.toml: train.train_samples and checkpoint.interval "
    f"/ {SCALE} (the recipe's 4800 and 100 if not given), and {_TINY_EXTRA}; a run given "
    f"fewer than {SHORT_RUN_SAMPLES} train.train_samples runs as written",
    f"step_N (a checkpoint folder) -> step_{{N/{SCALE}}}",
)


def shrink(command: str) -> str:
    """`command` with `SHRINK_RULES` applied (unchanged when none applies)."""
    command = _STEP_DIR.sub(lambda m: f"step_{_scaled(int(m.group(1)), m.group(0)):08d}",
                            command)
    if not _TINY_PRETRAIN.search(command) or _already_short(command):
        return command
    code, comment = _split_comment(command)
    code = code.rstrip()
    for key, recipe_value in _SCALED_KEYS.items():
        given = re.compile(rf"\b{re.escape(key)}=(\d+)")
        if given.search(code):
            code = given.sub(lambda m, key=key: f"{key}={_scaled(int(m.group(1)), m.group(0))}",
                             code)
        else:
            code += f" {key}={recipe_value // SCALE}"
    return f"{code} {_TINY_EXTRA}{comment}"


def _already_short(command: str) -> bool:
    """A run the README itself keeps to a few steps (`train.train_samples` under
    `SHORT_RUN_SAMPLES`) runs exactly as written."""
    given = re.search(r"\btrain\.train_samples=(\d+)", command)
    return given is not None and int(given.group(1)) < SHORT_RUN_SAMPLES


def _scaled(value: int, what: str) -> int:
    if value % SCALE:
        raise ValueError(f"{what}: not a multiple of {SCALE}; the test cannot shrink it "
                         "(see SHRINK_RULES in tests/readme_blocks.py)")
    return value // SCALE


def _split_comment(command: str) -> tuple[str, str]:
    """(code, `  # comment`) of one shell line; a `#` inside quotes is code."""
    quote = ""
    for i, char in enumerate(command):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i], "  " + command[i:]
    return command, ""
