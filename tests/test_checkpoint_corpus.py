"""The corpus through the real tool over MCP: every payload flagged and never run, no false alarms."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.checkpoint_support import shared_corpus
from tests.fixtures.checkpoint_corpus import build_corpus, write_manifest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def corpus():
    return shared_corpus()


def test_the_corpus_is_large_and_varied_enough(corpus):
    """At least 25 payloads across many bypass families and 10 benign kinds, all untouched so far."""
    assert len(corpus.malicious) >= 25 and len(corpus.benign) >= 10
    assert len({s.family for s in corpus.malicious}) >= 15
    assert not any(s.executed() for s in corpus.malicious)


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_every_malicious_sample_is_unsafe_over_mcp_and_nothing_runs(client, corpus):
    """Each payload is reported unsafe (a global or a blocking problem) and its sentinel is unchanged."""
    missed, ran = [], []
    for sample in corpus.malicious:
        r = await client.call_tool("verify_checkpoint", {"path": str(sample.path)})
        assert not r.is_error, (sample.name, r.content)
        result = r.structured_content
        blocking = [p for p in result["problems"] if p["blocks_safe"]]
        if result["safe"] or result["loaded"] or not (result["unsafe_global_count"] or blocking):
            missed.append(sample.name)
        if sample.executed():
            ran.append(sample.name)
    assert missed == [] and ran == []


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_every_benign_sample_is_safe_and_loads_with_zero_false_alarms(client, corpus):
    """Every benign checkpoint kind scans safe, names no unsafe global and opens without error."""
    alarms = {}
    for sample in corpus.benign:
        r = await client.call_tool("verify_checkpoint", {"path": str(sample.path)})
        assert not r.is_error, (sample.name, r.content)
        result = r.structured_content
        if (
            not result["safe"]
            or result["unsafe_global_count"]
            or not result["loaded"]
            or result["load_error"]
        ):
            alarms[sample.name] = result["summary"]
    assert alarms == {}


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
def test_every_payload_really_runs_when_loaded_the_usual_way(tmp_path):
    """Liveness: a separate copy, fired in a subprocess the usual way, changes every sentinel.

    Without this, "the sentinel was not created" could mean a broken payload rather than a
    scanner that never ran it.
    """
    copy = build_corpus(tmp_path / "live")
    manifest = tmp_path / "manifest.json"
    write_manifest(copy.malicious, manifest)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "BROWSER": "touch"}
    subprocess.run(
        [sys.executable, "-m", "tests.fixtures.checkpoint_corpus", "--fire", str(manifest)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=300,
        check=True,
    )
    deadline = time.monotonic() + 15  # Popen-based payloads finish asynchronously
    while time.monotonic() < deadline and not all(s.executed() for s in copy.malicious):
        time.sleep(0.2)
    assert [s.name for s in copy.malicious if not s.executed()] == []


def test_the_corpus_writes_cpu_tensors_whatever_the_default_device(tmp_path):
    """Built while another default device is set (a CUDA test in the same process once left cuda:0), the files
    still hold real CPU tensors: here 'meta', whose tensors have no data to write."""
    import torch

    with torch.device("meta"):
        corpus = build_corpus(tmp_path)
    state = torch.load(next(s.path for s in corpus.benign if s.name == "plain_state_dict"), weights_only=True)
    assert all(t.device.type == "cpu" for t in state.values())
