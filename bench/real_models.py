"""The four tools on real models: wall time against a hand-run step, and estimate_memory's error.

Run from the repository root (needs the [zoo] extra for the transformers models; several minutes
on 2 cores):

    python bench/real_models.py                       # every zoo model
    python bench/real_models.py --models gpt2,vit     # a subset

For each model of evals/models/zoo.py it measures, in this one process:
  1. by hand: build the model from its factory, make the batch, one forward, the loss, backward
     and an AdamW step; the median of --repeats fresh runs after one warm-up step of another
     model (this process's first-use costs, which the warm worker has paid as well; transformers is imported before, so
     its import is not in this figure; it is printed apart, since every tool call's fresh worker
     child pays it);
  2. each tool's wall time through the MCP server (in-memory client, the real worker pool):
     check_gradients, estimate_memory (target_device='cpu'), profile_model (1 warm-up and 3 timed
     steps) and verify_checkpoint with load_and_run on a checkpoint saved from the model; the
     ratio to the hand-run step, against the goal of <= 3x. These are steady-state calls: the
     model's first call ("1st call", printed apart) imports its libraries in the worker child,
     after which the warm worker holds them (torch_skills.runner.libraries);
  3. estimate_memory's peak against the measured CPU peak of three real steps
     (torch_skills.memory.groundtruth: the allocator's live bytes from the profiler's events),
     against the goal of <= 2% off.

Known limitations: the machine is shared, so absolute times move with its load (the table says
how loaded it was); the ratios are measured side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.chdir(REPO)

import server  # noqa: E402,F401  (registers torch_skills from this clone)

ZOO = "evals/models/zoo.py"
# model -> (inputs function, needs transformers)
MODELS = {
    "gpt2": ("lm_batch", True),
    "bert": ("lm_batch", True),
    "t5": ("seq2seq_batch", True),
    "llama": ("lm_batch", True),
    "vit": ("image_batch", True),
    "convnext": ("image_pair", True),
    "tiny_gpt": ("token_pair", False),
}
GOAL_RATIO = 3.0
GOAL_MEMORY_ERROR = 0.02


def hand_step(zoo, name: str, inputs: str) -> float:
    """Seconds to build the model, make a batch and run one training step by hand."""
    import torch

    from torch_skills.runner.usercode import call_model, rule_loss, split_batch

    started = time.perf_counter()
    model = getattr(zoo, name)()
    batch = getattr(zoo, inputs)()
    output = call_model(model, batch)
    loss, _ = rule_loss(output, split_batch(model, batch).target)
    loss.backward()
    torch.optim.AdamW(model.parameters(), lr=1e-4).step()
    return time.perf_counter() - started


def measured_peak(zoo, name: str, inputs: str) -> int:
    """CPU peak of three real AdamW steps (the ground truth estimate_memory is compared with)."""
    from torch_skills.memory.groundtruth import measure_real_step
    from torch_skills.memory.trace import StepSpec
    from torch_skills.runner.usercode import rule_loss

    make = getattr(zoo, inputs)
    truth = measure_real_step(
        getattr(zoo, name),
        lambda b: make() if b is None else make(b),
        lambda output, _batch: rule_loss(output)[0],
        StepSpec(mode="train", optimizer="adamw", foreach=False),
        batch_size=None,
        device="cpu",
    )
    return truth.peak_allocated_bytes


def save_checkpoint(zoo, name: str, folder: Path) -> str:
    import torch

    path = folder / f"{name}.pt"
    torch.save(getattr(zoo, name)().state_dict(), path)
    return str(path)


async def tool_times(names: list[str], folder: Path) -> dict[str, dict[str, object]]:
    from mcp import Client

    from tests.owned import entered_in_own_task
    from torch_skills.server import build_server

    zoo = importlib.import_module("evals.models.zoo")
    out: dict[str, dict[str, object]] = {}
    async with entered_in_own_task(lambda: Client(build_server(allow=[folder], prewarm=False))) as client:
        await client.call_tool(  # start the warm worker outside the timings
            "check_gradients", {"model": f"{ZOO}:tiny_gpt", "inputs": f"{ZOO}:token_pair", "device": "cpu"}
        )
        for name in names:
            inputs = MODELS[name][0]
            common = {"model": f"{ZOO}:{name}", "inputs": f"{ZOO}:{inputs}", "device": "cpu"}
            calls = {
                "check_gradients": common,
                "estimate_memory": {**common, "target_device": "cpu"},
                "profile_model": {**common, "warmup_steps": 1, "active_steps": 3},
                "verify_checkpoint": {
                    **common,
                    "path": save_checkpoint(zoo, name, folder),
                    "load_and_run": True,
                },
            }
            row: dict[str, object] = {}
            started = time.perf_counter()  # the first call imports the model's libraries in the child...
            await client.call_tool("check_gradients", common)
            row["first_call"] = time.perf_counter() - started
            await client.call_tool("check_gradients", common)  # ...which the warm worker then imports once
            for tool, arguments in calls.items():
                started = time.perf_counter()
                result = await client.call_tool(tool, arguments)
                row[tool] = time.perf_counter() - started
                if result.is_error:
                    row[f"{tool}_error"] = result.content[0].text[:200]
                elif tool == "estimate_memory":
                    row["estimate"] = result.structured_content["peak_allocated_bytes"]
                    row["method"] = result.structured_content["method"]
            out[name] = row
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=3, help="fresh hand-run steps per model (median)")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    have_transformers = importlib.util.find_spec("transformers") is not None
    skipped = [n for n in names if MODELS[n][1] and not have_transformers]
    names = [n for n in names if n not in skipped]
    if skipped:
        print(f"skipped (no transformers; pip install -e '.[zoo]'): {', '.join(skipped)}")

    started = time.perf_counter()
    if have_transformers:
        import transformers  # noqa: F401
    import_s = time.perf_counter() - started
    zoo = importlib.import_module("evals.models.zoo")
    load = os.getloadavg()[0] / (os.cpu_count() or 1)

    hand_step(
        zoo, "tiny_gpt", "token_pair"
    )  # first-use costs of this process (the worker's zygote pays them too)
    hand = {n: statistics.median(hand_step(zoo, n, MODELS[n][0]) for _ in range(args.repeats)) for n in names}
    peaks = {n: measured_peak(zoo, n, MODELS[n][0]) for n in names}
    with tempfile.TemporaryDirectory(prefix="torch-skills-bench-") as tmp:
        tools = asyncio.run(tool_times(names, Path(tmp)))

    print(
        f"\nreal models on CPU, {os.cpu_count()} cores, load {load:.2f} per core at the start "
        f"(shared machine: absolute times move with other work). import transformers: {import_s:.2f} s.\n"
    )
    tool_names = ["check_gradients", "estimate_memory", "profile_model", "verify_checkpoint"]
    head = f"{'model':10s} {'by hand':>8s} {'1st call':>9s} " + " ".join(f"{t:>22s}" for t in tool_names)
    head += f" {'measured MiB':>13s} {'estimate MiB':>13s} {'error':>7s}"
    print(head)
    worst_ratio, errors, failures = 0.0, [], []
    for n in names:
        row = tools[n]
        cells = []
        for t in tool_names:
            seconds = float(row[t])  # type: ignore[arg-type]
            ratio = seconds / hand[n]
            worst_ratio = max(worst_ratio, ratio)
            mark = "!" if f"{t}_error" in row else ""
            cells.append(f"{seconds:7.2f} s ({ratio:5.1f}x){mark:1s}".rjust(22))
            if mark:
                failures.append(f"{n} {t}: {row[f'{t}_error']}")
        estimate = int(row.get("estimate") or 0)  # type: ignore[call-overload]
        error = (estimate - peaks[n]) / peaks[n] if peaks[n] else 0.0
        errors.append(abs(error))
        print(
            f"{n:10s} {hand[n]:7.2f}s {float(row['first_call']):8.2f}s "
            + " ".join(cells)
            + f" {peaks[n] / 2**20:13.2f} {estimate / 2**20:13.2f} "
            f"{error:+7.2%} {row.get('method', '')}"
        )
    print(
        f"\nworst tool / hand-run ratio {worst_ratio:.1f}x (goal <= {GOAL_RATIO:g}x); estimate_memory error: "
        f"median {statistics.median(errors):.2%}, worst {max(errors):.2%} (goal <= {GOAL_MEMORY_ERROR:.0%})"
    )
    for failure in failures:
        print("tool error:", failure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
