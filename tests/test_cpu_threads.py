"""cpu_threads on every torch tool: the default's rule, set before the model runs, reported in `run`."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from mcp import Client

from tests.owned import entered_in_own_task
from torch_skills.runner.threads import default_threads, rank_threads, run_threads
from torch_skills.server import build_server

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TOOLS = ("check_gradients", "estimate_memory", "profile_model", "verify_checkpoint", "check_distributed")


# -- the rule, as a pure function ------------------------------------------------------------------
def test_the_default_is_the_idle_cores_rounded_and_at_least_one():
    """cores - 1-minute load, rounded to a whole core; a machine busier than its cores still gets 1."""
    assert default_threads(cores=2, load=0.1, torch_default=2) == 2
    assert default_threads(cores=2, load=0.75, torch_default=2) == 1  # 1.25 idle cores
    assert default_threads(cores=2, load=5.85, torch_default=2) == 1  # the busy project machine
    assert default_threads(cores=16, load=3.4, torch_default=16) == 13
    assert default_threads(cores=8, load=None, torch_default=8) == 8  # no load average: every core


def test_the_default_never_exceeds_torch_own_default_or_the_cores():
    """Hyperthreads or a wide affinity mask do not raise the count above torch's one per physical core."""
    assert default_threads(cores=64, load=0.0, torch_default=32) == 32
    assert default_threads(cores=4, load=0.0, torch_default=8) == 4


def test_ranks_split_the_default_and_keep_an_explicit_count():
    """Distributed ranks share what the rule gave the call; cpu_threads given is per rank as asked."""
    assert rank_threads(None, process_threads=8, ranks=2) == 4
    assert rank_threads(None, process_threads=1, ranks=4) == 1
    assert rank_threads(3, process_threads=8, ranks=2) == 3


def test_run_threads_sets_torch_and_returns_the_count():
    """The count returned is the one torch now runs with."""
    before = torch.get_num_threads()
    try:
        assert run_threads(3) == 3 == torch.get_num_threads()
        assert 1 <= run_threads(None) <= 3
    finally:
        torch.set_num_threads(before)


# -- through the server ----------------------------------------------------------------------------
async def test_every_tool_that_runs_the_model_offers_one_cpu_threads_argument(client):
    """The five torch tools take cpu_threads with the same description, which states the rule."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    schemas = [tools[name].input_schema["properties"]["cpu_threads"] for name in TOOLS]
    assert all(s == schemas[0] for s in schemas), schemas
    assert schemas[0]["type"] == "integer" and "load" in schemas[0]["description"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project folder with the probe model and a checkpoint of it."""
    folder = tmp_path_factory.mktemp("threads")
    shutil.copy(FIXTURES / "thread_probe.py", folder / "thread_probe.py")
    torch.save({"linear." + k: v for k, v in torch.nn.Linear(8, 2).state_dict().items()}, folder / "probe.pt")
    return folder


@pytest.fixture(scope="module")
async def own_client(project: Path):
    """A server whose allowed root is that folder."""
    async with entered_in_own_task(lambda: Client(build_server(allow=[project]))) as c:
        yield c


def _arguments(tool: str, project: Path, **extra) -> dict:
    probe = project / "thread_probe.py"
    arguments = {"model": f"{probe}:build", "inputs": f"{probe}:batch", "device": "cpu", **extra}
    if tool == "profile_model":
        arguments.update(warmup_steps=1, active_steps=3)
    if tool == "verify_checkpoint":
        arguments.update(path=str(project / "probe.pt"), load_and_run=True)
    return arguments


def _forward_threads(output: str) -> set[int]:
    return {int(n) for n in re.findall(r"threads in forward: (\d+)", output)}


@pytest.mark.parametrize("tool", ["check_gradients", "estimate_memory", "profile_model", "verify_checkpoint"])
async def test_each_tool_runs_the_model_with_the_threads_asked_and_reports_them(own_client, project, tool):
    """cpu_threads=3 (no machine's default here) is what every forward ran with and what run says."""
    result = await own_client.call_tool(tool, _arguments(tool, project, cpu_threads=3))
    assert not result.is_error, result.content[0].text
    run = result.structured_content["run"]
    assert _forward_threads(run["output"]) == {3}, run["output"]
    assert run["cpu_threads"] == 3


async def test_a_call_without_cpu_threads_reports_what_its_model_ran_with(own_client, project):
    """The default's count is the one the forward saw, within [1, cores]."""
    result = await own_client.call_tool("check_gradients", _arguments("check_gradients", project))
    run = result.structured_content["run"]
    assert _forward_threads(run["output"]) == {run["cpu_threads"]}
    assert 1 <= run["cpu_threads"] <= torch.get_num_threads()


async def test_profile_wording_names_the_threads_the_default_run_used(own_client, project):
    """With no cpu_threads, the result, the device name and the summary give the count actually used."""
    result = await own_client.call_tool("profile_model", _arguments("profile_model", project))
    data = result.structured_content
    used = data["run"]["cpu_threads"]
    words = f"({used} thread)" if used == 1 else f"({used} threads)"
    assert data["cpu_threads"] == used and data["device_name"].endswith(words)
    assert words in data["summary"] and len(re.findall(r"\(\d+ threads?\)", data["summary"])) == 1


@pytest.mark.slow
async def test_check_distributed_runs_each_rank_with_the_threads_asked(own_client, project):
    """cpu_threads is per rank: every rank's forward ran with it and run.cpu_threads says so."""
    arguments = _arguments("check_distributed", project, cpu_threads=3, steps=1)
    result = await own_client.call_tool("check_distributed", arguments)
    assert not result.is_error, result.content[0].text
    run = result.structured_content["run"]
    assert _forward_threads(run["output"]) == {3} and run["cpu_threads"] == 3
