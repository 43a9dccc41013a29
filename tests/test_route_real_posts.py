"""route() on the failure classes that real users' posts showed (issue 24), one test a class.

The queries are written here in the style of the posts (GitHub issues and forum threads), not
copied from them; the real posts themselves are scored in evals/routing/real_dev.yaml and
real_test.yaml.
"""

from __future__ import annotations

import pytest

from torch_skills.skillpack.route import Router

CONCRETE_QUESTIONS = [
    (
        "torch.gather does not work in one line, what index shape does it want?",
        "tensor-operations-and-memory",
    ),
    ("einsum broadcasting: why does 'bij,bj->bi' complain about my shapes?", "tensor-operations-and-memory"),
    (
        "I keep my layers' parameters in a plain dict and the optimizer never sees them",
        "module-design-patterns",
    ),
    ("my custom backward is ignored, the gradient is the default one", "custom-autograd-functions"),
    (
        "torch.argmax cannot backpropagate, how do I get a gradient through the index?",
        "custom-autograd-functions",
    ),
    ("self.saved_tensors in my custom backward function doesn't work", "custom-autograd-functions"),
]


@pytest.mark.parametrize(("query", "skill"), CONCRETE_QUESTIONS)
def test_a_concrete_api_question_is_routed_not_asked_about(router: Router, query: str, skill: str):
    """A post that names an API and what it does wrong is routed, never given the clarifying question."""
    assert router.route(query).label == skill


@pytest.mark.parametrize(
    "query",
    [
        "can you share your checkpoint?",
        "Any chance of sharing the pretrained weights? I can't train it myself.",
        "Is the pretrained model available?",
        "pretrained?",
        "step time",
        "What GPU did you use for training and how long did it take?",
    ],
)
def test_a_vague_post_is_never_routed_on_one_keyword(router: Router, query: str):
    """One topic word ("checkpoint", "pretrained", "step time") names no symptom: ask first."""
    result = router.route(query)
    assert result.status == "clarify" and result.clarify, result.summary


@pytest.mark.parametrize(
    "query",
    [
        "our results are two points lower than the paper, how do I reproduce them?",
        "I cannot reproduce the accuracy reported in the paper with the released config",
        "Reproduction results are lower than reported in your paper. Is there a trick in training?",
        "I can't reproduce the accuracy from your paper on CIFAR-100 with the released config, I only get "
        "61%. Could you give me some tips to reproduce your best results?",
    ],
)
def test_reproducing_a_papers_numbers_is_vague_not_determinism(router: Router, query: str):
    """Matching a paper is a question about what differs, not about seeds and determinism."""
    result = router.route(query)
    assert result.status == "clarify", result.summary
    assert "differs" in (result.clarify or "")


def test_run_to_run_differences_with_a_fixed_seed_are_still_determinism(router: Router):
    """The reproducibility skill keeps what is its: the same seed giving different results."""
    query = "with the same seed I get different val accuracy every run, cudnn.deterministic is set"
    assert router.route(query).label == "checkpointing-and-reproducibility"


@pytest.mark.parametrize(
    "query",
    [
        "model = Sequential()\nmodel.add(Dense(64, activation='relu'))\nmodel.add(Dense(1))\n"
        "model.compile(optimizer='adam', loss='mse')\nwhy is my loss nan after the first epoch?",
        "Epoch 3/10\n249/249 [==============================] - 5s 20ms/step - loss: nan - accuracy: 0.1000\n"
        "why does my loss become nan?",
        "x = ttnn.from_torch(t, device=device, layout=ttnn.TILE_LAYOUT)\ny = ttnn.matmul(x, w)\n"
        "the result has the wrong shape",
        "I0815 10:02:11.1 52129 solver.cpp:232] Iteration 2380, loss = 2.04\nthe loss does not decrease",
        "from tinygrad.nn import Tensor\nx = Tensor(2., requires_grad=True)\nhow do I take a second derivative?",
    ],
)
def test_another_frameworks_code_or_log_declines_without_its_name(router: Router, query: str):
    """Keras idioms and progress bars, ttnn, Caffe logs and other frameworks' imports decline on sight."""
    result = router.route(query)
    assert result.status == "out_of_scope", result.summary
    assert result.out_of_scope_signs and result.reason


@pytest.mark.parametrize(
    "query",
    [
        "What is the capital of France?",
        "How do I write a SQL query that joins two tables and groups by customer id?",
        "How do I center a div horizontally and vertically with CSS flexbox?",
    ],
)
def test_a_question_with_no_ml_content_is_declined_not_asked_about(router: Router, query: str):
    """A question about nothing in machine learning gets a decline, not a PyTorch clarifying question."""
    result = router.route(query)
    assert result.status == "out_of_scope" and result.out_of_scope == "Not machine learning"


def test_a_non_english_post_gets_the_question_not_a_decline(router: Router):
    """Words the glue-word check cannot read are not evidence of an off-topic question."""
    assert router.route("¿Por qué mi modelo no aprende nada?").status == "clarify"


@pytest.mark.parametrize(
    "query",
    [
        "can you explain why my training is so slow?",
        "Please explain: each epoch takes 3 hours on an A100 and the GPU utilization is 30%",
    ],
)
def test_a_slow_training_post_that_says_explain_is_not_theory(router: Router, query: str):
    """A named symptom outweighs a theory word: "explain why my training is slow" is profiling."""
    assert router.route(query).label == "performance-profiling"


def test_a_theory_question_still_declines(router: Router):
    """Without a symptom, "explain the intuition" stays a theory question."""
    assert router.route("explain the intuition behind batch normalization").label == "decline"


@pytest.mark.parametrize(
    "query",
    [
        "My IterableDataset yields every sample 4 times when I set num_workers=4. How do I split the "
        "stream between workers?",
        "how do I write a collate_fn that pads variable length sequences to the longest in the batch?",
        "with persistent_workers=True do the workers stay alive between epochs?",
    ],
)
def test_data_pipeline_correctness_goes_to_the_input_pipeline_reference(router: Router, query: str):
    """Worker sharding, collate_fn and worker seeding route to profiling (its input-pipeline reference)."""
    assert router.route(query).label == "performance-profiling"


def test_seeding_dataloader_workers_names_both_the_input_pipeline_and_the_seeds_as_a_close_call(
    router: Router,
):
    """Both skills cover `worker_init_fn` (profiling's data-pipeline correctness, reproducibility's
    determinism reference); the post model (sixteenth round) weighs them nearly even, and the summary
    says so instead of hiding the second."""
    result = router.route(
        "all my dataloader workers produce the same random crops, do I need worker_init_fn to seed numpy?"
    )
    assert set(result.skills[:2]) == {"performance-profiling", "checkpointing-and-reproducibility"}
    assert result.confidence < 0.9
    assert "not sure" in result.summary or "close call" in result.summary


def test_a_worker_out_of_shared_memory_lists_the_input_pipeline_reference(router: Router):
    """A DataLoader worker killed for shared memory is read with the input pipeline (profiling); the
    post model (seventeen collections, character runs) puts the crash's debugging first, not sure."""
    result = router.route(
        "RuntimeError: DataLoader worker (pid 4021) is killed by signal: Bus error. It is possible that "
        "dataloader's workers are out of shared memory."
    )
    assert "performance-profiling" in result.skills[:2]
    assert result.confidence < 0.9


@pytest.mark.parametrize(
    "query",
    [
        "torch.cuda.is_available() returns False even though nvidia-smi shows my RTX 3090. I installed "
        "with pip install torch",
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        "NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch "
        "installation.",
        "ROCm on my RX 6700 XT: torch doesn't see the gpu unless I set HSA_OVERRIDE_GFX_VERSION=10.3.0",
        "AssertionError: Torch not compiled with CUDA enabled",
    ],
)
def test_torch_that_cannot_see_the_gpu_goes_to_debugging(router: Router, query: str):
    """A CPU wheel, a GPU newer than the build or a ROCm override: debugging, not an install decline."""
    assert router.route(query).label == "debugging-techniques"


@pytest.mark.parametrize(
    "query",
    [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
        "the latest NVIDIA driver is installed and running.",
        "how do I install the nvidia driver 550 on ubuntu 22.04?",
        "pip install torch fails: ERROR: Could not find a version that satisfies the requirement torch",
    ],
)
def test_driver_installs_and_a_failing_nvidia_smi_stay_declined(router: Router, query: str):
    """Installing drivers or PyTorch itself is outside the pack."""
    assert router.route(query).label == "decline"


def test_the_distributed_row_runs_check_distributed_first(router: Router):
    """The router table names the distributed checker as the tool to run for DDP/FSDP problems."""
    result = router.route("DDP training hangs at the first all_reduce on 2 nodes")
    assert result.skills[0] == "distributed-training-strategies"
    assert result.tools[0] == "check_distributed"


def test_a_question_that_points_back_asks_about_the_sentence_before_it(router: Router):
    """ "How can I do that?" after a stated goal asks about that goal: routed, not asked about."""
    query = (
        "I have a tiny dataset and want to train only the last layer, with every other layer frozen. "
        "How can I do that? Any help is appreciated."
    )
    assert router.route(query).label == "module-design-patterns"


DDP_REENTRANT = (
    "RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the "
    "following reasons: 1) Use of a module parameter outside the `forward` function. 2) Reused parameters "
    "in multiple reentrant backward passes. For example, if you use multiple `checkpoint` functions to "
    "wrap the same part of your model, it would result in the same set of parameters been used by "
    "different reentrant backward passes multiple times. DDP does not support such use cases in default."
)


def test_a_pasted_error_line_is_evidence_only_for_the_skill_whose_message_it_is(router: Router):
    """The words on the line of a pasted DDP error (reentrant backward, `checkpoint`, forward) add
    nothing to another skill's score: custom-autograd scores the same with and without that line."""
    title, tail = "gradient checkpointing breaks under torchrun", "Single GPU is fine."
    pasted = router.route(f"{title}\n{DDP_REENTRANT}\n{tail}")
    bare = router.route(f"{title}\n{tail}")
    assert pasted.skills[0] == "distributed-training-strategies"
    for skill in ("custom-autograd-functions", "module-design-patterns", "checkpointing-and-reproducibility"):
        assert pasted.scores[skill] == bare.scores[skill], skill


def test_a_message_quoted_mid_sentence_leaves_the_sentence_to_every_skill(router: Router):
    """Only a line that opens with the message is the message's: quoted inside a sentence, the
    sentence's words still count for the other skills."""
    quoted = router.route(f"after I turned on gradient checkpointing the job said {DDP_REENTRANT}")
    assert quoted.scores["custom-autograd-functions"] > 0


def test_ram_that_slowly_grows_is_a_memory_question_not_a_slow_run(router: Router):
    """Host RAM that slowly grows every epoch is a memory question: "slowly" is not a slow step."""
    query = (
        "My validation loop slowly eats the machine's RAM, about 1 GB more every epoch, until the OOM "
        "killer ends the job. Training alone stays flat."
    )
    result = router.route(query)
    assert result.skills[0] == "tensor-operations-and-memory"


def test_timing_a_custom_layer_is_profiling(router: Router):
    """Measuring a custom layer's time is a profiling question, not a module-design one."""
    query = (
        "I benchmark my custom attention layer with time.time() around the call and it says 0.02 ms, yet "
        "the whole model got slower. How do I time it properly?"
    )
    assert router.route(query).label == "performance-profiling"


def test_saving_a_deepspeed_zero3_model_lists_distributed_and_checkpointing(router: Router):
    """Gathering a ZeRO-3 model's state_dict to save it needs both the sharding (distributed) and the
    save (checkpointing). (The post model puts distributed first; the precedence row it replaced
    put checkpointing first.)"""
    result = router.route(
        "[zero3] model.state_dict() is empty placeholders under ZeRO-3, how do I gather the full weights "
        "from every rank to save them?"
    )
    assert set(result.skills[:2]) == {"checkpointing-and-reproducibility", "distributed-training-strategies"}


def test_gradient_clipping_under_a_grad_scaler_is_a_mixed_precision_question(router: Router):
    """Where clip_grad_norm_ goes relative to scaler.step is mixed precision's, though the post says
    "underflowing" (a debugging word)."""
    query = (
        "With AMP the GradScaler keeps fp16 gradients from underflowing, but my gradient clipping threshold "
        "now acts on the scaled values. Where does clip_grad_norm_ go relative to scaler.step?"
    )
    result = router.route(query)
    assert result.skills[0] == "mixed-precision-and-optimization"


@pytest.mark.parametrize(
    "query",
    [
        "after torch.compile the outputs don't match eager any more, max abs diff 2e-2 in fp32",
        "compiled model results differ from eager mode by 1e-2, which op is it?",
    ],
)
def test_compiled_outputs_that_differ_from_eager_list_debugging_first_or_second(router: Router, query: str):
    """A compiled model whose outputs differ from eager: finding the op that diverges is debugging's.
    (The post model puts mixed precision first for the fp32 one; the precedence row it replaced
    put debugging first for both.)"""
    assert "debugging-techniques" in router.route(query).skills[:2]


def test_a_loss_that_does_not_decrease_reads_as_a_loss_that_does_not_go_down(router: Router):
    """ "doesn't decrease" is the same symptom as "doesn't go down": the same debugging score, which
    outweighs a pretrained checkpoint named in passing."""
    decrease = router.route("my training loss doesn't decrease after loading the pretrained checkpoint")
    go_down = router.route("my training loss doesn't go down after loading the pretrained checkpoint")
    assert decrease.scores["debugging-techniques"] == go_down.scores["debugging-techniques"]


def test_choosing_between_sgd_and_adam_is_an_optimizer_question(router: Router):
    """A post comparing optimizers it chose (SGD fine, Adam bad) is routed to optimization, not asked about."""
    query = (
        "If I choose SGD as in your example the reconstruction is fine, but if I choose Adam at lr=5 it "
        "looks bad. Any suggestion for getting the same quality with Adam?"
    )
    assert router.route(query).label == "mixed-precision-and-optimization"


def test_a_pasted_message_filled_with_values_is_still_read_word_for_word(router: Router):
    """The shapes a message was filled with ('[64, 3, 7, 7]') do not break the word-for-word match
    that marks a pasted error (its score boost and its line's ownership)."""
    query = (
        "RuntimeError: Given groups=1, weight of size [64, 3, 7, 7], expected input[8, 1, 224, 224] to "
        "have 3 channels, but got 1 channels instead"
    )
    assert "debugging-techniques" in router._evidence(query).pasted


def test_markdown_emphasis_around_code_does_not_hide_another_framework(router: Router):
    """`_tf.stop_gradient(x)_` (code set in Markdown italics) still shows TensorFlow's `tf` sign."""
    query = (
        "Why do you use _tf.stop_gradient(-x)_ in the quantizer instead of _tf.stop_gradient(x)_? I don't "
        "see how the straight-through estimator works here."
    )
    result = router.route(query)
    assert result.status == "out_of_scope"
    assert result.out_of_scope == "TensorFlow or Keras"
