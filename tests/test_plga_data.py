"""Tokenizer, documents, EOS packing, splits and the batch order of the PLGA training data."""

import math
import unicodedata

import jax.numpy as jnp
import numpy as np
import pytest

from jaxattn.plga._data import (
    DEFAULT_CORPUS,
    Tokenizer,
    batch_indices,
    load_text_data,
    pack_documents,
    read_documents,
    unigram_entropy,
)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer()


def test_packaged_tokenizer_ids(tokenizer):
    assert tokenizer.vocab_size == 32000
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    ids = tokenizer.encode("Hello world.")
    assert ids == [4780, 485, 262]  # no BOS, no EOS
    assert tokenizer.decode(ids) == "Hello world."
    with pytest.raises(ValueError, match="out of range"):
        tokenizer.decode([5, 32000])
    assert tokenizer.decode(np.asarray(ids)) == tokenizer.decode([float(i) for i in ids])
    assert tokenizer.decode(list(jnp.asarray(ids))) == "Hello world."  # JAX scalars (helper-27)
    with pytest.raises(ValueError, match=r"one sequence \(1-D\), got shape \(2, 3\)"):
        tokenizer.decode(np.array([ids, ids]))
    for bad in ([1.5], [True], ["4780"]):  # 1.5 decoded as ' ⁇ '
        with pytest.raises(ValueError, match="decode: token ids must be integers"):
            tokenizer.decode(bad)


def test_tokenizer_file_errors(tmp_path):
    not_a_model = tmp_path / "fake.model"
    not_a_model.write_text("this is plain text, not a protobuf")
    with pytest.raises(ValueError, match="is not a SentencePiece model"):
        Tokenizer(not_a_model)
    empty = tmp_path / "empty.model"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="is not a SentencePiece model"):
        Tokenizer(empty)
    with pytest.raises(FileNotFoundError, match="no such file"):
        Tokenizer(tmp_path / "missing.model")


def test_other_sentencepiece_model_accepted(tmp_path):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=str(DEFAULT_CORPUS),
        model_prefix=str(tmp_path / "m"),
        vocab_size=300,
        model_type="unigram",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        minloglevel=2,
    )
    tok = Tokenizer(tmp_path / "m.model")
    assert tok.vocab_size == 300 and tok.eos_id == 3
    data = load_text_data(tok, seq_len=16)
    assert data.train.max() < 300


def test_read_documents_blank_lines(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("first doc\nline two\n\n\n  \nsecond doc\r\n\r\nthird\n", encoding="utf-8")
    b = tmp_path / "b.txt"
    b.write_text("\ufefffourth", encoding="utf-8")
    assert read_documents([a, b]) == ["first doc\nline two", "second doc", "third", "fourth"]
    assert len(read_documents()) == 12  # packaged corpus: translator's note + 11 chapters


def test_empty_text_is_an_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\n\t\n")
    with pytest.raises(ValueError, match="empty"):
        read_documents([empty])
    with pytest.raises(FileNotFoundError):
        read_documents([tmp_path / "nope.txt"])
    with pytest.raises(ValueError, match="empty text"):
        pack_documents([[], []], block_len=4, eos_id=3, pad_id=0)


def test_pack_documents_by_hand():
    blocks = pack_documents([[5, 6], [7], [8, 9, 10]], block_len=3, eos_id=3, pad_id=0)
    np.testing.assert_array_equal(blocks, [[5, 6, 3], [7, 3, 8], [9, 10, 3]])
    blocks = pack_documents([[5, 6], [7]], block_len=4, eos_id=3, pad_id=0)
    np.testing.assert_array_equal(blocks, [[5, 6, 3, 7], [3, 0, 0, 0]])
    blocks = pack_documents([[5, 6], [7]], block_len=4, eos_id=3, pad_id=-1)  # no pad: drop
    np.testing.assert_array_equal(blocks, [[5, 6, 3, 7]])
    assert blocks.dtype == np.int32


def test_load_text_data_split(tokenizer, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("One small document.\n\nAnother one, a little longer than the first.\n")
    docs = read_documents([f])
    expected = []
    for d in docs:
        expected += tokenizer.encode(d) + [3]
    data = load_text_data(tokenizer, [f], seq_len=3, val_fraction=0.25)
    rows = np.concatenate([data.train, data.val])
    flat = rows.ravel()
    np.testing.assert_array_equal(flat[: len(expected)], expected)
    assert (flat[len(expected) :] == 0).all()
    assert 2 not in flat  # no BOS
    assert len(data.val) == math.ceil(0.25 * len(rows))
    assert data.num_tokens == len(expected) and data.num_documents == 2
    with pytest.raises(ValueError, match="too short"):
        load_text_data(tokenizer, [f], seq_len=100)


def test_default_corpus_statistics(tokenizer):
    data = load_text_data(tokenizer, seq_len=64)
    assert data.num_documents == 12
    assert 55_000 < data.num_tokens < 70_000
    assert (data.train.ravel() == 3).sum() + (data.val.ravel() == 3).sum() == 12
    assert 6.0 < data.unigram_entropy < 7.0


def test_unigram_entropy_by_hand():
    blocks = np.array([[5, 5, 6, 7], [5, 6, 0, 0]])  # pad 0 ignored: counts 3, 2, 1 of 6
    p = np.array([3, 2, 1]) / 6
    assert unigram_entropy(blocks, pad_id=0) == pytest.approx(-(p * np.log(p)).sum(), rel=1e-14)


def test_batch_order_epochs_and_resume():
    n, b = 10, 4
    seq = np.concatenate([batch_indices(n, b, pos, seed=7) for pos in range(0, 40, b)])
    for epoch in range(4):
        assert sorted(seq[epoch * n : (epoch + 1) * n]) == list(range(n))
    assert not np.array_equal(seq[:n], seq[n : 2 * n])
    # a pure function of (seed, position): resuming at position 8 continues the same order
    np.testing.assert_array_equal(batch_indices(n, b, 8, seed=7), seq[8:12])
    assert not np.array_equal(batch_indices(n, b, 0, seed=8), seq[:4])


def test_nul_and_control_character_text_refused(tmp_path, tokenizer):
    zeros = tmp_path / "zeros.txt"
    zeros.write_bytes(b"\x00" * 4096)
    with pytest.raises(ValueError, match=r"zeros\.txt contains NUL characters \(4096 of 4096"):
        load_text_data(tokenizer, [zeros], seq_len=8)
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("real words here " * 20 + "\x00 tail")
    with pytest.raises(ValueError, match="the first at character 320"):
        read_documents([mixed])
    noisy = tmp_path / "noisy.txt"
    noisy.write_text("abc\x01\x02\x1b" * 50)
    with pytest.raises(ValueError, match=r"noisy\.txt is 50% control characters \(150 of 300\)"):
        read_documents([noisy])
    ok = tmp_path / "ok.txt"  # tabs, form feeds and a rare escape are text
    ok.write_text("col\tcol\n\fpage two " + "x" * 200 + "\x1b")
    assert read_documents([ok]) == [ok.read_text().strip()]


@pytest.mark.parametrize(
    "text",
    [
        "emoji 😀 inside",
        "ends in a four-byte 🎉",
        "ends in é",
        "日本語のテキスト",  # pieces the English tokenizer lacks: byte fallback
        "mixed: Ωmega ∑ 𝔘nicode ✓",
        "",
        "<s></s><pad>[UNK]",  # special pieces' spellings are plain text
    ],
)
def test_byte_fallback_round_trip(tokenizer, text):
    """Exact round trips for NFKC-normal text; the tokenizer normalises (NFKC) first, so 𝔘 comes
    back as U."""
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == unicodedata.normalize("NFKC", text)
    if "𝔘" not in text:
        assert tokenizer.decode(ids) == text
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.unk_id not in ids  # byte fallback: nothing is unknown
    assert tokenizer.eos_id not in ids and tokenizer.bos_id not in ids


def test_byte_fallback_pieces_and_specials(tokenizer):
    ids = tokenizer.encode("😀")
    pieces = [tokenizer._sp.IdToPiece(i) for i in ids]
    assert pieces[-4:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]  # U+1F600 in UTF-8
    # a generation cut inside a multibyte character decodes with U+FFFD, never raises
    assert tokenizer.decode(ids[:-1]) == "\ufffd" * 3
    # special ids only: nothing to show
    specials = [tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id]
    assert tokenizer.decode(specials) == "" and tokenizer.decode([]) == ""
    assert tokenizer.encode("") == []
