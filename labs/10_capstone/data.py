"""The corpus, the tokenizer and the training batches.

The corpus is the text of Python's interactive help topics (`pydoc_data.topics`, part of CPython), so
every machine has it offline; `corpus(part, parts)` cuts it into equal slices.
"""
import os
import re
from collections import Counter

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

PIECE = re.compile(r"\w+|[^\w\s]|\s+")     # words, single punctuation marks, runs of white space
BYTES = 256                                # ids 0-255 are the UTF-8 bytes


def corpus(part: int = 0, parts: int = 2) -> str:
    """Slice `part` of `parts` equal slices of the help topics' text, the topics joined in sorted order."""
    from pydoc_data.topics import topics
    text = "\n".join(topics[name] for name in sorted(topics))
    size = len(text) // parts
    return text[part * size:(part + 1) * size]


class Tokenizer:
    """Encodes a text piece by piece: in each piece, the longest vocabulary entry that starts the rest of
    it, then the next; a character that starts no entry becomes its UTF-8 bytes. Ids 0-255 are the bytes,
    then the entries in order."""

    def __init__(self, entries: list[str]):
        self.entries = entries
        self.ids = {entry: BYTES + i for i, entry in enumerate(entries)}
        self.longest = max((len(e) for e in entries), default=1)
        self.vocab_size = BYTES + len(entries)

    def encode_piece(self, piece: str) -> list[int]:
        out, i = [], 0
        while i < len(piece):
            for j in range(min(len(piece), i + self.longest), i, -1):
                if piece[i:j] in self.ids:
                    out.append(self.ids[piece[i:j]])
                    i = j
                    break
            else:
                out.extend(piece[i].encode())
                i += 1
        return out

    def encode(self, text: str) -> list[int]:
        return [t for piece in PIECE.findall(text) for t in self.encode_piece(piece)]

    def decode(self, ids) -> str:
        out = bytearray()
        for t in ids:
            out += bytes([t]) if t < BYTES else self.entries[t - BYTES].encode()
        return out.decode(errors="replace")


def build_tokenizer(text: str, vocab_size: int) -> Tokenizer:
    """The vocab_size - 256 most frequent candidates of more than one byte, the most frequent first, ties
    broken by the candidate's text. The candidates are every piece and every 2 to 4 character substring of
    a word piece, each counted as often as its piece occurs."""
    candidates = Counter()
    for piece, n in Counter(PIECE.findall(text)).items():
        candidates[piece] += n
        if piece[0].isalnum():
            for size in (2, 3, 4):
                for i in range(len(piece) - size + 1):
                    candidates[piece[i:i + size]] += n
    ranked = sorted((c for c in candidates if len(c.encode()) > 1), key=lambda c: (-candidates[c], c))
    return Tokenizer(ranked[:vocab_size - BYTES])


class Windows(Dataset):
    """Training windows: seq_len + 1 consecutive tokens from the start of a random piece, tokenized when read."""

    def __init__(self, pieces: list[str], tokenizer: Tokenizer, seq_len: int, count: int):
        self.pieces, self.tokenizer, self.seq_len, self.count = pieces, tokenizer, seq_len, count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        start = np.random.randint(0, len(self.pieces) - self.seq_len - 1)
        ids = []
        for piece in self.pieces[start:start + self.seq_len + 1]:
            ids += self.tokenizer.encode_piece(piece)
        return torch.tensor(ids[:self.seq_len + 1])


def seed_worker(worker_id: int) -> None:
    np.random.seed(os.getpid() % 2**32)     # each worker its own numpy stream


def make_batches(text: str, tokenizer: Tokenizer, batch_size: int, seq_len: int, steps: int, seed: int):
    """`steps` batches of (inputs, targets), each [batch_size, seq_len] token ids, targets = inputs shifted by one.

    Row b of batch s is the seq_len + 1 tokens that start at the first token of piece number
    `torch.randint(len(pieces) - seq_len - 1, (steps, batch_size), generator=torch.Generator().manual_seed(seed))[s, b]`
    of the text's pieces, so a seed gives the same batches, in the same order, every time."""
    pieces = PIECE.findall(text)
    loader = DataLoader(Windows(pieces, tokenizer, seq_len, steps * batch_size), batch_size=batch_size,
                        num_workers=2, worker_init_fn=seed_worker, in_order=False)
    for window in loader:
        yield window[:, :-1], window[:, 1:]
