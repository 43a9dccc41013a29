"""What the torch-skills tools find on a small language model: run `torch-skills --demo`.

It copies the bundled example model (`tiny_lm.py`) into a fresh temporary project folder,
starts the real server in-process (the same code a client talks to over stdio), calls each tool
through an MCP client the way an agent would, and prints what each one found. The checkpoints it
inspects are written into that folder first: a DDP-prefixed training checkpoint and a pickle that
would run a shell command if anyone unpickled it (nobody does). Works from any directory, from a
clone or installed; the folder is removed at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio

EXAMPLE = Path(__file__).resolve().parent / "tiny_lm.py"
LM = "tiny_lm.py"


def _write_checkpoints(project: Path) -> tuple[Path, Path]:
    """A DDP-style training checkpoint and a malicious pickle; built in a subprocess (torch lives there)."""
    script = """
import sys, torch
sys.path.insert(0, ".")
from tiny_lm import build
model = build()
opt = torch.optim.AdamW(model.parameters())
state = {"module." + k: v for k, v in model.state_dict().items()}  # saved from a DDP wrapper
torch.save({"model": state, "optimizer": opt.state_dict(), "epoch": 3}, "ddp_run.pt")

class Payload:
    def __reduce__(self):
        import os
        return (os.system, ("echo this would have run on your machine",))

torch.save({"weights": model.state_dict(), "extra": Payload()}, "downloaded.pt")
"""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run([sys.executable, "-c", script], check=True, cwd=project, env=env)
    return project / "ddp_run.pt", project / "downloaded.pt"


def _show(title: str, call: dict[str, Any], result: Any, seconds: float, extra: list[str]) -> None:
    print(f"\n== {title}  ({seconds:.1f} s)")
    args = ", ".join(f"{k}={v!r}" for k, v in call.items())
    print(f"   call: {args}")
    if result.is_error:
        print(_wrapped(result.content[0].text.splitlines()[0], first="   tool error: "))
        return
    data = result.structured_content
    print(f"   summary: {data.get('summary')}")
    for line in extra:
        print(f"   {line}")
    for finding in data.get("findings", [])[:4]:
        print(
            _wrapped(
                f"[{finding['severity']}] {finding['code']}: {finding['message']} (skill: {finding['skill']})"
            )
        )


def _wrapped(text: str, first: str = "   - ") -> str:
    """The whole text after `first`, wrapped at 100 columns (never cut mid-word); its own line breaks
    (code in a finding) are kept."""
    out = []
    for i, line in enumerate(text.splitlines() or [""]):
        lead = first if i == 0 else " " * 7
        out.append(textwrap.fill(line.strip(), width=100, initial_indent=lead, subsequent_indent=" " * 7))
    return "\n".join(out)


async def _demo(project: Path) -> None:
    from mcp import Client

    from torch_skills.server import build_server

    ddp_ckpt, bad_ckpt = _write_checkpoints(project)
    inputs = {"inputs": f"{LM}:make_inputs", "loss": f"{LM}:loss_fn"}
    async with Client(build_server(allow=[project])) as client:
        started = time.perf_counter()
        routed = await client.call_tool("route", {"query": "my loss goes NaN after I enabled fp16 autocast"})
        r = routed.structured_content
        print(f"== route  ({time.perf_counter() - started:.2f} s)")
        print("   query: 'my loss goes NaN after I enabled fp16 autocast'")
        print(f"   skills: {r['skills']}  tools: {r['tools']}  confidence: {r['confidence']}")

        calls = [
            ("check_gradients", {"model": f"{LM}:build_buggy", **inputs}),
            ("profile_model", {"model": f"{LM}:build_buggy", **inputs, "cpu_threads": 1}),
            (
                "estimate_memory",
                {
                    "model": f"{LM}:build",
                    "model_kwargs": {"layers": 24, "width": 2048, "heads": 16},
                    **inputs,
                    "batch_size": 16,
                    "precision": "bf16_autocast",
                    "device_memory_gib": 24,
                },
            ),
            ("verify_checkpoint", {"path": ddp_ckpt.name, "model": f"{LM}:build"}),
            ("verify_checkpoint", {"path": bad_ckpt.name}),
            ("check_distributed", {"model": f"{LM}:build", **inputs, "world_size": 2}),
        ]
        for tool, args in calls:
            started = time.perf_counter()
            result = await client.call_tool(tool, args)
            elapsed = time.perf_counter() - started
            extra: list[str] = []
            data = result.structured_content or {}
            if tool == "check_gradients" and data.get("nonfinite"):
                nf = data["nonfinite"]
                extra.append(
                    f"first non-finite value: {nf.get('phase')} pass, module {nf.get('module')!r}, op {nf.get('op')}"
                )
            if tool == "profile_model" and not result.is_error:
                extra.append(
                    f"bottleneck: {data['bottleneck']}, step {data['step_time_s'] * 1e3:.1f} ms, "
                    f"{data['host_syncs_per_step']} host syncs per step"
                )
            if tool == "estimate_memory" and not result.is_error:
                extra.append(
                    f"peak allocated {data['peak_allocated_bytes'] / 2**30:.2f} GiB in {data['peak_phase']}, "
                    f"fits 24 GiB: {data['fits']}, largest batch that fits: {data['max_batch_size']}"
                )
            if tool == "verify_checkpoint" and not result.is_error:
                extra.append(
                    f"safe: {data['safe']}, format: {data['format']}, missing for resume: {data['missing_for_resume']}"
                )
            if tool == "check_distributed" and not result.is_error:
                step = data["ranks"][0]["steps"][0]["collectives"] if data["ranks"][0]["steps"] else {}
                extra.append(
                    f"{data['world_size']} gloo ranks, {data['steps_completed']} DDP steps; rank 0 per step: "
                    + ", ".join(f"{k} x{v['count']} ({v['bytes']} B)" for k, v in step.items())
                )
            _show(tool, args, result, elapsed, extra)


def run_demo() -> int:
    """Entry point of `torch-skills --demo` (`python server.py --demo` in a clone)."""
    start_dir = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="torch-skills-demo-") as tmp:
        project = Path(tmp)
        shutil.copy(EXAMPLE, project / EXAMPLE.name)
        print(f"torch-skills demo: example project in {project} (removed afterwards)")
        os.chdir(project)  # the example paths are relative to the project, the server's root
        try:
            anyio.run(_demo, project)
        finally:
            os.chdir(start_dir)
    return 0


if __name__ == "__main__":
    sys.exit(run_demo())
