"""Text data for PLDR-LLM training: the SentencePiece tokenizer, documents, EOS packing into fixed
blocks, the train/validation split and a deterministic, resumable batch order.

Conventions follow the PLDR-LLM author's data preparation: every document is tokenised without BOS
and gets EOS appended; the documents are concatenated into one token stream and cut into blocks of
`seq_len + 1` tokens (inputs are a block without its last token, targets the block shifted by one);
the tail that does not fill a block is padded with the pad id, which the loss masks.
"""

from __future__ import annotations

import hashlib
import math
import os
import pathlib
import re
from collections.abc import Iterable, Sequence
from importlib import resources

import numpy as np

from .._json import special_file_kind

__all__ = [
    "DEFAULT_CORPUS",
    "DEFAULT_TOKENIZER",
    "Tokenizer",
    "TextData",
    "batch_indices",
    "load_text_data",
    "pack_documents",
    "read_documents",
    "unigram_entropy",
]

_DATA = resources.files("jaxattn.data")
DEFAULT_TOKENIZER = pathlib.Path(str(_DATA / "pldr_refinedweb_unigram32k.model"))
DEFAULT_CORPUS = pathlib.Path(str(_DATA / "corpus" / "botchan.txt"))


def check_input_file(path: str | os.PathLike, what: str) -> pathlib.Path:
    """`path` as a `Path` if it names a regular file (a link to one is followed), checked with
    `os.stat` before anything opens it: opening a FIFO for reading blocks until a writer comes,
    and a device such as `/dev/zero` never ends.

    **Raises:** `FileNotFoundError` `"{what}: no such file: {path}"`; `ValueError`
    `"{what}: {path} is a folder, not a file"` or `"... is not a regular file (...)"`.
    """
    path = pathlib.Path(path)
    try:
        kind = special_file_kind(os.stat(path).st_mode)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: no such file: {path}") from None
    if kind == "a folder":
        raise ValueError(f"{what}: {path} is a folder, not a file")
    if kind is not None:
        raise ValueError(f"{what}: {path} is not a regular file (it is {kind})")
    return path


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Tokenizer:
    """A SentencePiece model (by default the 32k unigram tokenizer of PLDR-LLM).

    **Arguments:**

    - `path`: a SentencePiece `.model` file; `None` means the packaged PLDR-LLM tokenizer (pad 0,
      unk 1,
      bos 2, eos 3).

    **Raises:** `FileNotFoundError` if the file does not exist; `ValueError` if it is a folder or
    not a regular file, not a SentencePiece model, or has no EOS piece.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        import sentencepiece as spm

        path = check_input_file(DEFAULT_TOKENIZER if path is None else path, "tokenizer")
        blob = path.read_bytes()
        sp = spm.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(blob)
            ok = sp.GetPieceSize() > 0
        except Exception:  # sentencepiece raises RuntimeError/OSError for a bad proto
            ok = False
        if not ok:
            raise ValueError(
                f"tokenizer: {path} is not a SentencePiece model (could not parse it as a "
                "SentencePiece ModelProto)"
            )
        if sp.eos_id() < 0:
            raise ValueError(f"tokenizer: {path} has no EOS piece; documents need one")
        self._sp = sp
        self.path = path
        self.sha256 = hashlib.sha256(blob).hexdigest()

    @property
    def vocab_size(self) -> int:
        return int(self._sp.GetPieceSize())

    @property
    def pad_id(self) -> int:
        """The pad id, or -1 if the model has no pad piece."""
        return int(self._sp.pad_id())

    @property
    def unk_id(self) -> int:
        return int(self._sp.unk_id())

    @property
    def bos_id(self) -> int:
        return int(self._sp.bos_id())

    @property
    def eos_id(self) -> int:
        return int(self._sp.eos_id())

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS or EOS.

        The packaged tokenizer normalises first (NFKC; runs of whitespace, newlines included,
        become one space; leading and trailing whitespace is dropped) and falls back to byte
        pieces `<0x..>` for characters it has no piece for, so no id is `unk`:
        `decode(encode(s)) == s` for NFKC-normal text with single spaces (emoji, CJK, accents;
        tested). Spellings of special pieces such as `"<s>"` are encoded as plain text."""
        return list(self._sp.EncodeAsIds(text))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; special ids (pad, BOS, EOS) decode to nothing, and an incomplete UTF-8
        byte sequence (a generation cut inside a character) to U+FFFD per byte.

        **Raises:** `ValueError` for ids that are not integers or lie outside
        `[0, vocab_size)`."""
        try:
            arr = np.asarray(ids if hasattr(ids, "shape") else list(ids))
        except TypeError:
            raise ValueError(
                f"decode: ids must be a sequence of token ids, got {type(ids).__name__}"
            ) from None
        if arr.ndim != 1 and arr.size:
            raise ValueError(f"decode: ids must be one sequence (1-D), got shape {arr.shape}")
        integral = arr.dtype.kind in "iu" or (
            arr.dtype.kind == "f" and bool(np.all(np.isfinite(arr) & (arr == np.round(arr))))
        )
        if not integral:
            raise ValueError(
                f"decode: token ids must be integers, got {arr.reshape(-1)[:5].tolist()}"
            )
        ids = arr.reshape(-1)
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"decode: token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        return self._sp.DecodeIds(ids)

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"


_BLANK_LINES = re.compile(r"\n[ \t\r\f\v]*\n")


_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")  # C0 controls and DEL, not tab/newline/ff
_MAX_CONTROL_FRACTION = 0.01


def _check_usable_text(path: pathlib.Path, text: str) -> None:
    """Refuse text that is not text: NUL characters (a binary file, or a file of zeros from a
    failed copy), or more than 1 % control characters. Both would train silently (the tokenizer
    maps them to byte pieces) on a stream no one meant to model."""
    nul = text.find("\x00")
    if nul >= 0:
        raise ValueError(
            f"text: {path} contains NUL characters ({text.count(chr(0))} of {len(text)}, the "
            f"first at character {nul}): a binary or zero-filled file, not text"
        )
    controls = len(_CONTROL.findall(text))
    if controls > _MAX_CONTROL_FRACTION * max(len(text), 1):
        raise ValueError(
            f"text: {path} is {controls / len(text):.0%} control characters ({controls} of "
            f"{len(text)}): not usable text (at most {_MAX_CONTROL_FRACTION:.0%} are accepted)"
        )


def read_documents(paths: Sequence[str | os.PathLike] | None = None) -> list[str]:
    """Documents of UTF-8 text files: each file is split at blank lines, and each piece (stripped)
    is one
    document. `None` reads the packaged corpus (*Botchan*, public domain; see
    `jaxattn/data/corpus`).

    **Raises:** `FileNotFoundError` for a missing file; `ValueError` for a folder or something
    that is not a regular file (a FIFO, a device), if the files hold no text at all, or a file
    holds NUL characters or more than 1 % other control characters (not text).
    """
    paths = [DEFAULT_CORPUS] if paths is None else [pathlib.Path(p) for p in paths]
    if not paths:
        raise ValueError("text: no files given")
    docs = []
    for path in paths:
        check_input_file(path, "text")
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as err:
            raise ValueError(f"text: {path} is not UTF-8 text ({err})") from None
        text = text.replace("\r\n", "\n")
        _check_usable_text(path, text)
        docs.extend(d.strip() for d in _BLANK_LINES.split(text) if d.strip())
    if not docs:
        raise ValueError(
            "text: the input is empty (no non-whitespace characters in "
            + ", ".join(str(p) for p in paths)
            + ")"
        )
    return docs


def pack_documents(
    documents: Sequence[Sequence[int]], *, block_len: int, eos_id: int, pad_id: int
) -> np.ndarray:
    """Concatenate token-id documents, each followed by `eos_id`, and cut the stream into rows of
    `block_len` tokens; the last partial row is filled with `pad_id` (dropped if `pad_id < 0`).

    **Returns:** an int32 array `(blocks, block_len)`.

    **Raises:** `ValueError` if there are no tokens or `block_len < 2`.
    """
    if block_len < 2:
        raise ValueError(f"pack_documents: block_len must be >= 2, got {block_len}")
    stream = []
    for doc in documents:
        stream.extend(int(t) for t in doc)
        stream.append(int(eos_id))
    if not stream or all(len(d) == 0 for d in documents):
        raise ValueError("pack_documents: no tokens to pack (empty text)")
    stream = np.asarray(stream, dtype=np.int32)
    n_full, rest = divmod(stream.size, block_len)
    if rest and pad_id >= 0:
        stream = np.concatenate([stream, np.full(block_len - rest, pad_id, np.int32)])
        n_full += 1
    elif rest:
        stream = stream[: n_full * block_len]
    if n_full == 0:
        raise ValueError(
            f"pack_documents: {rest} tokens do not fill one block of {block_len} and the tokenizer "
            "has no pad piece"
        )
    return stream.reshape(n_full, block_len)


def unigram_entropy(blocks: np.ndarray, *, pad_id: int) -> float:
    """Entropy in nats/token of the empirical unigram distribution of the (non-pad) tokens: the
    loss of
    the best context-free predictor, the bar a language model must beat."""
    ids = np.asarray(blocks).ravel()
    ids = ids[ids != pad_id]
    counts = np.bincount(ids).astype(np.float64)
    p = counts[counts > 0] / ids.size
    return float(-(p * np.log(p)).sum())


class TextData:
    """Packed blocks split into training and held-out validation rows.

    Attributes: `train` `(n_train, seq_len + 1)`, `val` `(n_val, seq_len + 1)` int32 arrays;
    `seq_len`; `pad_id`; `eos_id`; `num_documents`; `num_tokens` (non-pad, EOS included);
    `unigram_entropy` (nats/token, whole corpus).
    """

    def __init__(self, train, val, *, seq_len, pad_id, eos_id, num_documents):
        self.train = train
        self.val = val
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.num_documents = num_documents
        every = np.concatenate([train, val])
        self.num_tokens = int((every != pad_id).sum())
        self.unigram_entropy = unigram_entropy(every, pad_id=pad_id)

    def __repr__(self):
        return (
            f"TextData(documents={self.num_documents}, tokens={self.num_tokens}, "
            f"train_blocks={len(self.train)}, val_blocks={len(self.val)}, seq_len={self.seq_len})"
        )


def load_text_data(
    tokenizer: Tokenizer,
    paths: Sequence[str | os.PathLike] | None = None,
    *,
    seq_len: int,
    val_fraction: float = 0.1,
    pad_id: int | None = None,
) -> TextData:
    """Read, tokenise (EOS appended, no BOS), pack into blocks of `seq_len + 1` and split: the last
    `ceil(val_fraction · blocks)` blocks of the stream (text the model never trains on) are the
    validation
    set. `pad_id` defaults to the tokenizer's.

    **Raises:** `ValueError` for empty text, `seq_len < 1`, a bad `val_fraction`, or too little text
    for both splits.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    docs = read_documents(paths)
    pad_id = tokenizer.pad_id if pad_id is None else pad_id
    blocks = pack_documents(
        [tokenizer.encode(d) for d in docs],
        block_len=seq_len + 1,
        eos_id=tokenizer.eos_id,
        pad_id=pad_id,
    )
    n_val = math.ceil(val_fraction * len(blocks)) if val_fraction > 0 else 0
    if len(blocks) - n_val < 1 or (val_fraction > 0 and n_val < 1):
        raise ValueError(
            f"text too short: {len(blocks)} block(s) of {seq_len + 1} tokens cannot be split into "
            f"training and validation (val_fraction={val_fraction}); give more text or a smaller "
            "seq_len"
        )
    train, val = blocks[: len(blocks) - n_val], blocks[len(blocks) - n_val :]
    return TextData(
        train, val, seq_len=seq_len, pad_id=pad_id, eos_id=tokenizer.eos_id, num_documents=len(docs)
    )


def batch_indices(num_blocks: int, batch_size: int, position: int, seed: int) -> np.ndarray:
    """Row indices of the batch that starts at data `position` (the number of rows consumed so far).

    Rows are visited epoch by epoch, each epoch in a fresh permutation drawn from `(seed, epoch)`,
    so the
    order is a pure function of `(seed, position)`: resuming at a saved position continues the same
    sequence of batches. A batch may straddle two epochs.
    """
    if num_blocks < 1:
        raise ValueError("batch_indices: no blocks")
    out = np.empty(batch_size, np.int64)
    cache: dict[int, np.ndarray] = {}
    for i in range(batch_size):
        epoch, offset = divmod(position + i, num_blocks)
        if epoch not in cache:
            cache[epoch] = np.random.default_rng([seed, epoch]).permutation(num_blocks)
        out[i] = cache[epoch][offset]
    return out
