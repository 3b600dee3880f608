"""The corpus, the tokenizer and the training batches.

The corpus is the text of Python's interactive help topics (`pydoc_data.topics`, part of CPython), so
every machine has it offline; `corpus(part, parts)` cuts it into equal slices.
"""
import re
from collections import Counter

import torch

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
        self.known = {}      # piece -> its ids: a text repeats few distinct pieces many times

    def encode_piece(self, piece: str) -> list[int]:
        if piece not in self.known:
            self.known[piece] = self.split(piece)
        return self.known[piece]

    def split(self, piece: str) -> list[int]:
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




def make_batches(text: str, tokenizer: Tokenizer, batch_size: int, seq_len: int, steps: int, seed: int):
    """`steps` batches of (inputs, targets), each [batch_size, seq_len] token ids, targets = inputs shifted by one.

    Row b of batch s is the seq_len + 1 tokens that start at the first token of piece number
    `torch.randint(len(pieces) - seq_len - 1, (steps, batch_size), generator=torch.Generator().manual_seed(seed))[s, b]`
    of the text's pieces, so a seed gives the same batches, in the same order, every time.

    The text is tokenized once, in this process: windows are then slices of one tensor, and no worker
    process waits on the tokenizer (pure Python, which holds the GIL)."""
    pieces = PIECE.findall(text)
    encoded = [tokenizer.encode_piece(piece) for piece in pieces]
    ids = torch.tensor([t for piece in encoded for t in piece], dtype=torch.int32)     # half int64's bytes
    piece_start = torch.tensor([0] + [len(piece) for piece in encoded[:-1]]).cumsum(0)
    picks = torch.randint(len(pieces) - seq_len - 1, (steps, batch_size), generator=torch.Generator().manual_seed(seed))
    offsets = torch.arange(seq_len + 1)
    for starts in piece_start[picks]:
        window = ids[starts.unsqueeze(1) + offsets].long()
        yield window[:, :-1], window[:, 1:]
