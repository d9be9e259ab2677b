"""Token sources: deterministic per (seed, step), and `hetjax prepare` files."""

import numpy as np
import pytest

from hetjax.data import SyntheticTokens, builtin_tokens, make_source, open_token_file, prepare_token_file, split_window


def test_builtin_corpus_is_deterministic_bytes():
    a, b = builtin_tokens(seed=1), builtin_tokens(seed=1)
    assert a.vocab_size == 256 and len(a.tokens) > 1_000_000
    assert a.fingerprint() == b.fingerprint()
    np.testing.assert_array_equal(a.windows(7, 4, 32), b.windows(7, 4, 32))
    assert not np.array_equal(a.windows(7, 4, 32), a.windows(8, 4, 32))
    assert not np.array_equal(a.windows(7, 4, 32), builtin_tokens(seed=2).windows(7, 4, 32))


def test_targets_are_inputs_shifted_by_one():
    w = builtin_tokens().windows(0, 2, 16)
    inputs, targets = split_window(w)
    assert inputs.shape == targets.shape == (2, 16)
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
    # They are real text: mostly printable ASCII.
    assert np.mean((w >= 9) & (w < 127)) > 0.9


def test_synthetic_source():
    s = SyntheticTokens(vocab_size=1000, seed=3)
    w = s.windows(5, 3, 8)
    assert w.shape == (3, 9) and w.dtype == np.int32 and w.max() < 1000
    np.testing.assert_array_equal(w, SyntheticTokens(1000, 3).windows(5, 3, 8))


def test_prepare_writes_a_memory_mapped_token_file(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = ["<eos>", "<unk>", "the", "cat", "sat", "on", "mat"]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(tmp_path / "tok")
    (tmp_path / "a.txt").write_text("the cat sat on the mat")
    (tmp_path / "b.txt").write_text("the dog sat")
    meta = prepare_token_file([tmp_path / "a.txt", tmp_path / "b.txt"], tmp_path / "tok", tmp_path / "out")
    assert meta["num_tokens"] == 6 + 1 + 3 + 1 and meta["dtype"] == "uint16"
    source = open_token_file(tmp_path / "out.bin")
    np.testing.assert_array_equal(np.asarray(source.tokens), [2, 3, 4, 5, 2, 6, 0, 2, 1, 4, 0])
    assert make_source(str(tmp_path / "out.bin")).windows(0, 2, 4).shape == (2, 5)
