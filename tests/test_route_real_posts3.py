"""route() on the failure classes of real users' posts left after two rounds (issue 24), one test a class.

The queries are written here in the style of the posts (GitHub issues and forum threads), not
copied from them; the real posts themselves are scored in evals/routing/real_dev*.yaml.
"""

from __future__ import annotations

import pytest

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, SkillPack
from torch_skills.skillpack.post_model import PostModel
from torch_skills.skillpack.route import CLOSE_CALL, SURE, Router


@pytest.mark.parametrize(
    ("query", "skill"),
    [
        ("训练resnet18，loss一直不下降，学习率是0.01", "debugging-techniques"),
        ("微调7B模型的时候显存不足，batch size已经是1了", "tensor-operations-and-memory"),
        ("用torchrun多机训练的时候卡住了，没有任何输出", "distributed-training-strategies"),
    ],
)
def test_a_chinese_post_is_read_by_its_symptom_phrase(router: Router, query: str, skill: str):
    """A Chinese symptom phrase ("loss 不下降", "显存不足") is read as the English one, also when a
    Latin word is glued to it."""
    assert router.route(query).label == skill


def test_a_latin_word_glued_to_a_cjk_run_keeps_its_word_boundary(router: Router):
    """Keras code right after a Chinese word is still seen: the script boundary is a word boundary."""
    assert router.route("用了model.compile(optimizer='adam')之后报错了，怎么办？").label == "decline"


def test_a_post_filed_with_another_runtime_declines_though_the_model_came_from_pytorch(router: Router):
    """An environment line with ONNX Runtime's version says where the post was filed: the NaN is
    the runtime's, however often PyTorch is named as where the model came from."""
    query = (
        "fp16 model outputs NaN, fp32 is fine\n"
        "Hi team, we exported the model from PyTorch and converted it to fp16 for speed, but the "
        "fp16 model returns NaN while the fp32 one is correct. It is also slower than PyTorch.\n\n"
        "- ONNX Runtime version: 1.16\n- OS: Ubuntu 22.04\n"
    )
    assert router.route(query).label == "decline"


def test_exporting_from_pytorch_to_another_runtime_stays_routed(router: Router):
    """Naming the runtime in passing, with no version line, keeps a PyTorch question in scope."""
    query = (
        "torch.onnx.export gives NaN outputs in onnxruntime after I switched the model to fp16 with autocast"
    )
    assert router.route(query).label != "decline"


@pytest.mark.parametrize(
    "query",
    [
        "Pretrained weights\nGreat job! Are you sharing the pre-trained weights (checkpoints) as well?",
        "Inference speed\nNice work! Is the inference speed as fast as the paper says?",
        "How about the training speed?\nHow about the training speed of the model in your repository?",
        "Fake numbers\nCan anyone get the same accuracy as reported in these papers? I suspect the numbers are fake.",
    ],
)
def test_a_question_to_a_repositorys_authors_about_their_work_is_asked_about(router: Router, query: str):
    """Asking the authors for their weights or their paper's speed names a topic word, not a
    problem of the asker's: it gets the clarifying question, not a route on "checkpoint" or "speed"."""
    assert router.route(query).label == "clarify"


def test_a_measurement_of_the_askers_own_run_next_to_the_paper_stays_routed(router: Router):
    """A concrete symptom of the asker's own run is routed even when the post compares with the paper."""
    query = (
        "Great work! My training is much slower than the paper: each epoch takes 3 hours on one "
        "A100 and GPU utilization stays at 20%."
    )
    assert router.route(query).label == "performance-profiling"


def test_a_loss_that_fluctuates_after_resuming_starts_with_checkpointing(router: Router):
    """A loss whose variance grows after a resume is a symptom (read as a diverging run), and the
    resume precedence row sends it to the state that was not restored."""
    query = (
        "Since I resumed from the step-50k checkpoint the train loss variance is much larger than "
        "before. Is this expected? Any advice welcome."
    )
    assert router.route(query).label == "checkpointing-and-reproducibility"


def test_an_inference_time_of_the_askers_own_run_is_a_latency_question(router: Router):
    """ "Inference time" reads as latency: measuring one's own FPS or time per image is profiling,
    not whichever skill a stray word of the post ("reported", "process") picks."""
    query = (
        "About FPS\nOn two servers both processes reported a pure inference time of 0.03s per "
        "image, different from the paper. Is post-processing counted? How do I count the full "
        "inference time?"
    )
    assert router.route(query).label == "performance-profiling"


def test_a_title_that_asks_gives_way_to_the_question_of_the_body(router: Router):
    """A title naming a topic ("Checkpoints on Google Drive?") does not make a request for the
    authors' files routable when a question of the body asks about the same thing."""
    query = (
        "Checkpoints on Google Drive?\nThanks for this useful repository! Is it possible to share "
        "the model checkpoints on Google Drive? I cannot download the pretrained weights from the "
        "current host."
    )
    assert router.route(query).label == "clarify"


def test_settings_in_a_pasted_config_do_not_fire_a_precedence_row(router: Router):
    """`ckpt='checkpoint/sam.pth', warmup=True` in a pasted argparse Namespace are values, not a
    question about resuming a schedule: a run that got slower with cudnn.benchmark stays profiling."""
    query = (
        "cudnn.benchmark=True makes training slower\n"
        "I read that cudnn.benchmark makes training faster, but each epoch now takes much longer. Why?\n"
        "[09:40:27] Namespace(dataset='Synapse', batch_size=12, deterministic=0, base_lr=0.005, "
        "seed=1234, ckpt='checkpoint/sam_vit_b.pth', warmup=True, max_epochs=200)\n"
        "[09:40:27] 185 iterations per epoch. 37000 max iterations\n"
    )
    assert router.route(query).label == "performance-profiling"


@pytest.mark.parametrize(
    "query",
    [
        "fine-tuning does not converge\nINFO:gluonnlp:12:01:33 Batch: 300/7000, Loss=4.02, lr=0.00003\n"
        "INFO:gluonnlp:12:01:47 Batch: 350/7000, Loss=4.05, lr=0.00003",
        "Hessian-vector product\nusing ReverseDiff\nF = x -> ReverseDiff.gradient(f, x)\n"
        "How do I get the Hessian times a vector without building the Hessian?",
    ],
)
def test_a_post_in_another_frameworks_own_words_declines(router: Router, query: str):
    """GluonNLP's log and Julia's ReverseDiff name other frameworks: decline, whatever the symptom."""
    assert router.route(query).label == "decline"


def test_a_driver_that_is_too_old_is_a_driver_install_question(router: Router):
    """ "The NVIDIA driver on your system is too old" asks for a driver update: decline as an install."""
    query = (
        "torch 2.1 with cuda 12.1 on the lab server\nRuntimeError: The NVIDIA driver on your system is "
        "too old (found version 11040). Please update your GPU driver by downloading and installing a "
        "new version from the URL: http://www.nvidia.com/Download/index.aspx Alternatively, go to: "
        "https://pytorch.org to install a PyTorch version that has been compiled with your version of "
        "the CUDA driver."
    )
    assert router.route(query).label == "decline"


def test_a_method_written_as_a_call_is_a_concrete_api_question(router: Router):
    """`x.permute(0, 2, 1).contiguous()` names an API even without a dotted module path: a question
    about what it does is routed, not asked about."""
    query = (
        "permute and contiguous\ncan someone tell me what `feats.append(head(x).permute(0, 2, 3, 1)"
        ".contiguous())` does? I dont understand what permute and contiguous do"
    )
    assert router.route(query).label == "tensor-operations-and-memory"


def test_a_loss_formula_compared_with_the_papers_is_a_theory_question(router: Router):
    """A loss function that differs from the paper's formula is a paper question: decline."""
    query = (
        "Loss function differs from the paper\nThanks for the great work! The loss function in the "
        "code uses the squared error of (x - z), but eq. 3 of the paper has a 1/lambda^2 coefficient."
    )
    assert router.route(query).label == "decline"


def test_create_graph_reads_as_a_double_backward_question(router: Router):
    """`create_graph=True` is how a double backward is asked for: custom-autograd, not CUDA graphs."""
    query = "question: about create_graph\nWhy is the create_graph attr set to True in this case?"
    assert router.route(query).label == "custom-autograd-functions"


def test_a_title_whose_topic_the_body_does_not_ask_about_stays_the_question(router: Router):
    """A concrete title ("How do I resume training from a checkpoint?") is the post's question when
    the body only asks "Any tips?"."""
    query = "How do I resume training from a checkpoint?\nI only keep the model weights now. Any tips?"
    assert router.route(query).label == "checkpointing-and-reproducibility"


def test_scala_code_declines_on_sight(router: Router):
    """`protected var weightInit: InitMethod = Zeros` is Scala: another framework's code, not PyTorch."""
    query = (
        "setInitMethod has no effect on submodules\n```\ntrait Initializable {\n"
        "  protected var weightInitMethod: InitializationMethod = Zeros\n}\n```"
    )
    assert router.route(query).label == "decline"


def test_a_training_log_line_is_not_mistaken_for_scala(router: Router):
    """ "val loss: NaN" in a log is a validation loss, not a Scala declaration: the NaN is routed."""
    query = "epoch 3: train loss: 0.41\nval loss: NaN\nwhy does my validation loss become nan?"
    assert router.route(query).label == "debugging-techniques"


def test_the_summary_says_how_sure_the_first_skill_is():
    """Under CLOSE_CALL confidence (the post model's probability for its first skill) the summary
    names the second skill as a close call; under SURE it says the first is likely, not sure, and
    names the second; from SURE it says neither. Stand-in models over the shipped skills: one with
    no preference, one leaning to mixed precision, one sure of debugging."""
    router = Router.from_pack(SkillPack.load(DEFAULT_SKILLS_DIR))
    skills = list(router.post_model.labels)
    query = "loss becomes NaN after a few hundred steps and the gradients explode"

    def model(bias: list[float]) -> PostModel:
        return PostModel.from_json(
            {
                "labels": skills,
                "bias": bias,
                "score_weights": {s: [0.0] * len(skills) for s in skills},
                "terms": {},
                "score_scale": 3.0,
                "trained_on": 0,
            }
        )

    router.post_model = model([0.0] * len(skills))
    close = router.route(query)
    assert close.status == "routed" and close.confidence < CLOSE_CALL and len(close.skills) > 1
    assert f"A close call with {close.skills[1]}" in close.summary
    router.post_model = model([3.0 if s == "mixed-precision-and-optimization" else 0.0 for s in skills])
    likely = router.route(query)
    assert (
        likely.skills[:2] == ["mixed-precision-and-optimization", "debugging-techniques"]
        and CLOSE_CALL <= likely.confidence < SURE
    )
    assert (
        f"Likely, not sure (confidence {likely.confidence:.2f}): if the user's words fit {likely.skills[1]}"
        in (likely.summary)
    )
    assert "close call" not in likely.summary
    router.post_model = model([8.0 if s == "debugging-techniques" else 0.0 for s in skills])
    clear = router.route(query)
    assert clear.skills[0] == "debugging-techniques" and clear.confidence >= SURE
    assert "close call" not in clear.summary and "not sure" not in clear.summary
