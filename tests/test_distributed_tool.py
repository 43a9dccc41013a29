"""check_distributed end to end through the MCP client: each finding kind, FSDP2, containment.

Each call forks real gloo ranks from the warm worker (about a second each on an idle machine);
the ones that wait out a timeout, and most of the rest, are in the slow set.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

import pytest
from mcp import Client

from tests.conftest import FIXTURES

ZOO = str(FIXTURES / "distributed_zoo.py")
LINES = (FIXTURES / "distributed_zoo.py").read_text().splitlines()
BATCH = {"input_shape": [8, 16]}


async def _call(client: Client, factory: str, **arguments) -> dict:
    r = await client.call_tool("check_distributed", {"model": f"{ZOO}:{factory}", **arguments})
    assert not r.is_error, r.content
    return r.structured_content


def _kinds(data: dict) -> list[tuple[str, str]]:
    return [(f["kind"], f["code"]) for f in data["findings"]]


async def test_a_healthy_model_on_two_ranks_has_no_findings(client: Client):
    """Identical replicas, the one-process gradient, one DDP bucket all-reduce per step per rank."""
    data = await _call(client, "healthy_mlp", **BATCH)
    assert data["findings"] == [], data["findings"]
    assert data["steps_completed"] == 3 and data["backend"] == "gloo"
    assert [r["outcome"] for r in data["ranks"]] == ["ok", "ok"]
    nbytes = (16 * 32 + 32 + 32 * 4 + 4) * 4  # every float32 gradient, once
    for rank in data["ranks"]:
        assert [s["collectives"] for s in rank["steps"]] == [
            {"all_reduce": {"count": 1, "bytes": nbytes}}
        ] * 3
    assert data["ddp_buckets"][0]["bytes"] == nbytes
    assert data["gradient_check"]["ratio_median"] == pytest.approx(1.0, rel=1e-5)


async def test_a_global_batch_that_does_not_split_over_the_ranks_is_a_tool_error(client: Client):
    """input_shape[0] is the global batch: 7 rows over 2 ranks is refused with the next step."""
    r = await client.call_tool("check_distributed", {"model": f"{ZOO}:healthy_mlp", "input_shape": [7, 16]})
    assert r.is_error and "multiple of 2" in r.content[0].text


@pytest.mark.slow
async def test_a_module_never_called_is_always_unused_with_its_assignment_line(client: Client):
    """aux_head is built but never called: named, always unused, pointing at `self.aux_head =`."""
    data = await _call(client, "dead_head", **BATCH)
    assert _kinds(data) == [("unused_parameters", "always_unused")]
    finding = data["findings"][0]
    assert finding["names"] == ["aux_head.bias", "aux_head.weight"]
    line = int(finding["where"][0].rsplit(":", 1)[1])
    assert "self.aux_head =" in LINES[line - 1]
    assert finding["measured"]["bytes"] == (16 * 3 + 3) * 4


@pytest.mark.slow
async def test_a_branch_chosen_by_the_batch_is_data_dependent_unused(client: Client):
    """Rank 0's rows take `pos`, rank 1's `neg`: each branch unused on one rank, not always."""
    data = await _call(client, "routed", inputs=f"{ZOO}:routed_inputs")
    unused = [f for f in data["findings"] if f["kind"] == "unused_parameters"]
    assert [f["code"] for f in unused] == ["data_dependent_unused"]
    assert set(unused[0]["names"]) == {"pos.weight", "pos.bias", "neg.weight", "neg.bias"}
    assert unused[0]["ranks"] == [0, 1]


@pytest.mark.slow
async def test_a_collective_only_rank_zero_calls_is_named_with_its_line(client: Client):
    """rank 0 all-reduces a metric in forward; rank 1 goes on to DDP's bucket: the first divergence."""
    data = await _call(client, "rank_zero_metric", **BATCH, hang_timeout_s=5)
    mismatch = [f for f in data["findings"] if f["kind"] == "collective_mismatch"]
    assert len(mismatch) == 1
    calls = {c["rank"]: c for c in mismatch[0]["calls"]}
    assert calls[0]["op"] == "all_reduce" and calls[0]["shapes"] == [[1]]
    assert calls[0]["where"].startswith(ZOO) and calls[1]["where"] == "DDP gradient bucket 0"


@pytest.mark.slow
async def test_a_collective_whose_shape_depends_on_the_rank_is_a_mismatch_not_a_hang(client: Client):
    """all_reduce of 3 vs 4 elements: reported with both shapes, and the call returns."""
    started = time.monotonic()
    data = await _call(client, "shape_by_rank", **BATCH, hang_timeout_s=3)
    assert time.monotonic() - started < 60
    assert _kinds(data)[0] == ("collective_mismatch", "collective_differs")
    shapes = {c["rank"]: c["shapes"] for c in data["findings"][0]["calls"]}
    assert shapes == {0: [[3]], 1: [[4]]}


@pytest.mark.slow
async def test_a_parameter_changed_in_forward_makes_replicas_diverge(client: Client):
    """`shift` is nudged in place by each rank's batch: it differs after step 1, cause named."""
    data = await _call(client, "running_scale", **BATCH)
    (finding,) = [f for f in data["findings"] if f["kind"] == "replica_divergence"]
    assert finding["names"] == ["shift"] and finding["measured"]["step"] == 1
    assert finding["measured"]["largest_difference"] > 0
    assert "outside autograd" in finding["message"] and finding["where"][0].startswith(ZOO)


@pytest.mark.slow
async def test_a_summed_loss_is_a_factor_of_world_size(client: Client):
    """A sum-reduced loss: the averaged gradient is exactly world_size times too small."""
    data = await _call(client, "healthy_mlp", input_shape=[12, 16], loss=f"{ZOO}:summed_loss", world_size=3)
    assert _kinds(data) == [("gradient_scale", "summed_loss")]
    assert data["gradient_check"]["ratio_median"] == pytest.approx(3.0, rel=1e-4)


@pytest.mark.slow
async def test_batchnorm_is_explained_not_flagged(client: Client):
    """BatchNorm's per-rank statistics give a note, not a finding."""
    data = await _call(client, "batchnorm_net", **BATCH)
    assert data["findings"] == []
    assert any("SyncBatchNorm" in n for n in data["notes"])


@pytest.mark.slow
async def test_a_loader_without_distributed_sampler_gives_every_rank_the_same_samples(client: Client):
    """A plain DataLoader in every rank: 100% overlap, measured on the rows trained on."""
    data = await _call(client, "healthy_mlp", data=f"{ZOO}:loader_without_sampler")
    assert _kinds(data) == [("data_sharding", "no_distributed_sampler")]
    assert data["data"]["overlap"] == 1.0


@pytest.mark.slow
async def test_a_distributed_sampler_gives_disjoint_samples_and_a_set_epoch_note(client: Client):
    """DistributedSampler: no finding; the note says its order repeats until set_epoch is called."""
    data = await _call(client, "healthy_mlp", data=f"{ZOO}:loader_with_sampler")
    assert data["findings"] == [] and data["data"]["overlap"] == 0.0
    assert data["data"]["sampler"] == "DistributedSampler"
    assert any("set_epoch" in n for n in data["notes"])


@pytest.mark.slow
async def test_unequal_batch_counts_and_a_fixed_shuffle_are_data_sharding_findings(client: Client):
    """Hand-split shards (5 vs 3 batches) and a sampler shuffling with a fixed seed every epoch."""
    uneven = await _call(client, "healthy_mlp", data=f"{ZOO}:loader_uneven")
    assert _kinds(uneven) == [("data_sharding", "unequal_batches")], uneven["findings"]
    assert uneven["data"]["batches_per_rank"] == [5, 3]
    fixed = await _call(client, "healthy_mlp", data=f"{ZOO}:loader_fixed_shuffle")
    assert _kinds(fixed) == [("data_sharding", "order_repeats")], fixed["findings"]


@pytest.mark.slow
async def test_fsdp2_shards_blocks_and_counts_all_gathers_and_reduce_scatters(client: Client):
    """fully_shard on each block and the root: no finding, gradients match one process, memory per rank."""
    data = await _call(client, "blocks", **BATCH, strategy="fsdp")
    assert data["findings"] == [], data["findings"]
    step = data["ranks"][0]["steps"][0]["collectives"]
    assert step["all_gather"]["count"] >= 4 and step["reduce_scatter"]["count"] == 4  # 3 blocks + root
    assert "all_reduce" not in step
    assert data["gradient_check"]["max_relative_difference"] < 1e-3
    assert len(data["memory"]["per_rank_peak_bytes"]) == 2
    assert data["memory"]["estimate_bytes"] > 0  # estimate_memory's per-rank figure, beside the measured one


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "code", "where_line"),
    [
        ("raise", "rank_error", "ran out of patience"),
        ("exit", "rank_exited_early", None),
        ("segfault", "rank_crashed", "ctypes.string_at(0)"),
        ("hang", "rank_hung", "time.sleep(0.1)"),
    ],
)
async def test_a_failing_rank_ends_the_call_with_a_finding_naming_it(client: Client, how, code, where_line):
    """Rank 1 raises / exits / segfaults / sleeps forever: one rank_failure finding names rank 1 and
    its line; rank 0, blocked in the bucket all-reduce, is stopped and not blamed."""
    started = time.monotonic()
    data = await _call(client, "fail_on_rank", model_kwargs={"how": how}, **BATCH, hang_timeout_s=8)
    assert time.monotonic() - started < 60
    failures = [f for f in data["findings"] if f["kind"] == "rank_failure"]
    assert [(f["code"], f["ranks"]) for f in failures] == [(code, [1])]
    if where_line:
        path, line = failures[0]["where"][0].rsplit(":", 1)
        assert path == ZOO and where_line in LINES[int(line) - 1]
    assert data["ranks"][0]["outcome"] != "ok" and data["steps_completed"] == 0


@pytest.mark.slow
async def test_every_rank_dies_with_a_job_that_times_out(client: Client):
    """All ranks stuck outside collectives past timeout_s: the call fails, and no rank survives it."""
    with tempfile.TemporaryDirectory(
        dir=FIXTURES
    ) as pid_dir:  # under an allowed root: model_kwargs paths are checked
        r = await client.call_tool(
            "check_distributed",
            {"model": f"{ZOO}:stuck", "model_kwargs": {"pid_dir": pid_dir}, **BATCH, "timeout_s": 15},
        )
        assert r.is_error and "timeout" in r.content[0].text.lower()
        pids = [int(Path(pid_dir, f).read_text()) for f in os.listdir(pid_dir)]
    assert len(pids) == 2, "both ranks reach forward (raise timeout_s on a loaded machine)"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        await asyncio.sleep(0.1)
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]


@pytest.mark.slow
async def test_concurrent_calls_never_share_a_store(client: Client):
    """Two calls at once (the pool runs two jobs): each gets its own FileStore and both succeed."""
    a, b = await asyncio.gather(
        client.call_tool("check_distributed", {"model": f"{ZOO}:healthy_mlp", **BATCH}),
        client.call_tool("check_distributed", {"model": f"{ZOO}:healthy_mlp", "input_shape": [4, 16]}),
    )
    assert not a.is_error and not b.is_error
    assert a.structured_content["findings"] == [] == b.structured_content["findings"]


async def test_cuda_without_a_gpu_is_a_tool_error_that_names_the_fix(client: Client):
    """device='cuda' on a machine without CUDA: refused before any rank starts."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal is for machines without it")
    r = await client.call_tool(
        "check_distributed", {"model": f"{ZOO}:healthy_mlp", **BATCH, "device": "cuda"}
    )
    assert r.is_error and "cpu" in r.content[0].text


@pytest.mark.gpu
async def test_nccl_ranks_on_two_gpus_have_no_findings_on_a_healthy_model(client: Client):
    """device='cuda': one nccl rank per GPU, the same checks, peak memory from the CUDA allocator."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices: nccl refuses two ranks on one GPU")
    data = await _call(client, "healthy_mlp", **BATCH, device="cuda")
    assert data["backend"] == "nccl" and data["findings"] == []
    assert all(r["peak_memory_bytes"] > 0 for r in data["ranks"])
