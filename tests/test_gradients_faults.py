"""Misbehaving user code through check_gradients: each fault is a clean tool error, and the server
answers the next call normally."""

from __future__ import annotations

import pytest
from mcp import Client

from tests.conftest import FIXTURES

FAULTS = str(FIXTURES / "malicious" / "gradient_faults.py")
HEALTHY = {"model": f"{FIXTURES}/gradient_zoo.py:healthy_mlp", "input_shape": [8, 16]}


async def assert_server_still_answers(client: Client) -> None:
    r = await client.call_tool("check_gradients", HEALTHY)
    assert not r.is_error, r.content
    assert r.structured_content["findings"] == []


async def test_a_segfault_in_the_factory_is_a_crash_error(client: Client):
    """SIGSEGV kills only the forked child; the error names the signal and keeps the output."""
    r = await client.call_tool("check_gradients", {"model": f"{FAULTS}:segfault", "input_shape": [8, 16]})
    assert r.is_error
    text = r.content[0].text
    assert "[crash]" in text and "SIGSEGV" in text
    assert "reading address 0" in text  # what the code printed before it died
    await assert_server_still_answers(client)


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_an_endless_loop_is_stopped_at_timeout_s(client: Client):
    """A factory that never returns is killed after timeout_s and reported as a timeout."""
    r = await client.call_tool(
        "check_gradients", {"model": f"{FAULTS}:endless_loop", "input_shape": [8, 16], "timeout_s": 3}
    )
    assert r.is_error
    text = r.content[0].text
    assert "[timeout]" in text and "timeout_s=3" in text
    assert "a loop that never ends" in text
    await assert_server_still_answers(client)


async def test_print_spam_is_truncated_and_the_check_still_runs(client: Client):
    """Megabytes of prints do not block the run; the result keeps the head and tail of them."""
    r = await client.call_tool("check_gradients", {"model": f"{FAULTS}:print_spam", "input_shape": [8, 16]})
    assert not r.is_error, r.content
    run = r.structured_content["run"]
    assert run["output_truncated"] is True
    assert run["output_bytes"] > 4_000_000
    assert len(run["output"]) < 64 * 1024
    assert "the end of the spam" in run["output"]
    assert r.structured_content["loss"]["finite"] is True
    await assert_server_still_answers(client)


async def test_a_50_gb_allocation_is_an_out_of_memory_error(client: Client):
    """torch.ones(50 GiB) fails under the memory limit and says how to get more room."""
    r = await client.call_tool(
        "check_gradients", {"model": f"{FAULTS}:fifty_gigabytes", "input_shape": [8, 16]}
    )
    assert r.is_error
    text = r.content[0].text
    assert "[out_of_memory]" in text and "memory_limit_gib" in text
    await assert_server_still_answers(client)


async def test_sys_exit_in_the_factory_is_reported_as_such(client: Client):
    """sys.exit(3) in user code becomes a sys_exit error telling where script logic belongs."""
    r = await client.call_tool(
        "check_gradients", {"model": f"{FAULTS}:calls_sys_exit", "input_shape": [8, 16]}
    )
    assert r.is_error
    text = r.content[0].text
    assert "[sys_exit]" in text and "sys.exit(3)" in text and "__main__" in text
    await assert_server_still_answers(client)
