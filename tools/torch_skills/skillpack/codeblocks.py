"""Find and run the Python code blocks in the skills, so every example is proven to work.

Check a skill while writing it:
    python -m torch_skills.skillpack.codeblocks skills/debugging-techniques

The info string after the fence says how a block is checked:
- ```python              runs on CPU as a standalone script (its own imports) in a fresh process
- ```python raises=Name  must raise the exception Name (for "Don't" examples that show an error)
- ```python cuda         needs a GPU: compiled here, run where CUDA is present
- ```python torchrun     a distributed script: run as `torchrun --standalone --nproc-per-node 2`
                         on CPU, so it must pick the gloo backend when CUDA is absent
- ```python torchrun slow  the same, but long (a whole training script): its test carries
                         `@pytest.mark.slow`, so it runs in the slow CI step (`pytest -m slow`),
                         not in the default run; `slow` combines with any mode
Other languages (bash, text, ...) are not run. Blocks run in a temporary working directory with
a 120 s timeout; keep them to small tensors and a few seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
KNOWN_TAGS = {"cuda", "torchrun", "slow"}


@dataclass(frozen=True)
class CodeBlock:
    file: Path
    line: int  # line of the opening fence
    language: str
    tags: frozenset[str]
    raises: str | None
    code: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def slow(self) -> bool:
        """Tested only in the slow set (`pytest -m slow`): tagged `slow`, or multi-process (`torchrun`)."""
        return "slow" in self.tags or "torchrun" in self.tags

    @property
    def mode(self) -> str:
        """'run', 'compile' (needs CUDA) or 'torchrun'."""
        if "torchrun" in self.tags:
            return "torchrun"
        if "cuda" in self.tags:
            return "compile"
        return "run"


def extract_blocks(path: Path) -> list[CodeBlock]:
    """Every fenced code block of a Markdown file, Python or not."""
    blocks: list[CodeBlock] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group("fence"), m.group("info").strip(), i + 1
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        words = info.split()
        language = words[0].lower() if words else ""
        raises = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("raises=")), None)
        tags = frozenset(w for w in words[1:] if not w.startswith("raises="))
        blocks.append(CodeBlock(path, start, language, tags, raises, textwrap.dedent("\n".join(body)) + "\n"))
    return blocks


def python_blocks(paths: list[Path]) -> list[CodeBlock]:
    """The Python blocks of every .md file under the given files or folders."""
    files: list[Path] = []
    for p in paths:
        files += sorted(p.rglob("*.md")) if p.is_dir() else [p]
    return [b for f in files for b in extract_blocks(f) if b.language in ("python", "py")]


def run_block(request: dict[str, Any], job: Any) -> dict[str, Any]:
    """Worker function (torch_skills.runner): exec one block's code as `__main__` in the job's directory."""
    import os

    os.chdir(job.job_dir)
    code, raises = request["code"], request.get("raises")
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": str(job.job_dir / "block.py")}
    started = time.perf_counter()
    try:
        exec(compile(code, request.get("where", "<block>"), "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001 - the block's outcome is the result
        name = type(exc).__name__
        if raises and name == raises:
            return {"ok": True, "raised": name, "seconds": time.perf_counter() - started}
        import traceback

        return {
            "ok": False,
            "error": "".join(traceback.format_exception(exc))[-3000:],
            "seconds": time.perf_counter() - started,
        }
    if raises:
        return {
            "ok": False,
            "error": f"expected the block to raise {raises}, but it finished",
            "seconds": time.perf_counter() - started,
        }
    return {"ok": True, "raised": None, "seconds": time.perf_counter() - started}


def run_torchrun(block: CodeBlock, timeout_s: float = 180) -> tuple[bool, str]:
    """Run a torchrun block with two CPU processes; (passed, output).

    A rank killed by a signal (gloo aborting at teardown on an oversubscribed 2-core machine, seen
    once in CI) gets one more run; an exception or a failed assert in the block never does.
    """
    ok, output = _torchrun_once(block, timeout_s)
    if not ok and _died_of_a_signal(output):
        ok, again = _torchrun_once(block, timeout_s)
        output = f"[first run died of a signal; ran once more]\n{again}"
    return ok, output


def _died_of_a_signal(output: str) -> bool:
    """A rank ended by a signal, with no traceback from the block's own code."""
    return bool(re.search(r"exitcode: -\d+", output)) and 'block.py", line' not in output


def _torchrun_once(block: CodeBlock, timeout_s: float) -> tuple[bool, str]:
    workdir = Path(tempfile.mkdtemp(prefix="torch-skills-block-"))
    try:
        script = workdir / "block.py"
        script.write_text(block.code)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two ranks share the cores with everything else
        proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout_s, env=env)
        return proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        return False, f"timed out after {timeout_s} s\n{e.stdout or ''}{e.stderr or ''}"[-3000:]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def compile_block(block: CodeBlock) -> tuple[bool, str]:
    try:
        compile(block.code, block.where, "exec")
    except SyntaxError as e:
        return False, f"{e.msg} at line {e.lineno}"
    return True, ""


@dataclass
class BlockOutcome:
    block: CodeBlock
    passed: bool
    detail: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


async def check_blocks(
    blocks: list[CodeBlock], *, timeout_s: float = 120, concurrency: int = 2
) -> list[BlockOutcome]:
    """Run/compile every block; runs go through the warm worker (one fork each), torchrun blocks
    in their own processes, `concurrency` at a time. Outcomes come back in the blocks' order."""
    from torch_skills.runner.errors import WorkerError
    from torch_skills.runner.pool import WorkerPool

    outcomes: list[BlockOutcome | None] = [None] * len(blocks)
    slots = anyio.Semaphore(concurrency)
    torchrun_slot = anyio.Semaphore(1)  # two ranks each: one script at a time on a small machine

    async def check(index: int, block: CodeBlock, pool: WorkerPool) -> None:
        if block.tags - KNOWN_TAGS:
            outcomes[index] = BlockOutcome(block, False, f"unknown tags {sorted(block.tags - KNOWN_TAGS)}")
            return
        ok, detail = compile_block(block)
        if not ok or block.mode == "compile":
            outcomes[index] = BlockOutcome(block, ok, detail)
            return
        started = time.perf_counter()
        if block.mode == "torchrun":
            async with torchrun_slot:
                ok, detail = await anyio.to_thread.run_sync(run_torchrun, block)
            outcomes[index] = BlockOutcome(block, ok, detail, time.perf_counter() - started)
            return
        request = {"code": block.code, "raises": block.raises, "where": block.where}
        try:
            async with slots:
                job = await pool.run(
                    "torch_skills.skillpack.codeblocks:run_block",
                    request,
                    timeout_s=timeout_s,
                    device="cpu",
                    memory_limit_bytes=8 << 30,
                )
        except WorkerError as e:
            outcomes[index] = BlockOutcome(block, False, str(e)[-3000:])
            return
        res = job.result
        detail = "" if res["ok"] else res.get("error", "") + job.output[-1500:]
        outcomes[index] = BlockOutcome(block, bool(res["ok"]), detail, res["seconds"])

    preload = ("torch_skills.skillpack.codeblocks",)
    async with (
        WorkerPool(max_concurrent=concurrency, preload=preload) as pool,
        anyio.create_task_group() as tg,
    ):
        for index, block in enumerate(blocks):
            tg.start_soon(check, index, block, pool)
    return [o for o in outcomes if o is not None]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in argv] or [DEFAULT_SKILLS_DIR]
    blocks = python_blocks(paths)
    outcomes = anyio.run(check_blocks, blocks)
    failed = [o for o in outcomes if not o.passed]
    for o in outcomes:
        status = "ok  " if o.passed else "FAIL"
        mode = o.block.mode + (" slow" if o.block.slow else "")
        print(f"{status} {mode:13} {o.seconds:6.2f}s {o.block.where}")
    for o in failed:
        print(f"\n--- {o.block.where} ---\n{o.detail}")
    print(f"\n{len(outcomes) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
