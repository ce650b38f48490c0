"""README.md's code blocks run as written, so the README cannot drift from the code.

The convention (also in the comment at the top of README.md):

- Every ```bash (or sh, shell) and ```python (or py) block runs, in README order, in one scratch
  directory that holds the repository's files (symlinks) and its ``.venv``: what a reader gets in a
  second terminal next to ``make serve``. Bash blocks run under ``set -e -o pipefail`` and hand their
  exported variables and working directory to the next block (so ``source .venv/bin/activate`` in one
  block holds for the rest, and nothing is on PATH before it); Python blocks run with the ``python``
  that PATH gives at that point.
- The test starts ``lookupspec serve`` (the default model, a fresh embedded store) on a free port,
  and ``127.0.0.1:8000`` / ``localhost:8000`` in a block become that port.
- A block that must not run carries, on the line right before its fence (blank lines between are
  allowed), ``<!-- readme-test: skip (REASON) -->``; the reason is required. Use it for blocks that
  need a service the test does not have, start a server, install torch, or run for minutes.
- Blocks in other languages (```text, ```json, ...) never run; a fence without a language is an
  error, so a new block is either run or explicitly not.
- Every ``lookupspec ...`` line of a bash block, skipped or not, must parse with the CLI's own parser
  (unknown commands, flags and choices fail; nothing runs).
- ``docs/*.md`` (the documents the README points to) follow the same fences, and their
  ``lookupspec ...`` lines must parse too; their blocks never run.

A failing block fails the test with ``README.md:LINE`` and the end of its output. Environment:
``LOOKUPSPEC_README_VENV=/path/to/.venv`` runs the blocks and the server with another virtual
environment, e.g. a default install (``make install`` in a fresh clone) to check that the README's
steps work without the test extras.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from redis_harness import free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RUNNABLE = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
_FENCE = re.compile(r"^ {0,3}```\s*([\w+-]*)(?:\s.*)?$")  # ```bash, ```python title="x", a bare ```
_MARKER = re.compile(r"^\s*<!--\s*readme-test:(.*?)-->\s*$")
_SKIP = re.compile(r"^\s*skip\s*\((.*\S.*)\)\s*$")
_SHELL_OPERATORS = {"&", "&&", "|", "||", ";", ">", ">>", "<", "<<", "2>", "(", ")"}


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    language: str  # the fence's info string, lower-cased ("" when none)
    code: str
    skip: str | None  # the skip marker's reason
    source: str = "README.md"

    @property
    def runner(self) -> str | None:
        return RUNNABLE.get(self.language)

    def __str__(self) -> str:
        return f"{self.source}:{self.line} (```{self.language} block)"


def parse_blocks(text: str, source: str = "README.md") -> tuple[list[Block], list[str]]:
    """The fenced blocks of a Markdown text, and the convention's violations (as messages naming
    ``source``)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    errors: list[str] = []
    pending: tuple[int, str] | None = None  # (line, reason) of a skip marker awaiting its fence
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _MARKER.match(line)
        fence = _FENCE.match(line)
        if marker:
            skip = _SKIP.match(marker.group(1))
            if skip is None:
                errors.append(f"{source}:{i + 1}: unknown readme-test directive {line.strip()!r}; "
                              "write <!-- readme-test: skip (REASON) -->")
            else:
                pending = (i + 1, skip.group(1).strip())
        elif fence:
            language = fence.group(1).lower()
            end = next((j for j in range(i + 1, len(lines)) if re.match(r"^ {0,3}```\s*$", lines[j])), None)
            if end is None:
                errors.append(f"{source}:{i + 1}: code block never closed")
                break
            if not language:
                errors.append(f"{source}:{i + 1}: code block without a language: name it (bash/python "
                              "run, unless marked skip; text, json, ... never run)")
            blocks.append(Block(i + 1, language, "\n".join(lines[i + 1:end]) + "\n",
                                pending[1] if pending else None, source))
            if pending and blocks[-1].runner is None:
                errors.append(f"{source}:{pending[0]}: skip marker on a block that would not run anyway")
            pending = None
            i = end
        elif line.strip() and pending:
            errors.append(f"{source}:{pending[0]}: skip marker not right before a code block")
            pending = None
        i += 1
    if pending:
        errors.append(f"{source}:{pending[0]}: skip marker not right before a code block")
    return blocks, errors


def command_lines(code: str) -> Iterator[tuple[int, list[str]]]:
    """(line offset in the block, argv after `lookupspec`) of each `lookupspec ...` command of a bash
    block; continuation lines are joined, and the command ends at the first shell operator."""
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        start, joined = i, lines[i]
        while joined.endswith("\\") and i + 1 < len(lines):
            i += 1
            joined = joined[:-1] + " " + lines[i]
        i += 1
        if joined.split(maxsplit=1)[:1] != ["lookupspec"]:
            continue
        lexer = shlex.shlex(joined, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words = list(lexer)
        argv = []
        for word in words[1:]:
            if word in _SHELL_OPERATORS:
                break
            argv.append(word)
        yield start, argv


def _file_blocks(path: Path) -> list[Block]:
    name = str(path.relative_to(ROOT))
    blocks, errors = parse_blocks(path.read_text(encoding="utf-8"), name)
    assert not errors, f"{name} breaks the code-block convention (see tests/test_readme.py):\n" + \
        "\n".join(errors)
    return blocks


def _readme_blocks() -> list[Block]:
    return _file_blocks(README)


def _docs_blocks() -> list[Block]:
    """The blocks of docs/*.md: records of what ran (benchmark commands, mostly), never run by the
    tests, but written to the same convention, and their command lines must parse."""
    return [b for path in sorted(DOCS.glob("*.md")) for b in _file_blocks(path)]


# ---- the convention (quick, no model) ------------------------------------------------------------


def test_parser_reads_markers_languages_and_mistakes() -> None:
    text = ("<!-- readme-test: skip (needs Redis) -->\n\n```bash\necho skipped\n```\n"
            "```python\nprint(1)\n```\n"
            "```\nno language\n```\n"
            "<!-- readme-test: skip () -->\n```bash\nx\n```\n"
            "<!-- readme-test: skip (a reason) -->\nsome text\n```text\nnot run\n```\n"
            "```Python title=\"x.py\"\nprint(2)\n```\n")
    blocks, errors = parse_blocks(text)
    assert [(b.line, b.language, b.skip, b.runner) for b in blocks] == [
        (3, "bash", "needs Redis", "bash"), (6, "python", None, "python"), (9, "", None, None),
        (13, "bash", None, "bash"), (18, "text", None, None), (21, "python", None, "python")]
    assert blocks[0].code == "echo skipped\n"
    assert errors == [
        "README.md:9: code block without a language: name it (bash/python run, unless marked skip; "
        "text, json, ... never run)",
        "README.md:12: unknown readme-test directive '<!-- readme-test: skip () -->'; "
        "write <!-- readme-test: skip (REASON) -->",
        "README.md:16: skip marker not right before a code block"]


def _runnable_blocks() -> list[Block]:
    """The blocks the README test runs; refuses one that would start a server or run make (the test
    has its own server, and `make serve` would never return)."""
    runnable = [b for b in _readme_blocks() if b.runner and not b.skip]
    for b in runnable:
        if b.runner == "bash":
            serves = [argv for _, argv in command_lines(b.code) if argv[:1] == ["serve"]]
            assert not serves and not re.search(r"^\s*make\b", b.code, re.M), \
                f"{b}: runs make or starts a server; the test runs its own server (mark the block skip)"
    return runnable


def test_readme_follows_the_code_block_convention() -> None:
    assert len(_runnable_blocks()) >= 8, "the README's examples are meant to run; most blocks should"


def test_every_lookupspec_command_line_in_the_readme_and_docs_parses() -> None:
    from lookupspec.cli import COMMANDS, build_parser

    checked = 0
    docs = _docs_blocks()
    assert any(b.runner == "bash" for b in docs), "docs/benchmarks.md records its commands"
    for block in _readme_blocks() + docs:
        if block.runner != "bash":
            continue
        for offset, argv in command_lines(block.code):
            where = f"{block.source}:{block.line + 1 + offset}"
            command = next((a for a in argv if not a.startswith("-")), None)
            assert command is None or command in COMMANDS, f"{where}: unknown command {command!r}"
            said = io.StringIO()
            try:
                with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
                    build_parser(command).parse_args(argv)
            except SystemExit as exc:
                if exc.code != 0:  # --version and --help exit 0
                    pytest.fail(f"{where}: `lookupspec {shlex.join(argv)}` does not parse: "
                                f"{said.getvalue().strip().splitlines()[-1]}", pytrace=False)
            checked += 1
    assert checked >= 10


def test_a_bad_flag_in_a_skipped_block_is_caught() -> None:
    from lookupspec.cli import build_parser

    code = "lookupspec summarize docs.jsonl -o out.jsonl \\\n    --no-such-flag &   # comment\n"
    [(offset, argv)] = list(command_lines(code))
    assert offset == 0 and argv == ["summarize", "docs.jsonl", "-o", "out.jsonl", "--no-such-flag"]
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
        build_parser("summarize").parse_args(argv)


# ---- running the blocks (the real model) -------------------------------------------------------


def _venv() -> Path:
    override = os.environ.get("LOOKUPSPEC_README_VENV")
    venv = Path(override) if override else Path(sys.prefix)
    if not (venv / "bin" / "activate").exists():
        pytest.skip(f"{venv} is not a virtual environment (run the tests from the project's .venv)")
    return venv


def _terminal_env(venv: Path, data_dir: Path) -> dict[str, str]:
    """A fresh terminal's environment: no virtual environment on PATH, no lookupspec or OpenAI
    settings but the model and kernel caches, and a store directory of the test's own."""
    drop = {str(venv / "bin"), str(Path(sys.prefix) / "bin")}
    if os.environ.get("VIRTUAL_ENV"):
        drop.add(str(Path(os.environ["VIRTUAL_ENV"]) / "bin"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOKUPSPEC_", "OPENAI_"))
           and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p not in drop)
    for kept in ("LOOKUPSPEC_HOME", "LOOKUPSPEC_KERNEL_CACHE"):
        if os.environ.get(kept):
            env[kept] = os.environ[kept]
    env["LOOKUPSPEC_DATA_DIR"] = str(data_dir)  # a block that starts a server never takes the user's
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextlib.contextmanager
def _server(venv: Path, env: dict[str, str], workdir: Path, log_path: Path) -> Iterator[int]:
    """`lookupspec serve` as `make serve` starts it, on a free port with its own store."""
    port = free_port()
    cmd = [str(venv / "bin" / "lookupspec"), "serve", "--host", "127.0.0.1", "--port", str(port),
           "--data-dir", str(workdir.parent / "server-data"), "--log-level", "warning"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"lookupspec serve exited with {proc.returncode}:\n"
                            f"{log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2.0).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"server not ready:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _with_port(code: str, port: int) -> str:
    return re.sub(r"\b(127\.0\.0\.1|localhost):8000\b", rf"\g<1>:{port}", code)


def _run_block(block: Block, code: str, workdir: Path, state: Path, env: dict[str, str],
               scratch: Path) -> subprocess.CompletedProcess[str]:
    """One block in a fresh bash that first restores the exported variables and directory the
    previous blocks left (``state``), and saves them again after a bash block."""
    restore = (f'[ -f "{state}.env" ] && source "{state}.env"; '
               f'[ -f "{state}.cwd" ] && cd "$(cat "{state}.cwd")"\n')
    if block.runner == "bash":
        script = (f"{restore}set -e -o pipefail\n{code}\n"
                  f'export -p > "{state}.env"; pwd > "{state}.cwd"\n')
    else:
        source = scratch / f"readme-block-{block.line}.py"
        source.write_text(code)
        script = f'{restore}exec python "{source}"\n'
    return subprocess.run(["bash", "-c", script], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=600)


def run_blocks(blocks: list[Block], workdir: Path, env: dict[str, str], scratch: Path,
               port: int | None = None) -> list[str]:
    """Run ``blocks`` in order as one terminal session in ``workdir`` (``127.0.0.1:8000`` becomes
    ``port``); fail naming the first block that fails. Returns one timing line per block."""
    state = scratch / "terminal"
    timings = []
    for block in blocks:
        t0 = time.monotonic()
        code = block.code if port is None else _with_port(block.code, port)
        proc = _run_block(block, code, workdir, state, env, scratch)
        timings.append(f"{block}: {time.monotonic() - t0:.1f} s")
        print(f"==== {block}, exit {proc.returncode}, {time.monotonic() - t0:.1f} s\n"
              f"{proc.stdout[-1500:]}\n---- stderr\n{proc.stderr[-1500:]}")  # shown with -s
        if proc.returncode != 0:
            output = (proc.stdout + proc.stderr)[-4000:]
            pytest.fail(f"{block} failed (exit {proc.returncode}); the README must run as written "
                        f"(or mark the block <!-- readme-test: skip (REASON) -->):\n{block.code}\n"
                        f"--- its output (end) ---\n{output}", pytrace=False)
    return timings


def test_blocks_run_as_one_terminal_session_and_a_failure_names_its_line(tmp_path: Path) -> None:
    text = ("```bash\nexport GREETING=hello\nmkdir -p sub && cd sub\n```\n"
            "```python\nimport os\nprint(os.environ['GREETING'], os.path.basename(os.getcwd()))\n```\n"
            "```bash\ntest \"$GREETING\" = hello\nfalse\necho never\n```\n")
    blocks, errors = parse_blocks(text)
    assert not errors
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    with pytest.raises(pytest.fail.Exception) as failed:
        run_blocks(blocks, tmp_path, env, tmp_path)
    message = str(failed.value)
    assert message.startswith("README.md:9 (```bash block) failed (exit 1)")
    assert "never" not in message.split("--- its output (end) ---")[1]
    out = subprocess.run(["bash", "-c", f'source "{tmp_path}/terminal.env"; echo "$GREETING"; '
                          f'cat "{tmp_path}/terminal.cwd"'], capture_output=True, text=True).stdout
    assert out.split() == ["hello", str(tmp_path / "sub")]  # what the first block left for the others


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_readme_blocks_run_as_written(real_model_dir: Path, tmp_path: Path) -> None:
    blocks = _runnable_blocks()
    venv = _venv()
    workdir = tmp_path / "repo"
    workdir.mkdir()
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    for name in sorted({t.split("/")[0] for t in tracked} or {p.name for p in ROOT.iterdir()}):
        if name not in (".venv", ".git") and (ROOT / name).exists():
            (workdir / name).symlink_to(ROOT / name)
    (workdir / ".venv").symlink_to(venv)
    env = _terminal_env(venv, tmp_path / "data")
    with _server(venv, env, workdir, tmp_path / "serve.log") as port:
        timings = run_blocks(blocks, workdir, env, tmp_path, port)
    print("\n".join(timings))
