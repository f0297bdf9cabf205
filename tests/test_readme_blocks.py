"""Every command block of the READMEs runs as written, in the order a reader follows them.

Bug caught: a changed command, flag, default or output path breaks a test, not a user who
copies the README. (The blocks that new users hit first: `dataprep merge` of a corpus nothing
created, a `build-index` of a folder the merge had filled with duplicates, a default split too
small for the sequence length, a `trainer generate` of a checkpoint the previous command had
rotated away, a package README's block that fails on what the root README's blocks left, and
README commands that leave files `git status` shows.)

Which blocks run (the rule, also in docs/architecture.md): fences of language `bash`, `sh` or
`console`; in a `console` block only the `$ ` lines. Other fences (`text`, `toml`, `python`,
none) never run, and an untagged block that starts with a command is an error. A block that
cannot run here carries `<!-- readme-test: skip: REASON -->` right before its fence and is
reported as a skip with that reason (`pytest -ra`).

How: all READMEs run once, one after the other in reading order (`READMES`: the root README,
then the READMEs it points to in the order it names them, then the rest), in one scratch
folder laid out like a clone after `make demo`: a git repository of the checkout's
`.gitignore` and `configs/`, `build/demo` built once per session at a smaller size by the
demo's own commands, `.venv` the running interpreter's environment. Each block runs under
`set -euo pipefail`; a README's blocks share their shell variables (one terminal per
README). Afterwards `git status` of the scratch folder must show nothing: every file the
READMEs write is ignored by `.gitignore`. A failure shows the README, the block's first line,
what ran and its output. The substitutions that shorten training are listed in
`readme_blocks.SHRINK_RULES`; nothing else differs from what the README shows.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from readme_blocks import SHRINK_RULES, Block, parse_readme, script, shrink  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _reading_order(root: Path) -> list[Path]:
    """The root README, the READMEs it names in the order it first names them, then the
    other READMEs of the packages and benchmarks: the order a reader follows."""
    readme = root / "README.md"
    named = [root / m.group(0) for m in re.finditer(r"[\w./-]+/README\.md",
                                                    readme.read_text(encoding="utf-8"))]
    rest = [*sorted(root.glob("packages/**/README.md")), root / "benchmarks" / "README.md"]
    order = [readme]
    for path in [*named, *rest]:
        if path.is_file() and path not in order:
            order.append(path)
    return order


READMES = _reading_order(REPO)
PARSED = {readme: parse_readme(readme, REPO) for readme in READMES}
RUN_BLOCKS = [block for blocks, _ in PARSED.values() for block in blocks if block.runs]
BLOCK_TIMEOUT_S = 600
OUTPUT_SHOWN = 6000  # characters of a failed block's output in the report
GIT_STATUS = ["status", "--porcelain", "--untracked-files=all"]
# the scratch folder's own git identity and ignore rules: the user's must not matter
_GIT = ["git", "-c", "user.name=readme-test", "-c", "user.email=readme-test@localhost",
        "-c", "core.excludesFile=/dev/null", "-c", "commit.gpgSign=false"]

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
    # one compute thread per command: torch's OpenMP threads spin at barriers on a 2-core
    # machine that the rest of the suite's processes share
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                OMP_NUM_THREADS="1")


def _bash(text: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", "set -euo pipefail\n" + text], cwd=cwd, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=BLOCK_TIMEOUT_S)


def _git(scratch: Path, *args: str) -> str:
    return subprocess.run([*_GIT, *args], cwd=scratch, check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True).stdout


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """build/demo as `make demo` leaves it, minus the run (the READMEs train their own)."""
    root = tmp_path_factory.mktemp("demo")
    result = _bash(DEMO_COMMANDS, root)
    assert result.returncode == 0, f"building the demo corpus failed:\n{result.stdout}"
    return root / "build" / "demo"


class ReadingOrderRun:
    """The blocks of all READMEs, run in reading order in one scratch folder, as a reader
    follows them: a git repository whose commit holds what a clone has before the READMEs
    run, so `git status` afterwards shows what they wrote that `.gitignore` does not cover."""

    def __init__(self, scratch: Path, demo: Path, beside: bool = False):
        self.scratch = scratch
        self.beside = beside  # runs the query blocks (`is_query`) beside the chain
        shutil.copy(REPO / ".gitignore", scratch / ".gitignore")
        shutil.copytree(REPO / "configs", scratch / "configs", symlinks=True)
        (scratch / "build").mkdir()
        (scratch / "build" / "demo").symlink_to(demo)
        _link_venv(scratch / ".venv")
        _git(scratch, "init", "-q")
        _git(scratch, "add", "-A")
        _git(scratch, "commit", "-q", "-m", "a clone after make demo")
        self.results: dict[str, str | None] = {}

    def run(self, blocks: list[Block]) -> dict[str, str | None]:
        """Runs `blocks` in order (a skipped block is passed over): {where: None (ok) or the
        failure}. After a failure the rest of its README is not run (it uses the failed
        block's outputs); the next READMEs run, their failures noting the earlier one."""
        failed_at: dict[str, str] = {}
        for block in blocks:
            if block.skip:
                continue
            if block.readme in failed_at:
                self.results[block.where] = (f"not run: the earlier block "
                                             f"{failed_at[block.readme]} failed")
                continue
            failure = self._run_one(block)
            if failure and failed_at:
                failure += ("\nnote: earlier READMEs failed first ("
                            + ", ".join(failed_at.values()) + "); this may follow from that")
            self.results[block.where] = failure
            if failure:
                failed_at[block.readme] = block.where
        return self.results

    def git_status(self, ignored: bool = False) -> str:
        return _git(self.scratch, *GIT_STATUS, *(["--ignored"] if ignored else []))

    def _run_one(self, block: Block) -> str | None:
        text = script(block)
        variables = self.scratch.with_name(
            f"{self.scratch.name}.{block.readme.replace('/', '-')}.vars")
        result = _bash(_carry_variables(text, variables), self.scratch)
        if result.returncode == 0:
            return None
        return (f"{block.where}: the block exited with {result.returncode} (scratch folder "
                f"{self.scratch}, {_where_it_ran(block, self.beside)})\n--- ran (after "
                f"SHRINK_RULES):\n{text}--- output (the last {OUTPUT_SHOWN} characters):\n"
                f"{result.stdout[-OUTPUT_SHOWN:]}")


def _where_it_ran(block: Block, beside: bool) -> str:
    if beside:
        return "a read-only query (is_query), run beside the chain in a clone of its own"
    names = [str(readme.relative_to(REPO)) for readme in READMES]
    before = names[:names.index(block.readme)]
    return ("after the blocks before it in reading order, those of " + ", ".join(before)
            + " first" if before else "after the blocks before it in its README")


_QUERY = re.compile(r"trainer (plan|config)\b")


def is_query(block: Block) -> bool:
    """A block of read-only queries of `configs/` (`trainer plan`, `trainer config`): it
    writes nothing (checked: `git status --ignored` of its clone stays as it was) and needs
    no other block's output, so where it runs in the order cannot change what it or another
    block does. These run beside the chain, on the second core."""
    if block.skip:
        return False
    commands = [line.strip() for line in script(block).splitlines()
                if line.strip() and not line.strip().startswith("#")]
    return bool(commands) and all(_QUERY.match(command) for command in commands)


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
def reading_order_run(request, tmp_path_factory, demo_dir) -> ReadmeRuns:
    """The READMEs' blocks run once in reading order: all of them when the `git status` test
    is selected, else up to the last selected block; the query blocks (`is_query`) beside
    them."""
    selected = [item for item in request.session.items
                if getattr(item, "originalname", "") in _USES_THE_RUN]
    names = {item.originalname for item in selected}
    last = len(RUN_BLOCKS)
    if "test_readmes_leave_git_status_clean" not in names:
        wanted = {item.callspec.params["block"].where for item in selected}
        last = max((i + 1 for i, b in enumerate(RUN_BLOCKS) if b.where in wanted), default=0)
    blocks = RUN_BLOCKS[:last]
    chain = ReadingOrderRun(tmp_path_factory.mktemp("readmes"), demo_dir)
    queries = ReadingOrderRun(tmp_path_factory.mktemp("readme-queries"), demo_dir, beside=True)
    untouched = queries.git_status(ignored=True)
    with ThreadPoolExecutor(max_workers=1) as pool:
        beside = pool.submit(queries.run, [block for block in blocks if is_query(block)])
        chain.run([block for block in blocks if not is_query(block)])
        beside.result()
    return ReadmeRuns(chain, queries, untouched)


class ReadmeRuns:
    """The chain's and the queries' results, and what their clones' `git status` shows."""

    def __init__(self, chain: ReadingOrderRun, queries: ReadingOrderRun, untouched: str):
        self.chain, self.queries, self.untouched = chain, queries, untouched
        self.results = {**chain.results, **queries.results}


_USES_THE_RUN = ("test_readme_block_runs", "test_readmes_leave_git_status_clean")


@pytest.mark.parametrize("readme", READMES, ids=[str(r.relative_to(REPO)) for r in READMES])
def test_readme_fences_and_markers_are_well_formed(readme):
    """Bug: a command block left without a language (never run by this test), a skip marker
    without a reason or away from its fence, or an unclosed fence that swallows the rest of
    the README."""
    _, problems = PARSED[readme]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[block.where for block in RUN_BLOCKS])
def test_readme_block_runs(block, reading_order_run):
    """Bug: a README command that fails as written (see the module docstring), also one that
    fails on what the blocks before it in reading order left (the root README's outputs met
    by a package README's). Shrunk runs: SHRINK_RULES."""
    if block.skip:
        pytest.skip(f"{block.where}: {block.skip}")
    failure = reading_order_run.results[block.where]
    if failure:
        pytest.fail(failure + "\nshrink rules: " + "; ".join(SHRINK_RULES), pytrace=False)


@pytest.mark.slow
def test_readmes_leave_git_status_clean(reading_order_run):
    """Bug: following the READMEs litters the checkout: a README command writes a file or
    folder that `.gitignore` does not cover (`git status` shows raw/, corpus/, out/, ...), or
    changes a tracked file; or a block run beside the chain as a read-only query writes."""
    runs = reading_order_run
    status = runs.chain.git_status()
    assert not status, (
        "after running every README block in reading order, `git status --porcelain` of the "
        f"scratch clone {runs.chain.scratch} shows:\n{status}\nignore what the "
        "READMEs write in .gitignore (anchored at the root, e.g. /corpus/), or write it "
        "under an ignored folder")
    assert runs.queries.git_status(ignored=True) == runs.untouched, (
        f"a query block (is_query: run beside the chain, as writing nothing) wrote files in "
        f"{runs.queries.scratch}; make it a plain block or keep it from writing")


def test_reading_order_follows_the_root_readme(tmp_path):
    """Bug: the READMEs run in an order a reader does not follow (the package READMEs before
    the root README whose outputs they meet, or alphabetically rather than as linked)."""
    for name in ("a", "b", "c"):
        (tmp_path / "packages" / name).mkdir(parents=True)
        (tmp_path / "packages" / name / "README.md").write_text("x\n", encoding="utf-8")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "README.md").write_text("x\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "see `packages/c/README.md`, then [b](packages/b/README.md), packages/c/README.md "
        "again and docs/missing/README.md\n", encoding="utf-8")
    assert [str(p.relative_to(tmp_path)) for p in _reading_order(tmp_path)] == [
        "README.md", "packages/c/README.md", "packages/b/README.md", "packages/a/README.md",
        "benchmarks/README.md"]


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
