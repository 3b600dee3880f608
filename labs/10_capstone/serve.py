"""Serving: write a trained model to one file, load it, and predict the next token."""
from dataclasses import asdict

import torch

from .model import LM, ModelConfig


def export(model: LM, path) -> None:
    """Write what serving needs to `path`."""
    torch.save({"config": asdict(model.config), "state": model.state_dict()}, path)


def load(path):
    """The served model, from a file that `export` wrote."""
    saved = torch.load(path)
    model = LM(ModelConfig(**saved["config"]))
    model.load_state_dict(saved["state"])
    return model.eval()


def next_token_logits(served, ids: torch.Tensor) -> torch.Tensor:
    """Logits of the token after each row of `ids` ([batch, length] -> [batch, vocab_size])."""
    with torch.no_grad():
        return served(ids)[:, -1]


def generate(served, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """`ids` followed by `new_tokens` greedy predictions."""
    for _ in range(new_tokens):
        ids = torch.cat([ids, next_token_logits(served, ids).argmax(-1, keepdim=True)], dim=1)
    return ids
