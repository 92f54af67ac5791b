"""Every ```python block of docs/python.md and README.md runs as written (a block that names
`model` gets a small transformers model built from a config)."""

import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FILES = ["docs/python.md", "README.md"]


def blocks():
    out = []
    for name in FILES:
        path = os.path.join(ROOT, name)
        if not os.path.exists(path):
            continue
        text = open(path, encoding="utf-8").read()
        for i, m in enumerate(re.finditer(r"```python\n(.*?)```", text, re.S)):
            line = text[: m.start()].count("\n") + 2
            out.append(pytest.param(m.group(1), id=f"{name}:{line}"))
    return out


def tiny_model():
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=50,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config).eval()


def test_there_are_examples():
    assert len(blocks()) >= 5


@pytest.mark.parametrize("code", blocks())
def test_example_runs(code):
    pytest.importorskip("torch")
    namespace = {"__name__": "__doc_example__"}
    if "model." in code:
        namespace["model"] = tiny_model()
    exec(compile(code, "<doc>", "exec"), namespace)
