"""route(): symptom text to specialist skills, or one clarifying question."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, ROUTER_NAME, SkillPack
from torch_skills.skillpack.route import Router


@pytest.fixture(scope="module")
def router() -> Router:
    return Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))


ROUTES = [
    ("CUDA out of memory. Tried to allocate 20.00 MiB", "tensor-operations-and-memory"),
    ("nvidia-smi says my VRAM is full after 3 batches", "tensor-operations-and-memory"),
    ("how do I put my layers in a list so the optimizer sees them", "module-design-patterns"),
    ("NCCL watchdog timeout on rank 5 after an hour", "distributed-training-strategies"),
    ("do I need a GradScaler with bfloat16?", "mixed-precision-and-optimization"),
    ("my training is sluggish, only 200 samples/sec", "performance-profiling"),
    ("loss turns into nan around step 4000", "debugging-techniques"),
    ("Unexpected key(s) in state_dict: module.fc.weight", "checkpointing-and-reproducibility"),
    ("need a straight-through estimator for my quantizer", "custom-autograd-functions"),
]


@pytest.mark.parametrize(("query", "skill"), ROUTES)
def test_a_typical_query_is_routed_to_its_specialist(router: Router, query: str, skill: str):
    """Paraphrases and pasted errors land on the right first skill."""
    result = router.route(query)
    assert result.clarify is None
    assert result.skills[0] == skill
    assert result.evidence[skill]


def test_nan_under_amp_starts_with_debugging_then_mixed_precision(router: Router):
    """Diagnose first: find where the NaN is born, then fix the precision."""
    result = router.route("loss becomes NaN as soon as I enable autocast with fp16")
    assert result.skills[:2] == ["debugging-techniques", "mixed-precision-and-optimization"]
    assert result.tools == ["check_gradients"]


def test_slow_training_with_amp_in_mind_starts_with_profiling(router: Router):
    """Measure before optimizing, even when the user already picked a fix."""
    result = router.route("training is slow, should I turn on AMP?")
    assert result.skills[0] == "performance-profiling"
    assert "mixed-precision-and-optimization" in result.skills
    assert result.rule is not None


def test_out_of_memory_under_fsdp_starts_with_distributed(router: Router):
    """Per-rank memory depends on the sharding setup."""
    result = router.route("OOM on every rank with FSDP but a single GPU run fits")
    assert result.skills[0] == "distributed-training-strategies"
    assert "tensor-operations-and-memory" in result.skills


@pytest.mark.parametrize(
    "query", ["fix my training", "my model is not working", "optimize my model", "help with pytorch"]
)
def test_a_vague_query_gets_one_clarifying_question(router: Router, query: str):
    """No symptom, no route: ask once."""
    result = router.route(query)
    assert result.skills == []
    assert result.clarify is not None and result.clarify.endswith("?")
    assert result.confidence == 0.0


@pytest.mark.parametrize(
    "query", ["", "   ", "¿Por qué mi modelo no aprende nada?", "模型训练很慢怎么办", "!!!???", "\x00\x01"]
)
def test_empty_junk_or_non_english_input_gets_a_clean_answer(router: Router, query: str):
    """Nothing routable yields the clarifying question, never an exception."""
    result = router.route(query)
    assert result.clarify is not None or result.skills


def test_a_one_megabyte_log_is_routed_by_its_error_line(router: Router):
    """Huge pasted logs keep their tail, where the error is, and route quickly."""
    log = (
        "INFO step 1 loss 2.3\n" * 50_000
        + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    assert len(log) > 1_000_000
    result = router.route(log)
    assert result.skills[0] == "tensor-operations-and-memory"


def test_routing_follows_edits_to_the_router_skill(tmp_path: Path):
    """The router's SKILL.md is the only source of routing knowledge."""
    skills = tmp_path / "skills"
    shutil.copytree(DEFAULT_SKILLS_DIR, skills)
    query = "my flux capacitor overheats"
    before = Router.from_pack(SkillPack.load(skills)).route(query)
    assert before.clarify is not None
    router_md = skills / ROUTER_NAME / "SKILL.md"
    text = router_md.read_text()
    router_md.write_text(
        text.replace(
            "**Symptoms**\n- training is slow\n",
            "**Symptoms**\n- flux capacitor overheats\n- training is slow\n",
            1,
        )
    )
    after = Router.from_pack(SkillPack.load(skills)).route(query)
    assert after.skills[0] == "performance-profiling"


def test_confidence_is_higher_for_a_pasted_error_than_for_a_two_sided_query(router: Router):
    """Confidence reflects how clearly the evidence points at one skill."""
    clear = router.route(
        "RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation"
    )
    mixed = router.route("save memory and time")
    assert 0 <= mixed.confidence < clear.confidence <= 1
