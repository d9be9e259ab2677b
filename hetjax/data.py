"""Token sources every stage can read deterministically.

A source hands out windows of seq_len + 1 tokens for a (step, batch): the
first stage takes the first seq_len as inputs, the last stage the last seq_len
as targets. Which windows is a pure function of (seed, step), so stages on
different processes read the same batch without talking to each other.

Sources:
* ``builtin``: byte-level tokens (vocab 256) of this Python's own standard
  library sources; needs no download. Its fingerprint lets processes on
  different machines check they read the same bytes.
* a token file written by ``hetjax prepare`` (``<name>.bin`` + ``<name>.json``),
  memory-mapped.
* ``synthetic``: uniform random tokens, for benchmarks.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys
from typing import Iterable, Protocol

import numpy as np

BUILTIN_VOCAB = 256
# Enough text for the demo without reading the whole standard library.
_BUILTIN_MAX_BYTES = 4 << 20


class TokenSource(Protocol):
    vocab_size: int

    def windows(self, step: int, batch: int, seq_len: int) -> np.ndarray:
        """int32 [batch, seq_len + 1] tokens for this step."""


def split_window(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets): next-token prediction over one window."""
    return windows[:, :-1], windows[:, 1:]


class ArrayTokens:
    """Random windows of a 1-D token array (in memory or memory-mapped)."""

    def __init__(self, tokens: np.ndarray, vocab_size: int, seed: int = 0, name: str = "array"):
        if tokens.ndim != 1:
            raise ValueError(f"{name}: expected a 1-D token array, got shape {tokens.shape}")
        self.tokens = tokens
        self.vocab_size = vocab_size
        self.seed = seed
        self.name = name

    def windows(self, step: int, batch: int, seq_len: int) -> np.ndarray:
        span = seq_len + 1
        if len(self.tokens) < span:
            raise ValueError(f"{self.name}: {len(self.tokens)} tokens, a window needs {span}")
        rng = np.random.default_rng((self.seed, step))
        starts = rng.integers(0, len(self.tokens) - span + 1, size=batch)
        return np.stack([np.asarray(self.tokens[s : s + span], dtype=np.int32) for s in starts])

    def fingerprint(self) -> str:
        return hashlib.sha256(np.ascontiguousarray(self.tokens).tobytes()).hexdigest()[:16]


class SyntheticTokens:
    """Uniform random tokens: no file, any vocab, for throughput runs."""

    def __init__(self, vocab_size: int, seed: int = 0):
        self.vocab_size = vocab_size
        self.seed = seed

    def windows(self, step: int, batch: int, seq_len: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, step))
        return rng.integers(0, self.vocab_size, size=(batch, seq_len + 1), dtype=np.int32)

    def fingerprint(self) -> str:
        return f"synthetic-{self.vocab_size}"


def builtin_corpus_bytes(max_bytes: int = _BUILTIN_MAX_BYTES) -> bytes:
    """The standard library's top-level .py files, sorted by name, concatenated."""
    stdlib = pathlib.Path(os.__file__).parent
    chunks, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


def builtin_tokens(seed: int = 0) -> ArrayTokens:
    tokens = np.frombuffer(builtin_corpus_bytes(), dtype=np.uint8)
    return ArrayTokens(tokens, BUILTIN_VOCAB, seed, name="builtin corpus")


# ---- token files (hetjax prepare) -------------------------------------------


def _meta_path(path: pathlib.Path) -> pathlib.Path:
    return path.with_suffix(".json")


def open_token_file(path: str | os.PathLike, seed: int = 0) -> ArrayTokens:
    path = pathlib.Path(path)
    meta_file = _meta_path(path)
    if not path.exists() or not meta_file.exists():
        raise FileNotFoundError(f"token file {path} needs {path.name} and {meta_file.name}")
    meta = json.loads(meta_file.read_text())
    tokens = np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r")
    if len(tokens) != meta["num_tokens"]:
        raise ValueError(f"{path}: {meta_file.name} says {meta['num_tokens']} tokens, file has {len(tokens)}")
    return ArrayTokens(tokens, meta["vocab_size"], seed, name=str(path))


def prepare_token_file(
    texts: Iterable[str | os.PathLike], tokenizer_path: str | os.PathLike, out: str | os.PathLike
) -> dict:
    """Tokenize local text files with a local HF tokenizer into ``out`` (.bin)
    plus its metadata (.json). Documents are separated by the EOS token."""
    from transformers import AutoTokenizer  # only this command needs transformers

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path), local_files_only=True)
    vocab = len(tokenizer)
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.uint32
    out = pathlib.Path(out).with_suffix(".bin")
    out.parent.mkdir(parents=True, exist_ok=True)
    count, files = 0, []
    with open(out, "wb") as f:
        for text_path in texts:
            ids = tokenizer(pathlib.Path(text_path).read_text(), add_special_tokens=False)["input_ids"]
            if tokenizer.eos_token_id is not None:
                ids = list(ids) + [tokenizer.eos_token_id]
            np.asarray(ids, dtype=dtype).tofile(f)
            count += len(ids)
            files.append(str(text_path))
    meta = {
        "dtype": np.dtype(dtype).name,
        "vocab_size": vocab,
        "num_tokens": count,
        "tokenizer": str(tokenizer_path),
        "files": files,
    }
    _meta_path(out).write_text(json.dumps(meta, indent=2))
    return meta


def source_shape(spec: str) -> tuple[int | None, int | None]:
    """(vocab size, number of tokens) of a source without reading its tokens;
    None where the source has no fixed one. ValueError when it cannot be opened."""
    if spec == "synthetic":
        return None, None
    if spec == "builtin":
        return BUILTIN_VOCAB, None
    path = pathlib.Path(spec)
    meta_file = _meta_path(path)
    if not path.is_file() or not meta_file.is_file():
        raise ValueError(
            f"{spec} is not 'builtin', 'synthetic' or a token file from `hetjax prepare` "
            f"(it needs {path.name} and {meta_file.name})"
        )
    try:
        meta = json.loads(meta_file.read_text())
        return int(meta["vocab_size"]), int(meta["num_tokens"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{meta_file}: not the metadata `hetjax prepare` writes ({type(e).__name__}: {e})") from None


def make_source(spec: str, seed: int = 0, vocab_size: int | None = None) -> ArrayTokens | SyntheticTokens:
    """``builtin``, ``synthetic`` or the path of a token file."""
    if spec == "builtin":
        return builtin_tokens(seed)
    if spec == "synthetic":
        if vocab_size is None:
            raise ValueError("the synthetic source needs the model's vocab size")
        return SyntheticTokens(vocab_size, seed)
    return open_token_file(spec, seed)


# ---- `hetjax prepare` --------------------------------------------------------


def add_arguments(p) -> None:
    p.add_argument("texts", nargs="+", help="local text files")
    p.add_argument("--tokenizer", required=True, help="local folder of a Hugging Face tokenizer")
    p.add_argument("--out", required=True, help="token file to write (<out>.bin + <out>.json)")


def run(args) -> int:
    problem = _prepare_problem(args)
    if problem:
        print(f"hetjax prepare: {problem}", file=sys.stderr)
        return 2
    meta = prepare_token_file(args.texts, args.tokenizer, args.out)
    print(
        f"wrote {meta['num_tokens']} tokens ({meta['dtype']}, vocab {meta['vocab_size']}) "
        f"to {pathlib.Path(args.out).with_suffix('.bin')}"
    )
    return 0


def _prepare_problem(args) -> str | None:
    """What makes `hetjax prepare` impossible before it tokenizes anything."""
    import importlib.util

    for text in args.texts:
        if not pathlib.Path(text).is_file():
            return f"text file {text} does not exist"
    tokenizer = pathlib.Path(args.tokenizer)
    if not tokenizer.is_dir():
        return f"--tokenizer {args.tokenizer}: expected a local folder of a Hugging Face tokenizer"
    known = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    if not any((tokenizer / name).is_file() for name in known):
        return f"--tokenizer {args.tokenizer}: none of {', '.join(known)} in it"
    out = pathlib.Path(args.out).with_suffix(".bin")
    if out.parent.exists() and not out.parent.is_dir():
        return f"--out {args.out}: {out.parent} is a file, not a folder"
    if importlib.util.find_spec("transformers") is None:
        return "tokenizing needs transformers: pip install transformers"
    return None
