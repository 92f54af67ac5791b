"""The "wgpu" transformers attention backend: small models built from configs (random
weights, no download), every attention call through the package; logits and
`output_attentions`' weights match the eager implementation and greedy `generate` gives the
same tokens."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import wgpu_attention.transformers as wat  # noqa: E402

wat.register()


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def build(config_cls, model_cls, **cfg):
    torch.manual_seed(0)
    config = config_cls(**cfg)
    model = model_cls(config).eval()
    return model


def compare(model, **inputs):
    model.set_attn_implementation("eager")
    with torch.no_grad():
        want = model(**inputs)
    model.set_attn_implementation("wgpu")
    calls = count_calls()
    with torch.no_grad():
        got = model(**inputs)
    assert calls.n > 0, "no attention call went through the wgpu backend"
    key = "logits" if "logits" in want else "last_hidden_state"
    return rel(got[key], want[key])


class count_calls:
    """Counts calls of the registered function while alive."""

    def __init__(self):
        self.n = 0
        from transformers import AttentionInterface

        inner = wat.attention_forward

        def counted(*a, **kw):
            self.n += 1
            return inner(*a, **kw)

        AttentionInterface.register("wgpu", counted)


SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=97)


def test_bert_encoder_with_padding():
    from transformers import BertConfig, BertModel

    model = build(BertConfig, BertModel, max_position_embeddings=64, **SMALL)
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    assert compare(model, input_ids=ids, attention_mask=mask) < 1e-5


def test_llama_decoder_gqa_left_padding():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = build(LlamaConfig, LlamaForCausalLM, num_key_value_heads=2, max_position_embeddings=128, **SMALL)
    ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    assert compare(model, input_ids=ids, attention_mask=mask) < 1e-5


def test_llama_generate_gives_the_same_tokens():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = build(LlamaConfig, LlamaForCausalLM, num_key_value_heads=1, max_position_embeddings=128, **SMALL)
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    model.set_attn_implementation("eager")
    want = model.generate(**kw)
    model.set_attn_implementation("wgpu")
    calls = count_calls()
    got = model.generate(**kw)
    assert calls.n >= 8 * 2
    assert torch.equal(got, want)


def test_gpt2_causal_without_a_mask():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = build(GPT2Config, GPT2LMHeadModel, n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=97)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(4))
    assert compare(model, input_ids=ids) < 1e-5


def test_output_attentions_returns_the_weights():
    from transformers import BertConfig, BertModel

    model = build(BertConfig, BertModel, max_position_embeddings=64, **SMALL)
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(5))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        want = model(input_ids=ids, output_attentions=True).attentions
    model.set_attn_implementation("wgpu")
    with torch.no_grad():
        got = model(input_ids=ids, output_attentions=True).attentions
    assert len(got) == 2 and all(g is not None and rel(g, w) < 1e-5 for g, w in zip(got, want))


def test_t5_position_bias_and_cross_attention():
    from transformers import T5Config, T5ForConditionalGeneration

    model = build(
        T5Config, T5ForConditionalGeneration, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=97
    )
    ids = torch.randint(3, 97, (2, 9), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    assert compare(model, input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :5]) < 1e-5


def logits(model, impl, **inputs):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(**inputs).logits


def test_gemma2_softcap_and_sliding_window_layers():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    # A cap small enough to bite (random weights give small scores), a window shorter than
    # the sequence on every other layer, GQA and left padding.
    cfg = dict(SMALL, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=128)
    model = build(Gemma2Config, Gemma2ForCausalLM, sliding_window=4, attn_logit_softcapping=0.05, **cfg)
    assert "sliding_attention" in model.config.layer_types
    ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, :3] = 0
    assert compare(model, input_ids=ids, attention_mask=mask) < 1e-5
    # The cap and the window change the logits, so agreeing means both were applied.
    plain = build(Gemma2Config, Gemma2ForCausalLM, sliding_window=64, attn_logit_softcapping=None, **cfg)
    assert rel(logits(plain, "eager", input_ids=ids), logits(model, "eager", input_ids=ids)) > 1e-2


def mistral(sliding_window):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = dict(SMALL, num_key_value_heads=2, max_position_embeddings=128)
    return build(MistralConfig, MistralForCausalLM, sliding_window=sliding_window, **cfg)


def left_padded(seed, row=0, pad=2):
    """Two sequences of 11 tokens, `row` left-padded by `pad`: `(ids, attention_mask)`."""
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[row, :pad] = 0
    return ids, mask


def test_mistral_sliding_window_shorter_than_the_sequence():
    model = mistral(3)
    ids, mask = left_padded(8)
    assert compare(model, input_ids=ids, attention_mask=mask) < 1e-5
    wide = mistral(None)
    assert rel(logits(wide, "eager", input_ids=ids), logits(model, "eager", input_ids=ids)) > 1e-2
    # Decoding past the window with the KV cache: eager's tokens.
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    model.set_attn_implementation("eager")
    want = model.generate(**kw)
    model.set_attn_implementation("wgpu")
    assert torch.equal(model.generate(**kw), want)


def compare_attentions(model, **inputs):
    """Every layer's `output_attentions` weights and the logits, the wgpu backend's against
    eager's: the largest relative difference of the weights, and the logits'."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        want = model(**inputs, output_attentions=True)
    model.set_attn_implementation("wgpu")
    calls = count_calls()
    with torch.no_grad():
        got = model(**inputs, output_attentions=True)
    assert calls.n == model.config.num_hidden_layers
    assert len(got.attentions) == len(want.attentions) == model.config.num_hidden_layers
    worst = 0.0
    for g, w in zip(got.attentions, want.attentions):
        assert g is not None and g.shape == w.shape and g.dtype == w.dtype
        worst = max(worst, rel(g, w))
    return worst, rel(got.logits, want.logits)


def test_gemma2_output_attentions_with_softcap_and_sliding_window():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = dict(SMALL, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=128)
    model = build(Gemma2Config, Gemma2ForCausalLM, sliding_window=4, attn_logit_softcapping=0.05, **cfg)
    assert model.config.layer_types == ["sliding_attention", "full_attention"]
    ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(12))
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, :3] = 0
    weights, logits = compare_attentions(model, input_ids=ids, attention_mask=mask)
    assert weights < 1e-5 and logits < 1e-5


def test_mistral_output_attentions_with_a_sliding_window():
    model = mistral(3)
    ids, mask = left_padded(13)
    weights, logits = compare_attentions(model, input_ids=ids, attention_mask=mask)
    assert weights < 1e-5 and logits < 1e-5
    # Without a mask too (transformers then builds the window into its own mask).
    weights, logits = compare_attentions(model, input_ids=ids)
    assert weights < 1e-5 and logits < 1e-5


class _Module:
    """What the attention functions read of a decoder layer's attention module."""

    num_key_value_groups = 2
    training = False
    is_causal = True
    head_dim = 8


@pytest.mark.parametrize("q_len,kv_len", [(10, 10), (1, 10), (3, 10), (3, 4), (1, 2)])
def test_a_sliding_window_kwarg_without_a_mask_is_transformers_window(q_len, kv_len):
    """Without a mask the kwarg is honoured at the positions transformers' sdpa backend gives
    such a call (a prefill from position 0, or one decoding step at position kv − 1): equal to
    eager attention with transformers' own sliding-window mask (`kv > q − W`, causal) there."""
    from transformers.masking_utils import eager_mask, sliding_window_causal_mask_function
    from transformers.models.mistral.modeling_mistral import eager_attention_forward

    window = 4
    g = torch.Generator().manual_seed(q_len * 100 + kv_len)
    q = torch.randn(2, 4, q_len, 8, generator=g)
    k, v = torch.randn(2, 2, kv_len, 8, generator=g), torch.randn(2, 2, kv_len, 8, generator=g)
    mask = eager_mask(
        batch_size=2,
        q_length=q_len,
        kv_length=kv_len,
        q_offset=kv_len - 1 if q_len == 1 else 0,
        mask_function=sliding_window_causal_mask_function(window),
    )
    want, _ = eager_attention_forward(_Module(), q, k, v, mask, scaling=0.3)
    got, _ = wat.attention_forward(_Module(), q, k, v, None, scaling=0.3, sliding_window=window)
    assert rel(got, want) < 1e-5


def test_softcap_and_window_calls_return_eagers_weights():
    """`output_attentions` on calls with modifiers: Gemma 2's eager attention's weights (its
    soft-cap, then the mask), and for a window without a mask transformers' window mask's,
    over all the call's keys (those cut off before the call weigh 0)."""
    from transformers.masking_utils import eager_mask, sliding_window_causal_mask_function
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 4, 5, 8, generator=g) * 3
    k, v = torch.randn(2, 2, 7, 8, generator=g) * 3, torch.randn(2, 2, 7, 8, generator=g)
    mask = torch.zeros(2, 1, 5, 7)
    mask[1, :, :, :2] = torch.finfo(torch.float32).min  # left padding
    mask[:, :, :, 6] = torch.finfo(torch.float32).min
    want_out, want = eager_attention_forward(_Module(), q, k, v, mask, scaling=0.3, softcap=2.0)
    out, got = wat.attention_forward(_Module(), q, k, v, mask, scaling=0.3, softcap=2.0, output_attentions=True)
    assert got.shape == want.shape == (2, 4, 5, 7)
    assert rel(got, want) < 1e-5 and rel(out, want_out) < 1e-5
    assert (got[..., 6] == 0).all() and (got[1, ..., :2] == 0).all()
    # A window without a mask: a decoding step (its keys cut to the window) and a causal
    # prefill with more keys than queries (cut to the queries').
    k, v = torch.randn(2, 2, 9, 8, generator=g) * 3, torch.randn(2, 2, 9, 8, generator=g)
    for q_len, kv_len in ((1, 9), (3, 9)):
        mask = eager_mask(
            batch_size=2,
            q_length=q_len,
            kv_length=kv_len,
            q_offset=kv_len - 1 if q_len == 1 else 0,
            mask_function=sliding_window_causal_mask_function(4),
        )
        want_out, want = eager_attention_forward(_Module(), q[:, :, :q_len], k, v, mask)
        out, got = wat.attention_forward(
            _Module(), q[:, :, :q_len], k, v, None, sliding_window=4, softcap=None, output_attentions=True
        )
        assert got.shape == want.shape == (2, 4, q_len, kv_len)
        assert rel(got, want) < 1e-5 and rel(out, want_out) < 1e-5


def test_softcap_with_dropout_is_refused_not_ignored():
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(NotImplementedError, match="dropout"):
        wat.attention_forward(None, q, q, q, None, dropout=0.1, softcap=30.0)
