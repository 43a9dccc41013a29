"""route(): symptom text to specialist skills, or one clarifying question."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, ROUTER_NAME, SkillPack
from torch_skills.skillpack.route import Router
from torch_skills.skillpack.router import RouterFormatError, parse_router

TERMS = "references/routing-terms.md"

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
    """The router skill's files (SKILL.md and its routing-terms reference) are the only source."""
    skills = tmp_path / "skills"
    shutil.copytree(DEFAULT_SKILLS_DIR, skills)
    query = "my flux capacitor overheats"
    before = Router.from_pack(SkillPack.load(skills)).route(query)
    assert before.clarify is not None
    router_md = skills / ROUTER_NAME / TERMS
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


def test_a_routed_answer_says_so_in_its_status(router: Router):
    """Clients test `status`; a routed answer has skills and no question or reason."""
    result = router.route("loss turns into nan around step 4000")
    assert result.status == "routed"
    assert result.clarify is None and result.reason is None and result.out_of_scope is None


@pytest.mark.parametrize(
    "query",
    [
        "Keras model.fit runs out of GPU memory, how do I enable memory growth in tf 2.15?",
        "jax.jit recompiles my train_step every call",
        "pandas groupby apply is slow on 10M rows",
        "sklearn GridSearchCV eats all my RAM",
        "How do I install the CUDA 12.4 toolkit next to my NVIDIA driver on Ubuntu?",
        "Can you explain the intuition behind the bias-variance tradeoff?",
        "python asyncio: run 100 HTTP requests concurrently",
    ],
)
def test_a_question_that_is_not_pytorch_engineering_is_declined(router: Router, query: str):
    """Another framework, an install, theory or plain Python: no skill, a reason, a testable status."""
    result = router.route(query)
    assert result.status == "out_of_scope"
    assert result.skills == [] and result.clarify is None
    assert result.reason and result.out_of_scope
    assert result.out_of_scope_signs
    assert 0 < result.confidence <= 1


def test_porting_a_keras_model_to_pytorch_is_routed(router: Router):
    """A named PyTorch keeps a question about another framework in scope."""
    result = router.route("porting my Keras model to PyTorch, the outputs differ after I copy the weights")
    assert result.status == "routed"


def test_a_pasted_pytorch_error_keeps_a_question_in_scope(router: Router):
    """A PyTorch error message word for word names PyTorch even when sklearn is mentioned; a graph cut
    by a round trip through NumPy is custom-autograd-functions' (its graph-mechanics reference)."""
    result = router.route(
        "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n"
        "I compute my metric with sklearn and turn it back into a tensor for the loss"
    )
    assert result.status == "routed"
    assert result.skills[0] == "custom-autograd-functions"


def test_an_install_problem_is_declined_even_when_it_names_torch(router: Router):
    """The install row holds when PyTorch is named, if its signs outweigh the skills' evidence."""
    result = router.route(
        "torch.cuda.is_available() is False on my new laptop, I did pip install torch and the nvidia driver is 551"
    )
    assert result.status == "out_of_scope"


COLLECT_ENV = """
PyTorch version: 2.1.2+cu121
Is debug build: False
CUDA used to build PyTorch: 12.1
OS: Ubuntu 22.04.3 LTS (x86_64)
Python version: 3.10.13 (main, Sep 11 2023, 13:44:35) [GCC 11.2.0] (64-bit runtime)
Is CUDA available: True
GPU models and configuration:
GPU 0: NVIDIA GeForce RTX 4090
Nvidia driver version: 545.23.08
cuDNN version: Probably one of the following:
/usr/lib/x86_64-linux-gnu/libcudnn.so.8.9.6
Vulnerability Spectre v1: Mitigation; usercopy/swapgs barriers
Versions of relevant libraries:
[pip3] torch==2.1.2
[conda] pytorch-cuda 12.1 ha16c6d3_5 pytorch
"""


def test_a_collect_env_dump_is_not_evidence(router: Router):
    """A version dump with no symptom gets the question; its lines are reported as ignored."""
    result = router.route("Something seems wrong with my training, env below." + COLLECT_ENV)
    assert result.status == "clarify"
    assert result.ignored_lines >= 12
    assert "tensor-operations-and-memory" not in result.evidence


def test_a_symptom_next_to_a_collect_env_dump_is_still_routed(router: Router):
    """Dropping the dump leaves the user's own words: the symptom routes."""
    result = router.route("Loss becomes NaN after 3 epochs with fp16, any ideas?" + COLLECT_ENV)
    assert result.skills[0] == "debugging-techniques"


def test_issue_template_headings_are_not_evidence(router: Router):
    """'Describe the bug', 'Versions', 'Expected behavior' say nothing about the symptom."""
    post = (
        "### 🐛 Describe the bug\n\nIt does not behave as expected.\n\n"
        "### Expected behavior\n\nIt should work.\n\n### Versions\n" + COLLECT_ENV
    )
    result = router.route(post)
    assert result.status == "clarify"
    assert result.ignored_lines >= 15


@pytest.mark.parametrize(
    "query",
    [
        "ViT-B/16 on 8x A100, batch 1024, AdamW lr 3e-4 wd 0.05, cosine, bf16 autocast. Results are bad, any ideas?",
        "Fine-tuning a 7B model with FSDP on 2 nodes, lr 2e-5, grad accumulation 8. What am I doing wrong?",
        "config: {'optimizer': 'sgd', 'lr': 0.1, 'amp': true, 'num_gpus': 8}. Can anyone spot the problem?",
    ],
)
def test_a_detailed_post_that_names_no_symptom_gets_the_question(router: Router, query: str):
    """Hardware, versions and hyper-parameters are context, not a symptom: ask first."""
    result = router.route(query)
    assert result.status == "clarify"
    assert result.clarify and result.clarify.endswith("?")


def test_a_vague_phrase_next_to_a_real_symptom_is_routed(router: Router):
    """'any ideas?' does not hide an out-of-memory error."""
    result = router.route("CUDA out of memory. Tried to allocate 2.00 GiB after a few batches. Any ideas?")
    assert result.skills[0] == "tensor-operations-and-memory"


def test_a_word_inside_a_file_path_does_not_fire_a_precedence_rule(router: Router):
    """'speed' in ~/experiments/speed_test/ is a folder name, not a slowness report."""
    result = router.route(
        "DDP job in ~/experiments/speed_test/ hangs at init_process_group on the second node"
    )
    assert result.skills[0] == "distributed-training-strategies"


def test_a_loss_that_decreases_slowly_is_not_a_speed_problem(router: Router):
    """Slow convergence is about numbers, not step time, even with amp in the picture."""
    result = router.route("with amp on, my loss decreases slowly compared to fp32")
    assert result.skills[0] != "performance-profiling"


def test_the_tf32_warning_goes_to_mixed_precision(router: Router):
    """The warning's 'utilize' is the warning's word: it does not fire the utilization rule."""
    result = router.route(
        "You are using a CUDA device ('NVIDIA A100') that has Tensor Cores. To properly utilize them, you "
        "should set `torch.set_float32_matmul_precision('medium' | 'high')` which will trade-off precision "
        "for performance. Should I set it?"
    )
    assert result.skills[0] == "mixed-precision-and-optimization"


def test_an_occasional_reduced_loss_scale_goes_to_mixed_precision(router: Router):
    """The fp16 scaler skipping a step now and then is the scaler working, not a NaN hunt."""
    result = router.route(
        "Gradient overflow. Skipping step, reducing loss scale to 32768 every few hundred steps with fp16"
    )
    assert result.skills[0] == "mixed-precision-and-optimization"


def test_a_collapsing_loss_scale_goes_to_debugging(router: Router):
    """A scale that keeps dropping means non-finite gradients every step: find where they come from."""
    result = router.route(
        "with fp16 and GradScaler the scale keeps dropping until it is 0 and the loss is nan"
    )
    assert result.skills[0] == "debugging-techniques"


def test_a_router_table_without_term_lists_is_refused():
    """The SKILL.md body alone has no phrases: the Router says to parse the reference too."""
    body = SkillPack.load(DEFAULT_SKILLS_DIR).get(ROUTER_NAME).body
    with pytest.raises(RouterFormatError, match="routing-terms"):
        Router(parse_router(body))


def test_a_request_for_review_of_a_setup_gets_the_question(router: Router):
    """No symptom, a help word, and no question that names anything routable: ask first."""
    result = router.route(
        "Looking for feedback on my segmentation setup: DeepLabv3+, 1024px tiles, batch 4, poly LR 0.01, 2x A100."
    )
    assert result.status == "clarify"


def test_a_help_word_next_to_a_routable_question_is_routed(router: Router):
    """'any advice' does not hide a question the routes know."""
    result = router.route(
        "Any advice? How do I set up gradient clipping with GradScaler under fp16 autocast?"
    )
    assert result.status == "routed"
    assert result.skills[0] == "mixed-precision-and-optimization"


def test_a_listed_setup_with_a_question_that_names_nothing_gets_the_question(router: Router):
    """Setup words next to numbers ('lr 3e-4', 'batch 64') are a setup, not a symptom."""
    result = router.route("GCN, 3 layers, hidden 128, lr 5e-3, batch 64, 200 epochs. Is this normal?")
    assert result.status == "clarify"


def test_a_listed_setup_next_to_a_routable_question_is_routed(router: Router):
    """The same setup with a question about a named API routes on that question."""
    result = router.route(
        "ResNet-50, batch 256, lr 0.1, 90 epochs on 8 GPUs. How do I set up DistributedSampler so each rank "
        "sees different data?"
    )
    assert result.skills[0] == "distributed-training-strategies"


def test_a_question_asking_to_review_a_setup_of_topic_words_gets_the_question(router: Router):
    """'Is my DDP setup sensible?' wants a review: its topic words are not a routable question."""
    result = router.route(
        "Could anyone double-check my FSDP + activation checkpointing setup for a 13B model?"
    )
    assert result.status == "clarify"


def test_a_review_request_that_names_a_symptom_is_routed(router: Router):
    """A review phrase next to a real symptom does not hide it."""
    result = router.route("Can you review my DDP code? Training hangs with 4 GPUs at the first all_reduce.")
    assert result.skills[0] == "distributed-training-strategies"


def test_topic_keywords_alone_are_not_a_symptom(router: Router):
    """A post that lists DDP and AMP and asks whether it is set up right gets the question."""
    result = router.route(
        "I've set up my first multi-GPU run (4x RTX 3090, DDP, batch 32 per GPU, AMP). Is everything set up correctly?"
    )
    assert result.status == "clarify"


def test_a_how_to_question_with_a_vague_phrase_in_it_is_routed(router: Router):
    """'what needs to change?' after a routable task is a question about that task."""
    result = router.route(
        "porting my single-gpu script to 4 gpus with DDP and bf16 autocast, what needs to change?"
    )
    assert result.skills[0] == "distributed-training-strategies"


def test_a_slower_network_behind_an_nccl_timeout_is_a_distributed_problem(router: Router):
    """A job that freezes on every rank is a hang, not a speed question, whatever else it says."""
    result = router.route("the job freezes on all ranks after an hour, no error, GPU util sits at 100%")
    assert result.skills[0] == "distributed-training-strategies"


def test_resuming_with_a_scaler_and_a_schedule_lists_checkpointing_and_mixed_precision(router: Router):
    """Saving and restoring every stateful object is a checkpoint question, the scaler and the schedule
    are mixed precision's: both are read. (The post model puts mixed precision first, at 0.54; the
    precedence row it replaced put checkpointing first.)"""
    result = router.route("How do I resume training with the GradScaler and the LR scheduler state restored?")
    assert set(result.skills[:2]) == {"checkpointing-and-reproducibility", "mixed-precision-and-optimization"}


def test_building_on_the_meta_device_before_loading_lists_module_design_and_is_not_sure(router: Router):
    """Meta-device construction is module design; the checkpoint only fills it. The post model
    (seventeen collections, character runs) puts checkpointing first here, and says it is not sure."""
    result = router.route(
        "build the model on the meta device, then load the checkpoint with to_empty and assign=True"
    )
    assert "module-design-patterns" in result.skills[:2]
    assert "not sure" in result.summary or "close call" in result.summary


def test_a_keras_question_full_of_skill_words_is_declined_with_confidence(router: Router):
    """A topic that holds unless PyTorch is named needs no margin over the skills' evidence."""
    result = router.route("Keras mixed_float16 policy: loss becomes NaN with LossScaleOptimizer on my GPU")
    assert result.status == "out_of_scope"
    assert result.confidence >= 0.5


def test_a_function_word_does_not_fire_a_rule_by_its_stem(router: Router):
    """'through' is not 'throughput': a custom op that compile should trace starts with custom autograd."""
    result = router.route(
        "How do I register my Triton kernel as an op so torch.compile can trace through it without a graph break?"
    )
    assert result.skills[0] == "custom-autograd-functions"


def test_a_pasted_oom_in_an_fsdp_job_lists_distributed_and_memory(router: Router):
    """A pasted OOM under FSDP: the per-rank sharding (distributed) and the memory itself are both read.
    (The post model puts memory first; the precedence row it replaced put distributed first.)"""
    result = router.route(
        "FSDP on 8 GPUs, bf16.\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 3 has a total capacity of 79.10 GiB of which 1.02 GiB is free."
    )
    assert set(result.skills[:2]) == {"distributed-training-strategies", "tensor-operations-and-memory"}


def test_a_pasted_nvidia_smi_table_alone_gets_the_question(router: Router):
    """A drawn nvidia-smi table is environment, not a symptom: the whole box is dropped."""
    table = (
        "+---------------------------------------------------------------+\n"
        "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2 |\n"
        "| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |\n"
        "| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |\n"
        "|   0  NVIDIA A100-SXM4-40GB  On | 00000000:07:00.0 Off |                    0 |\n"
        "| N/A   35C    P0    90W / 400W |  30000MiB / 40960MiB |     95%      Default |\n"
        "+---------------------------------------------------------------+\n"
    )
    result = router.route(table)
    assert result.status == "clarify"
    assert result.ignored_lines == 7


def test_an_empty_issue_template_gets_the_question(router: Router):
    """Template guidance in HTML comments and bare version numbers are not evidence."""
    result = router.route(
        "## Bug\n<!-- Describe what went wrong and paste the traceback -->\n\n## Versions\ntorch 2.4.1, CUDA 12.1, 2x A6000\n"
    )
    assert result.status == "clarify"


def test_a_short_negated_phrase_does_not_match_its_opposite(router: Router):
    """'a learned temperature' is not 'not learning'."""
    found = router.scores("should the softmax use a learned temperature or a fixed one")[1]
    assert "not learning" not in found["debugging-techniques"]
    assert "not learning" in router.scores("my model doesn't learn anything")[1]["debugging-techniques"]


def test_a_bare_topic_name_gets_the_question(router: Router):
    """'FSDP' or 'torch.compile' alone names what the user works with, not what goes wrong."""
    for query in ("torch.compile", "FSDP", "safetensors"):
        assert router.route(query).status == "clarify", query
    assert router.route("NaN loss").skills[0] == "debugging-techniques"


def test_the_out_of_scope_topic_is_the_one_that_clears_its_bar(router: Router):
    """Keras 3 on the torch backend names PyTorch, so only its own 'always' row can decline it."""
    result = router.route(
        "KERAS_BACKEND=torch and model.fit is slow on the GPU, what keras.config setting do I need?"
    )
    assert result.status == "out_of_scope"
    assert "Keras" in result.out_of_scope


def test_a_technical_yes_no_question_inside_a_sanity_check_is_routed(router: Router):
    """'is it ok to call X' asks about X; 'sanity check my setup' alone still gets the question."""
    result = router.route(
        "Sanity check please: is it ok to call scheduler.step() once per epoch with OneCycleLR?"
    )
    assert result.skills[0] == "mixed-precision-and-optimization"
    assert router.route("Could you sanity check my FSDP setup?").status == "clarify"


# -- pasted code is context, not a symptom ------------------------------------------------------------
def test_code_lines_and_code_blocks_are_dropped_but_errors_and_logs_stay():
    from torch_skills.skillpack.route import _without_code

    post = (
        "my loss is nan after a few steps\n"
        "```python\n"
        "def forward(self, x):\n"
        "    return self.fc(x)\n"
        "```\n"
        "    loss = criterion(out, y)\n"
        "```\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: Function 'LogBackward0' returned nan values in its 0th output.\n"
        "```\n"
        "any idea?"
    )
    assert _without_code(post).splitlines() == [
        "my loss is nan after a few steps",
        "Traceback (most recent call last):",
        "RuntimeError: Function 'LogBackward0' returned nan values in its 0th output.",
        "any idea?",
    ]
    assert _without_code("plain words, no code") == "plain words, no code"


def test_a_request_to_look_over_pasted_code_without_a_symptom_gets_the_question(router: Router):
    """The code names what the user works with (DDP, samplers), not what goes wrong."""
    result = router.route(
        "Can someone check my DDP training loop?\n```python\n"
        "dist.init_process_group('nccl')\nmodel = DDP(model.cuda(rank), device_ids=[rank])\n"
        "sampler = DistributedSampler(dataset)\nloader = DataLoader(dataset, sampler=sampler)\n"
        "for x, y in loader:\n    loss = model(x).loss\n    loss.backward()\n```"
    )
    assert result.status == "clarify"


def test_the_same_code_with_a_symptom_in_words_is_routed(router: Router):
    result = router.route(
        "My DDP job hangs forever at the first backward on rank 1, rank 0 is fine.\n```python\n"
        "dist.init_process_group('nccl')\nmodel = DDP(model.cuda(rank), device_ids=[rank])\n"
        "for x, y in loader:\n    loss = model(x).loss\n    loss.backward()\n```"
    )
    assert result.status == "routed" and result.skills[0] == "distributed-training-strategies"


@pytest.mark.parametrize(
    "query",
    [
        "our ViT misbehaves since the upgrade, torch 2.6.0, python 3.12, single 4090, anyone else seen this?",
        "our FSDP run on 16 H100s is not the same since we switched from deepspeed, llama 7B, bf16, "
        "same lr. any known issues?",
    ],
)
def test_a_detailed_post_whose_question_clause_names_nothing_gets_the_question(router: Router, query: str):
    """The sentence names a topic or setup, but the clause that asks ("any known issues?") names
    nothing, so the question does not make the post routable."""
    result = router.route(query)
    assert result.status == "clarify", result.summary


def test_a_question_clause_that_names_a_topic_keeps_the_post_routed(router: Router):
    result = router.route(
        "we're on torch 2.6 with a ViT, is mode='max-autotune' worth it over the default torch.compile mode?"
    )
    assert result.status == "routed" and result.skills[0] == "mixed-precision-and-optimization"


def test_a_question_that_is_only_a_vague_phrasing_names_nothing(router: Router):
    """ "How can I optimize my model?" is the table's "optimize my model" phrasing, not a question
    about the optimizer; with a named bottleneck the same opening is routed."""
    asked = router.route(
        "How can I optimize my model? it's a 12-layer transformer, 80M params, batch 32, lr 3e-4."
    )
    assert asked.status == "clarify"
    assert asked.clarify and "speed" in asked.clarify
    routed = router.route("How can I optimize my dataloader? it's 8 workers, jpeg decoding, batch 256.")
    assert routed.status == "routed" and routed.skills[0] == "performance-profiling"


def test_a_vague_phrasing_whose_question_clause_names_nothing_gets_the_question(router: Router):
    """ "something seems wrong" is a vague phrasing; the topic (DDP, NCCL) sits in the clauses before
    the one that asks, so the question ("where would you start?") names nothing routable."""
    asked = router.route(
        "something seems wrong with our DDP job on 4 nodes, NCCL backend, torch 2.5, where would you start?"
    )
    assert asked.status == "clarify", asked.summary
    routed = router.route(
        "something is off: DDP hangs at the first all_reduce on 4 nodes, where would you start?"
    )
    assert routed.status == "routed" and routed.skills[0] == "distributed-training-strategies"


@pytest.mark.parametrize(
    "query",
    [
        "DyNet: my LSTM's loss goes to nan after a few hundred updates",
        "ncnn inference on Android gives different outputs than on the desktop",
        "candle: CUDA out of memory when loading a 7B model in bf16",
        "TorchSharp: the optimizer step does not change the weights of my module",
    ],
)
def test_a_post_about_another_framework_or_runtime_named_only_by_its_name_is_declined(
    router: Router, query: str
):
    result = router.route(query)
    assert result.status == "out_of_scope" and result.out_of_scope == "Other frameworks"


def test_the_flux_image_model_is_not_julias_flux_framework(router: Router):
    result = router.route("training flux with LoRA: the loss is nan after 200 steps in bf16")
    assert result.status == "routed"
