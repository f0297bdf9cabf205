"""Every command block of the READMEs runs as written.

Bug caught: a changed command, flag, default or output path breaks a test, not a user who
copies the README. (The blocks that new users hit first: `dataprep merge` of a corpus nothing
created, a `build-index` of a folder the merge had filled with duplicates, a default split too
small for the sequence length, a `trainer generate` of a checkpoint the previous command had
rotated away.)

Which blocks run (the rule, also in docs/architecture.md): fences of language `bash`, `sh` or
`console`; in a `console` block only the `$ ` lines. Other fences (`text`, `toml`, `python`,
none) never run, and an untagged block that starts with a command is an error. A block that
cannot run here carries `<!-- readme-test: skip: REASON -->` right before its fence and is
reported as a skip with that reason (`pytest -ra`).

How: the blocks of one README run in order in one scratch folder laid out like the
repository after `make demo` (`configs/` linked, `build/demo` built once per session at a
smaller size by the demo's own commands, `.venv` the running interpreter's environment), each
under `set -euo pipefail`. A failure shows the README, the block's first line, what ran and
its output. The substitutions that shorten training are listed in
`readme_blocks.SHRINK_RULES`; nothing else differs from what the README shows.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from readme_blocks import SHRINK_RULES, Block, parse_readme, script, shrink  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
READMES = [REPO / "README.md", *sorted(REPO.glob("packages/**/README.md")),
           REPO / "benchmarks" / "README.md"]
PARSED = {readme: parse_readme(readme, REPO) for readme in READMES}
RUN_BLOCKS = [block for blocks, _ in PARSED.values() for block in blocks if block.runs]
BLOCK_TIMEOUT_S = 600
OUTPUT_SHOWN = 6000  # characters of a failed block's output in the report

# What `make demo` builds under build/demo, at a third of its corpus: the READMEs' commands
# need its files (tokenizer, token file, index cache), not its size.
DEMO_COMMANDS = """
dataprep demo-corpus build/demo/raw --size-mb 1
dataprep train-tokenizer build/demo/raw --vocab-size 8000 --output build/demo/tokenizer/demo
dataprep tokenize build/demo/raw --tokenizer build/demo/tokenizer/demo.model \
    --output build/demo/corpus/demo --workers 1
dataprep build-index build/demo/corpus --seq-length 256 --train-samples 20000 \
    --valid-samples 200 --split 98,2
"""


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    # one compute thread per command: the READMEs run side by side, and two torch processes
    # of two OpenMP threads each on two cores spend most of their time waiting at barriers
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                OMP_NUM_THREADS="1")


def _bash(text: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", "set -euo pipefail\n" + text], cwd=cwd, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=BLOCK_TIMEOUT_S)


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """build/demo as `make demo` leaves it, minus the run (the READMEs train their own)."""
    root = tmp_path_factory.mktemp("demo")
    result = _bash(DEMO_COMMANDS, root)
    assert result.returncode == 0, f"building the demo corpus failed:\n{result.stdout}"
    return root / "build" / "demo"


class ReadmeRun:
    """The blocks of one README, run in order in one scratch folder, as a reader runs them."""

    def __init__(self, scratch: Path, demo: Path):
        self.scratch = scratch
        (scratch / "configs").symlink_to(REPO / "configs")
        (scratch / "build").mkdir()
        (scratch / "build" / "demo").symlink_to(demo)
        _link_venv(scratch / ".venv")
        self.variables = scratch.with_name(scratch.name + ".vars")
        self.results: dict[int, str | None] = {}

    def run(self, blocks: list[Block]) -> dict[int, str | None]:
        """Runs `blocks` in order (a skipped block is passed over): {line: None (ok) or the
        failure}; after a failure the rest are not run, since they use its outputs."""
        failed_at = None
        for block in blocks:
            if block.skip:
                continue
            if failed_at:
                self.results[block.line] = f"not run: the earlier block {failed_at} failed"
                continue
            self.results[block.line] = self._run_one(block)
            if self.results[block.line]:
                failed_at = block.where
        return self.results

    def _run_one(self, block: Block) -> str | None:
        text = script(block)
        result = _bash(_carry_variables(text, self.variables), self.scratch)
        if result.returncode == 0:
            return None
        return (f"{block.where}: the block exited with {result.returncode} (scratch folder "
                f"{self.scratch})\n--- ran (after SHRINK_RULES):\n{text}--- output (the last "
                f"{OUTPUT_SHOWN} characters):\n{result.stdout[-OUTPUT_SHOWN:]}")


def _carry_variables(text: str, state: Path) -> str:
    """`text` between the shell variables the earlier blocks set (a README's blocks are one
    terminal session: `C=build/demo/corpus` in one block, `$C` in the next) and the saving of
    its own for the next block."""
    file = shlex.quote(str(state))
    return (f'__readme_base=" $(compgen -v | tr "\\n" " ") "\n'
            f'if [ -f {file} ]; then source {file}; fi\n'
            f"{text}"
            f'for __v in $(compgen -v); do case "$__readme_base __readme_base __v " in '
            f'*" $__v "*) ;; *) declare -p "$__v" ;; esac; done > {file}\n')


def _link_venv(link: Path) -> None:
    """`.venv` as `make demo` leaves it: this interpreter's environment, or, outside a
    virtual environment, a stand-in whose `bin/activate` puts this interpreter first."""
    if sys.prefix != sys.base_prefix:
        link.symlink_to(sys.prefix)
        return
    (link / "bin").mkdir(parents=True)
    (link / "bin" / "activate").write_text(
        f'export PATH="{Path(sys.executable).parent}:$PATH"\n', encoding="utf-8")


@pytest.fixture(scope="session")
def readme_results(request, tmp_path_factory, demo_dir):
    """{README: a future of its block results}. The READMEs of the selected block tests run
    side by side, each in its own thread and folder, up to its last selected block: their
    commands spend much of their time starting Python on one core, which overlaps well."""
    selected = [item.callspec.params["block"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_readme_block_runs"
                and not item.callspec.params["block"].skip]
    last = {}
    for block in selected:
        last[block.readme] = max(last.get(block.readme, 0), block.line)
    with ThreadPoolExecutor(max_workers=max(1, len(last))) as pool:
        futures = {}
        for readme, line in last.items():
            scratch = tmp_path_factory.mktemp("readme-" + readme.replace("/", "-"))
            blocks = [b for b in RUN_BLOCKS if b.readme == readme and b.line <= line]
            futures[readme] = pool.submit(ReadmeRun(scratch, demo_dir).run, blocks)
        yield futures


@pytest.mark.parametrize("readme", READMES, ids=[str(r.relative_to(REPO)) for r in READMES])
def test_readme_fences_and_markers_are_well_formed(readme):
    """Bug: a command block left without a language (never run by this test), a skip marker
    without a reason or away from its fence, or an unclosed fence that swallows the rest of
    the README."""
    _, problems = PARSED[readme]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[block.where for block in RUN_BLOCKS])
def test_readme_block_runs(block, readme_results):
    """Bug: a README command that fails as written (see the module docstring); the blocks
    before it in its README run first, as a reader runs them. Shrunk runs: SHRINK_RULES."""
    if block.skip:
        pytest.skip(f"{block.where}: {block.skip}")
    failure = readme_results[block.readme].result()[block.line]
    if failure:
        pytest.fail(failure + "\nshrink rules: " + "; ".join(SHRINK_RULES), pytrace=False)


def _parse(tmp_path, text: str):
    readme = tmp_path / "README.md"
    readme.write_text(text, encoding="utf-8")
    return parse_readme(readme, tmp_path)


def test_the_run_rule_and_the_skip_marker(tmp_path):
    """Bug: a bash/console block silently not run, an output sample run as a command, or a
    skip marker that loses its reason (a skip must say why in `pytest -ra`)."""
    blocks, problems = _parse(tmp_path, (
        "```bash\nls\n```\n"
        "```console\n$ echo a \\\n    b\nsample output\n```\n"
        "```text\n$ not run\n```\n"
        "<!-- readme-test: skip: needs SLURM -->\n```sh\nsbatch x\n```\n"))
    assert not problems
    assert [(b.line, b.language, b.runs, b.skip) for b in blocks] == [
        (1, "bash", True, None), (4, "console", True, None), (9, "text", False, None),
        (13, "sh", True, "needs SLURM")]
    assert script(blocks[1]) == "echo a      b\n"  # the `$ ` line and its continuation only


@pytest.mark.parametrize(("text", "problem"), [
    ("<!-- readme-test: skip: -->\n```bash\nls\n```\n", "skip marker without a reason"),
    ("<!-- readme-test: skip: why -->\n\ntext\n```bash\nls\n```\n", "not right before a fence"),
    ("<!-- readme-test: run -->\n```bash\nls\n```\n", "unknown readme-test marker"),
    ("```\n$ inspect-data summary corpus/\n```\n", "a block of commands without a language"),
    ("```\ndataprep tokenize raw/\n```\n", "a block of commands without a language"),
    ("```bash\nls\n", "fence never closed"),
])
def test_markers_and_untagged_command_blocks_are_refused(tmp_path, problem, text):
    """Bug: a marker with no reason (a silent skip), a marker that skips a block it is not
    attached to, or a command block that escapes the test by having no language."""
    _, problems = _parse(tmp_path, text)
    assert len(problems) == 1 and problem in problems[0], problems
    assert problems[0].startswith("README.md:")


def test_shrink_scales_tiny_runs_and_their_checkpoints_together():
    """Bug: a shrunk run whose checkpoint names no longer match the commands that read them
    (generate of step_00000300 after a 3-step run), one that keeps a checkpoint the full run
    rotates away (checkpoints not scaled with the steps), or overrides appended inside a
    comment."""
    assert shrink("trainer pretrain --config configs/tiny-cpu.toml   # 300 steps") == (
        "trainer pretrain --config configs/tiny-cpu.toml train.train_samples=48 "
        "checkpoint.interval=1 schedule.warmup=0 train.eval_interval=0 "
        "monitor.peak_flops=1e11 train.micro_batch_size=4  # 300 steps")
    scaled = shrink("trainer pretrain --config configs/tiny-cpu.toml train.train_samples=9600 "
                    "checkpoint.interval=200")
    assert "train.train_samples=96 " in scaled and "checkpoint.interval=2 " in scaled
    assert shrink("trainer generate runs/x/checkpoints/step_00000300 --prompt 'a # b'") == (
        "trainer generate runs/x/checkpoints/step_00000003 --prompt 'a # b'")
    assert shrink("trainer pretrain --config configs/1b3.toml") == (
        "trainer pretrain --config configs/1b3.toml")
    short = "trainer pretrain --config configs/tiny-cpu.toml train.train_samples=160"
    assert shrink(short) == short  # ten steps as written, not refused as not scalable
    with pytest.raises(ValueError, match="step_00000010: not a multiple of 100"):
        shrink("trainer generate runs/x/checkpoints/step_00000010")
