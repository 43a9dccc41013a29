"""The tools on real models of 10-100M parameters: wall time against a hand-run step, and estimate_memory's error.

Run from the repository root (needs the [zoo] extra for transformers; several minutes on 2 cores):

    python bench/real_models.py                       # every model of bench/real_model_zoo.py
    python bench/real_models.py --models gpt2,vit     # a subset
    python bench/real_models.py --zoo tiny            # the 2-layer configs of evals/models/zoo.py

For each model (GPT-2 27M, BERT 28M, ViT 15M, ResNet-18 11M; `--zoo tiny` for the tiny ones) it
measures, in this one process:
  1. by hand: build the model from its factory, make the batch, one forward, the loss, backward
     and an AdamW step; the median of --repeats fresh runs, with the thread count the tools'
     default rule gives at that moment (torch_skills.runner.threads), after one warm-up step of
     another model (first-use costs, which the warm worker has paid as well; transformers is
     imported before, so its import is not in this figure; it is printed apart, since every
     tool call's fresh worker child pays it);
  2. each tool's wall time through the MCP server (in-memory client, the real worker pool):
     check_gradients, estimate_memory (target_device='cpu'), profile_model (1 warm-up and 3 timed
     steps, the fewest it takes) and verify_checkpoint with load_and_run on a checkpoint saved
     from the model; the ratio to the hand-run step, against the goal of <= 3x, and the threads
     each call ran with (run.cpu_threads). These are steady-state calls: the model's first call
     ("1st call", printed apart) imports its libraries in the worker child, after which the warm
     worker holds them (torch_skills.runner.libraries);
  3. estimate_memory's peak against the measured CPU peak of three real steps
     (torch_skills.memory.groundtruth: the allocator's live bytes from the profiler's events),
     against the goal of <= 2% off, measured on the thread count the estimate_memory call ran
     with: oneDNN's convolution kernels take scratch per thread (ViT's patch-embedding backward:
     5.3 MB on 1 thread, 10.2 MB on 2), so a peak measured on another count differs by that.
The table is printed and appended to --out (default bench/real_models.md) with the date and load.

Known limitations: the machine is shared, so absolute times move with its load (the table gives
the 1-minute load per core before and after); the hand steps are measured right before each
model's tool calls so the two see the same load, but a ratio is still noisy under load.
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

# zoo -> (file, {model -> (inputs function, needs transformers)})
ZOOS = {
    "real": (
        "bench/real_model_zoo.py",
        {
            "gpt2": ("lm_batch", True),
            "bert": ("lm_batch", True),
            "vit": ("image_batch", True),
            "resnet": ("image_pair", True),
        },
    ),
    "tiny": (
        "evals/models/zoo.py",
        {
            "gpt2": ("lm_batch", True),
            "bert": ("lm_batch", True),
            "t5": ("seq2seq_batch", True),
            "llama": ("lm_batch", True),
            "vit": ("image_batch", True),
            "convnext": ("image_pair", True),
            "tiny_gpt": ("token_pair", False),
        },
    ),
}
TOOLS = ["check_gradients", "estimate_memory", "profile_model", "verify_checkpoint"]
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


def measured_peak(zoo, name: str, inputs: str, threads: int | None = None) -> int:
    """CPU peak of three real AdamW steps (the ground truth estimate_memory is compared with), on
    `threads` threads when given (the estimate's own count: kernel scratch is per thread)."""
    import torch

    from torch_skills.memory.groundtruth import measure_real_step
    from torch_skills.memory.trace import StepSpec
    from torch_skills.runner.usercode import rule_loss

    make = getattr(zoo, inputs)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        truth = measure_real_step(
            getattr(zoo, name),
            lambda b: make() if b is None else make(b),
            lambda output, _batch: rule_loss(output)[0],
            StepSpec(mode="train", optimizer="adamw", foreach=False),
            batch_size=None,
            device="cpu",
        )
    finally:
        torch.set_num_threads(before)
    return truth.peak_allocated_bytes


def save_checkpoint(zoo, name: str, folder: Path) -> str:
    import torch

    path = folder / f"{name}.pt"
    torch.save(getattr(zoo, name)().state_dict(), path)
    return str(path)


def load_per_core() -> float:
    return os.getloadavg()[0] / (os.cpu_count() or 1)


async def measure(zoo_file: str, models: dict[str, str], repeats: int, folder: Path) -> dict[str, dict]:
    """Per model: the hand-run step (median of `repeats`), each tool call's seconds and threads."""
    import torch
    from mcp import Client

    from tests.owned import entered_in_own_task
    from torch_skills.runner.threads import run_threads
    from torch_skills.server import build_server

    zoo = importlib.import_module(zoo_file.removesuffix(".py").replace("/", "."))
    out: dict[str, dict] = {}
    async with entered_in_own_task(lambda: Client(build_server(allow=[folder], prewarm=False))) as client:
        tiny = {"model": "evals/models/zoo.py:tiny_gpt", "inputs": "evals/models/zoo.py:token_pair"}
        await client.call_tool("check_gradients", {**tiny, "device": "cpu"})  # the warm worker, untimed
        for name, inputs in models.items():
            common = {"model": f"{zoo_file}:{name}", "inputs": f"{zoo_file}:{inputs}", "device": "cpu"}
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
            row: dict[str, object] = {"load_before": load_per_core()}
            started = time.perf_counter()  # the first call imports the model's libraries in the child...
            await client.call_tool("check_gradients", common)
            row["first_call"] = time.perf_counter() - started
            await client.call_tool("check_gradients", common)  # ...which the warm worker then imports once
            threads = torch.get_num_threads()
            row["hand_threads"] = run_threads(None)  # what the tools' default gives now
            try:
                row["hand"] = statistics.median(hand_step(zoo, name, inputs) for _ in range(repeats))
            finally:
                torch.set_num_threads(threads)
            row["params"] = sum(p.numel() for p in getattr(zoo, name)().parameters())
            for tool, arguments in calls.items():
                started = time.perf_counter()
                result = await client.call_tool(tool, arguments)
                row[tool] = time.perf_counter() - started
                if result.is_error:
                    row[f"{tool}_error"] = result.content[0].text[:200]
                    continue
                data = result.structured_content
                row[f"{tool}_threads"] = data["run"].get("cpu_threads")
                row[f"{tool}_worker_s"] = data["run"]["wall_time_s"]
                if tool == "estimate_memory":
                    row["estimate"] = data["peak_allocated_bytes"]
                    row["method"] = data["method"]
            row["peak"] = measured_peak(zoo, name, inputs, row.get("estimate_memory_threads"))
            row["load_after"] = load_per_core()
            out[name] = row
    return out


def table(rows: dict[str, dict], import_s: float) -> tuple[str, list[str]]:
    """The markdown table, and one line per failed tool call."""
    head = "| model | params | by hand (threads) | 1st call | " + " | ".join(TOOLS)
    head += " | measured MiB | estimate MiB | error | load/core |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    worst, errors, failures = 0.0, [], []
    for name, row in rows.items():
        cells = []
        for tool in TOOLS:
            ratio = float(row[tool]) / float(row["hand"])
            worst = max(worst, ratio)
            if f"{tool}_error" in row:
                failures.append(f"{name} {tool}: {row[f'{tool}_error']}")
                cells.append(f"{float(row[tool]):.2f} s error")
            else:
                cells.append(f"{float(row[tool]):.2f} s **{ratio:.1f}x** ({row[f'{tool}_threads']} th)")
        estimate, peak = int(row.get("estimate") or 0), int(row["peak"])
        error = (estimate - peak) / peak if peak else 0.0
        errors.append(abs(error))
        lines.append(
            f"| {name} | {int(row['params']) / 1e6:.1f}M | {float(row['hand']):.2f} s ({row['hand_threads']}) "
            f"| {float(row['first_call']):.2f} s | "
            + " | ".join(cells)
            + f" | {peak / 2**20:.1f} | {estimate / 2**20:.1f} | {error:+.2%} {row.get('method', '')} "
            f"| {float(row['load_before']):.2f}-{float(row['load_after']):.2f} |"
        )
    lines.append("")
    lines.append(
        f"worst tool / hand-run ratio {worst:.1f}x (goal <= {GOAL_RATIO:g}x); estimate_memory error: "
        f"median {statistics.median(errors):.2%}, worst {max(errors):.2%} (goal <= {GOAL_MEMORY_ERROR:.0%}); "
        f"import transformers {import_s:.2f} s (paid by each 1st call, not by the hand steps)"
    )
    return "\n".join(lines), failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", choices=sorted(ZOOS), default="real")
    parser.add_argument("--models", default="", help="comma-separated subset of the zoo's models")
    parser.add_argument("--repeats", type=int, default=3, help="fresh hand-run steps per model (median)")
    parser.add_argument(
        "--out", default=str(REPO / "bench" / "real_models.md"), help="markdown log to append to"
    )
    args = parser.parse_args()
    zoo_file, catalogue = ZOOS[args.zoo]
    names = [n for n in args.models.split(",") if n] or list(catalogue)
    have_transformers = importlib.util.find_spec("transformers") is not None
    skipped = [n for n in names if catalogue[n][1] and not have_transformers]
    names = [n for n in names if n not in skipped]
    if skipped:
        print(f"skipped (no transformers; pip install -e '.[zoo]'): {', '.join(skipped)}")

    started = time.perf_counter()
    if have_transformers:
        import transformers  # noqa: F401
    import_s = time.perf_counter() - started
    tiny = importlib.import_module("evals.models.zoo")
    hand_step(tiny, "tiny_gpt", "token_pair")  # first-use costs of this process (the zygote pays them too)
    with tempfile.TemporaryDirectory(prefix="torch-skills-bench-") as tmp:
        rows = asyncio.run(measure(zoo_file, {n: catalogue[n][0] for n in names}, args.repeats, Path(tmp)))
    text, failures = table(rows, import_s)
    heading = (
        f"{time.strftime('%Y-%m-%d %H:%M')}: `real_models.py --zoo {args.zoo}` on CPU, {os.cpu_count()} cores "
        "(shared machine: absolute times move with other work; 'th' = threads the call ran with)"
    )
    print(f"\n{heading}\n\n{text}")
    for failure in failures:
        print("tool error:", failure)
    with open(args.out, "a") as log:
        log.write(f"\n{heading}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
