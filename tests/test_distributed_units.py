"""check_distributed's cross-rank analysis on hand-made rank records (no process group, fast)."""

from __future__ import annotations

import pytest
import torch

from torch_skills.distributed.findings import (
    RankFiles,
    data_findings,
    failure_findings,
    mismatch_findings,
    unused_findings,
)
from torch_skills.distributed.launch import RankExit
from torch_skills.distributed.rank import shard_batch


def _rank(
    rank,
    *,
    ok=True,
    calls=(),
    error=None,
    killed=None,
    signal=None,
    exit_code=None,
    result=None,
    status="step 1 forward",
    crashed_at=None,
    seconds=1.0,
):
    code = 0 if ok else exit_code
    return RankFiles(
        RankExit(rank, 1000 + rank, code, signal, killed, seconds),
        status,
        (result or {"rank": rank, "steps": [], "usage": []}) if ok else None,
        error,
        list(calls),
        crashed_at=crashed_at,
    )


def _call(seq, op="all_reduce", shape=(4,), where="train.py:10"):
    return {"seq": seq, "step": 1, "op": op, "shapes": [list(shape)], "dtype": "float32", "where": where}


def test_the_first_divergent_collective_is_reported_with_every_ranks_call():
    """Same first call, then all_reduce of 3 vs 4 elements: the second call is the divergence."""
    ranks = [
        _rank(0, calls=[_call(0), _call(1, shape=(3,), where="m.py:5")]),
        _rank(1, calls=[_call(0), _call(1, shape=(4,), where="m.py:5")]),
    ]
    (finding,) = mismatch_findings(ranks, culprit_ranks=set())
    assert finding.code == "collective_differs" and finding.where == ["m.py:5"]
    assert [(c.rank, c.seq, c.shapes) for c in finding.calls] == [(0, 1, [[3]]), (1, 1, [[4]])]


def test_a_collective_only_one_rank_calls_is_alone_unless_the_other_rank_failed():
    """A missing call is a mismatch when the short rank is healthy, not when it crashed first."""
    ranks = [_rank(0, calls=[_call(0), _call(1)]), _rank(1, calls=[_call(0)])]
    (finding,) = mismatch_findings(ranks, culprit_ranks=set())
    assert finding.code == "collective_alone" and "Only ranks [0]" in finding.message
    assert mismatch_findings(ranks, culprit_ranks={1}) == []
    crashed_first = [_rank(0, calls=[_call(0)]), _rank(1, calls=[_call(0), _call(1)])]
    assert mismatch_findings(crashed_first, culprit_ranks={0}) == []


def test_identical_sequences_are_no_mismatch():
    """Same ops, shapes and dtypes on every rank (call sites may differ): nothing to report."""
    ranks = [_rank(0, calls=[_call(0, where="a.py:1")]), _rank(1, calls=[_call(0, where="b.py:2")])]
    assert mismatch_findings(ranks, culprit_ranks=set()) == []


def test_the_rank_that_crashed_is_blamed_not_the_one_whose_peer_went_away():
    """Rank 1 died of a signal; rank 0's 'Connection closed by peer' makes it a victim."""
    ranks = [
        _rank(
            0, ok=False, exit_code=1, error={"type": "RuntimeError", "message": "Connection closed by peer"}
        ),
        _rank(1, ok=False, signal=11),
    ]
    (finding,) = failure_findings(ranks)
    assert (finding.code, finding.ranks) == ("rank_crashed", [1])
    assert "Ranks [0] were stopped" in finding.message


def test_a_rank_killed_outside_a_collective_while_its_peer_timed_out_is_the_hung_one():
    """Rank 0 timed out in a collective; rank 1, killed with no error of its own, is the hang."""
    ranks = [
        _rank(
            0, ok=False, exit_code=1, error={"type": "RuntimeError", "message": "Timed out waiting 3000ms"}
        ),
        _rank(1, ok=False, signal=9, killed="after_failure"),
    ]
    (finding,) = failure_findings(ranks)
    assert (finding.code, finding.ranks) == ("rank_hung", [1])
    assert "its peers [0] timed out" in finding.message


def test_ranks_failing_the_same_way_are_one_finding():
    """A deterministic bug raises on every rank: one finding naming all of them."""
    error = {"type": "ValueError", "message": "bad shape", "where": "model.py:3"}
    ranks = [_rank(0, ok=False, exit_code=1, error=error), _rank(1, ok=False, exit_code=1, error=error)]
    (finding,) = failure_findings(ranks)
    assert finding.ranks == [0, 1] and finding.where == ["model.py:3"]


def _usage(rank, unused_by_step):
    return {
        "rank": rank,
        "steps": [],
        "usage": [
            {"step": s + 1, "unused": u, "changed_outside_autograd": []} for s, u in enumerate(unused_by_step)
        ],
        "sites": {},
    }


def test_unused_everywhere_is_always_unused_and_unused_somewhere_is_data_dependent():
    """head.* unused on both ranks in both steps; branch.* only on rank 1's second step."""
    ranks = [
        _rank(0, result=_usage(0, [["head.w"], ["head.w"]])),
        _rank(1, result=_usage(1, [["head.w"], ["head.w", "branch.w"]])),
    ]
    always, sometimes = unused_findings(ranks, "ddp")
    assert (always.code, always.names) == ("always_unused", ["head.w"])
    assert (sometimes.code, sometimes.names, sometimes.ranks) == ("data_dependent_unused", ["branch.w"], [1])


def _loader(rank, rows, batches=4):
    return {
        "rank": rank,
        "steps": [],
        "usage": [],
        "data": {
            "loader": "DataLoader",
            "sampler": "SequentialSampler",
            "batches": batches,
            "fingerprints": rows,
            "shuffled": False,
            "repeat_without_set_epoch": True,
            "set_epoch_changes_order": None,
        },
    }


@pytest.mark.parametrize(
    ("rows0", "rows1", "batches1", "codes"),
    [
        (["a", "b"], ["a", "b"], 4, ["no_distributed_sampler"]),
        (["a", "b"], ["c", "d"], 4, []),
        (["a", "b"], ["c", "d"], 3, ["unequal_batches"]),
    ],
    ids=["same-rows", "disjoint", "unequal-counts"],
)
def test_data_sharding_is_measured_on_the_rows_each_rank_trained_on(rows0, rows1, batches1, codes):
    """Overlap from the rows' hashes; different batch counts per rank are their own finding."""
    ranks = [_rank(0, result=_loader(0, rows0)), _rank(1, result=_loader(1, rows1, batches1))]
    found, report, _ = data_findings(ranks, 2)
    assert [f.code for f in found] == codes
    assert report["batches_per_rank"] == [4, batches1]


def test_a_global_batch_is_cut_into_equal_rank_shares_and_an_uneven_one_is_refused():
    """Every tensor of a (inputs, target) batch is cut along dim 0; 7 rows over 2 ranks raise."""
    x, y = torch.arange(8.0).reshape(4, 2), torch.arange(4)
    share = shard_batch((x, y), 1, 2)
    assert torch.equal(share[0], x[2:]) and torch.equal(share[1], y[2:])
    with pytest.raises(ValueError, match="multiple of 2"):
        shard_batch(torch.zeros(7, 2), 0, 2)


def test_a_rank_that_died_of_a_signal_after_its_peer_exited_is_not_blamed():
    """Rank 1 exited by itself; rank 0 died of a signal with no error of its own (once in CI on a busy
    machine, where it is usually a 'Connection closed by peer' error): rank 1 is named, rank 0 stopped."""
    ranks = [_rank(0, ok=False, signal=6), _rank(1, ok=False, exit_code=3)]
    (finding,) = failure_findings(ranks)
    assert (finding.code, finding.ranks) == ("rank_exited_early", [1])
    assert "Ranks [0] were stopped" in finding.message


def test_a_rank_that_died_of_a_signal_is_blamed_when_no_other_rank_failed_by_itself():
    """Its peer only lost the connection: the crash is the failure."""
    ranks = [_rank(0, ok=False, signal=6), _rank(1, ok=False, exit_code=1, error={"type": "RuntimeError",
             "message": "Connection closed by peer"})]  # fmt: skip
    (finding,) = failure_findings(ranks)
    assert (finding.code, finding.ranks) == ("rank_crashed", [0])


def test_a_rank_that_aborted_after_its_peer_segfaulted_is_stopped_with_it_not_blamed():
    """Once in CI on a busy machine: rank 1 segfaulted in forward, rank 0 reached backward's all-reduce
    and aborted (SIGABRT) on the closed connection a moment later. The first crash is the failure."""
    ranks = [
        _rank(0, ok=False, signal=6, status="probe step backward", crashed_at=100.020),
        _rank(1, ok=False, signal=11, status="probe step forward", crashed_at=100.001),
    ]
    (finding,) = failure_findings(ranks)
    assert (finding.code, finding.ranks) == ("rank_crashed", [1])
    assert "signal 11" in finding.message and "Ranks [0] were stopped" in finding.message


def test_ranks_that_crashed_the_same_way_in_the_same_phase_stay_one_finding():
    ranks = [
        _rank(0, ok=False, signal=11, crashed_at=100.003),
        _rank(1, ok=False, signal=11, crashed_at=100.001),
    ]
    (finding,) = failure_findings(ranks)
    assert finding.ranks == [0, 1] and "stopped" not in finding.message


def test_without_crash_dumps_the_first_exit_the_supervisor_saw_is_the_failure():
    ranks = [
        _rank(0, ok=False, signal=6, status="step 1 backward", seconds=2.5),
        _rank(1, ok=False, signal=9, status="step 1 forward", seconds=2.1),
    ]
    (finding,) = failure_findings(ranks)
    assert finding.ranks == [1]


def test_a_rank_killed_without_a_dump_is_ordered_by_the_exits_the_supervisor_saw():
    """SIGKILL (the OOM killer) leaves no faulthandler dump; its peer's abort does. Dump times and
    exit times are different clocks, so the exits decide: the killed rank went first."""
    ranks = [
        _rank(0, ok=False, signal=9, status="step 1 forward", seconds=2.00),
        _rank(1, ok=False, signal=6, status="step 1 backward", crashed_at=100.5, seconds=2.04),
    ]
    (finding,) = failure_findings(ranks)
    assert finding.ranks == [0] and "signal 9" in finding.message
