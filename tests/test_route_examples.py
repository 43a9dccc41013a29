"""The router's labelled examples: parsed from references/routing-examples.md, learned, blended into route()."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from torch_skills.skillpack.examples import ExampleModel, with_pairs
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, ROUTER_NAME, SkillPack
from torch_skills.skillpack.route import Router
from torch_skills.skillpack.router import (
    LabelledExample,
    RouterFormatError,
    load_router_table,
    parse_router,
)

TABLE = """## Start here

| The user reports | Skill | Run first |
|---|---|---|
| memory | `memory-skill` | `estimate_memory` |
| speed | `speed-skill` | `profile_model` |

## Routes

### memory-skill

**Keywords:** memory, allocator

### speed-skill

**Keywords:** slow, throughput
"""

EXAMPLES = """## Labelled examples

### memory-skill

```text from=set-a
the allocator keeps hoarding vram between epochs
```

```text
vram hoarding after every epoch, memory never returns
```

### speed-skill

```text from=set-b
each epoch crawls, the gpu sits idle waiting
```

### clarify

```text
please look at my thing
```
"""


def _words(text: str) -> set[str]:
    return set(text.lower().split())


def test_fenced_blocks_under_a_skill_heading_are_its_examples_with_their_source():
    table = parse_router(TABLE, {"references/routing-examples.md": EXAMPLES})
    got = [(e.skill, e.text, e.source) for e in table.examples]
    assert got == [
        ("memory-skill", "the allocator keeps hoarding vram between epochs", "set-a"),
        ("memory-skill", "vram hoarding after every epoch, memory never returns", ""),
        ("speed-skill", "each epoch crawls, the gpu sits idle waiting", "set-b"),
        ("clarify", "please look at my thing", ""),
    ]


def test_a_multi_line_example_keeps_its_lines_and_its_headings_are_text():
    examples = (
        "## Labelled examples\n\n### speed-skill\n\n```text\nslow run\n## Environment\nGPU: A100\n```\n"
    )
    table = parse_router(TABLE, {"references/routing-examples.md": examples})
    assert [e.text for e in table.examples] == ["slow run\n## Environment\nGPU: A100"]


def test_examples_for_an_unknown_skill_name_the_line_and_the_labels_allowed():
    bad = "## Labelled examples\n\n### no-such-skill\n\n```text\nx\n```\n"
    with pytest.raises(
        RouterFormatError, match=r"routing-examples.md line 3.*no-such-skill.*clarify, out-of-scope"
    ):
        parse_router(TABLE, {"references/routing-examples.md": bad})


@pytest.mark.parametrize(
    ("examples", "message"),
    [
        ("## Labelled examples\n\n```text\nx\n```\n", "before any '### <skill-name>' heading"),
        ("## Labelled examples\n\n### speed-skill\n\n```text\n\n```\n", "an empty example block"),
        ("## Labelled examples\n\n### speed-skill\n\n```text\nslow\n", "never closed"),
    ],
)
def test_a_malformed_example_block_is_a_format_error(examples: str, message: str):
    with pytest.raises(RouterFormatError, match=message):
        parse_router(TABLE, {"references/routing-examples.md": examples})


def test_leaving_a_source_out_drops_only_its_examples():
    table = parse_router(TABLE, {"references/routing-examples.md": EXAMPLES})
    kept = table.without_sources({"set-a"})
    assert [e.source for e in kept.examples] == ["", "set-b", ""]
    assert len(table.examples) == 4  # the original is untouched


def test_the_model_gives_probabilities_that_sum_to_one_and_favour_the_examples_wording():
    examples = [
        LabelledExample("memory-skill", "vram hoarding allocator", "", 1),
        LabelledExample("speed-skill", "epoch crawls idle gpu", "", 2),
    ]
    model = ExampleModel.fit(examples, [], _words, ["memory-skill", "speed-skill"])
    p = model.probabilities({"crawls", "idle"})
    assert abs(sum(p.values()) - 1) < 1e-9
    assert p["speed-skill"] > 0.9


def test_a_query_with_no_known_word_gets_the_priors():
    examples = [LabelledExample("memory-skill", f"leak {i}", "", i) for i in range(3)]
    examples.append(LabelledExample("speed-skill", "slow", "", 9))
    model = ExampleModel.fit(examples, [], _words, ["memory-skill", "speed-skill"])
    p = model.probabilities({"zebra"})
    assert p["memory-skill"] > p["speed-skill"]  # 3 examples against 1
    assert p == model.probabilities(set())


def test_route_phrases_count_as_examples_of_their_skill():
    phrases = [("speed-skill", ["throughput", "drop"]), ("memory-skill", ["allocator", "fragment"])]
    model = ExampleModel.fit([], phrases, _words, ["memory-skill", "speed-skill"])
    assert model.probabilities(with_pairs(["throughput", "drop"]))["speed-skill"] > 0.9


def test_pairs_of_adjacent_terms_are_features():
    assert with_pairs(["out", "memory", "error"]) == {"out", "memory", "error", "out_memory", "memory_error"}


def _router_with(examples_md: str) -> Router:
    return Router(parse_router(TABLE, {"references/routing-examples.md": examples_md}))


def test_examples_decide_a_query_the_phrases_leave_close():
    """'slow' (speed) and 'memory' (memory) both match once; the examples' wording breaks the tie."""
    query = "memory is fine but the step is slow: the gpu sits idle and each epoch crawls"
    without = Router(parse_router(TABLE))
    with_examples = _router_with(EXAMPLES)
    assert with_examples.route(query).skills[0] == "speed-skill"
    assert with_examples.example_probabilities(query)["speed-skill"] > 0.5
    assert without.example_probabilities(query) == {}


def test_the_shipped_router_learns_from_its_examples_file():
    table = load_router_table(DEFAULT_SKILLS_DIR / ROUTER_NAME)
    skills = {e.skill for e in table.examples}
    assert set(table.routes) <= skills, "every specialist has labelled examples"
    assert {"clarify", "out-of-scope"} <= skills
    assert len(table.examples) >= 1000


def test_adding_examples_to_the_router_skill_changes_routing(tmp_path: Path):
    """One source of truth: a question worded like no phrase follows the examples added for it."""
    skills = tmp_path / "skills"
    shutil.copytree(DEFAULT_SKILLS_DIR, skills)
    query = "zorbly quandle frobnicates the wibbet whenever the flumox grows"
    before = Router.from_pack(SkillPack.load(skills)).example_probabilities(query)
    examples = skills / ROUTER_NAME / "references" / "routing-examples.md"
    block = "\n".join(
        f"\n```text\nthe flumox grows and the zorbly quandle frobnicates its wibbet, case {i}\n```\n"
        for i in range(12)
    )
    text = examples.read_text(encoding="utf-8")
    head = "\n### custom-autograd-functions\n"
    assert head in text
    examples.write_text(text.replace(head, head + block, 1), encoding="utf-8")
    after = Router.from_pack(SkillPack.load(skills)).example_probabilities(query)
    assert after["custom-autograd-functions"] > 0.9 > before["custom-autograd-functions"]


def test_a_symptom_in_setup_heavy_words_is_routed_not_asked_about(tmp_path: Path):
    """A post listing its setup ("16 workers", "4k JPEGs") that describes a symptom worded like
    the examples is routed; the same setup with no symptom still gets the question."""
    router = Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))
    routed = router.route(
        "htop shows all 16 dataloader workers pegged at 100% CPU while the GPU sits at 40%. "
        "Images are 4k JPEGs resized to 512, batch 64. More workers change nothing."
    )
    assert routed.status == "routed" and routed.skills[0] == "performance-profiling"
    asked = router.route("ResNet-50, batch 64, lr 0.1, 8 workers, 90 epochs on 4 GPUs. Any ideas?")
    assert asked.status == "clarify"


OFF_TOPIC_EXAMPLES = EXAMPLES + "".join(
    f"\n### out-of-scope\n\n```text\nwhich spreadsheet pivot formula sums the quarterly invoices, case {i}\n```\n"
    if i == 0
    else f"\n```text\nwhich spreadsheet pivot formula sums the quarterly invoices, case {i}\n```\n"
    for i in range(6)
)


def test_a_question_the_examples_hold_for_out_of_scope_is_declined_without_a_table_sign():
    router = _router_with(OFF_TOPIC_EXAMPLES)
    result = router.route("which spreadsheet pivot formula sums quarterly invoices and is it slow")
    assert result.status == "out_of_scope"
    assert result.out_of_scope == "Not PyTorch engineering" and result.reason
    assert result.votes["out-of-scope"] >= 0.99


def test_a_pasted_pytorch_message_is_never_declined_on_the_examples_alone():
    table = TABLE.replace(
        "**Keywords:** slow, throughput",
        "**Keywords:** slow, throughput\n\n**Error messages:**\n\n- RuntimeError: quarterly pivot formula exploded",
    )
    router = Router(parse_router(table, {"references/routing-examples.md": OFF_TOPIC_EXAMPLES}))
    result = router.route("which spreadsheet pivot formula? RuntimeError: quarterly pivot formula exploded")
    assert result.status == "routed" and result.skills[0] == "speed-skill"


def test_a_post_the_examples_hold_for_a_clarify_one_gets_the_question():
    examples = EXAMPLES + "".join(
        f"\n```text\nplease glance over my throughput thing, attempt {i}\n```\n" for i in range(6)
    ).replace("\n```text\nplease glance", "\n### clarify\n\n```text\nplease glance", 1)
    router = _router_with(examples)
    asked = router.route("please glance over my throughput thing")
    assert asked.status == "clarify", asked
    assert asked.votes["clarify"] >= 0.99
    without = Router(parse_router(TABLE)).route("please glance over my throughput thing")
    assert without.status == "routed"  # the tables alone route on the keyword
