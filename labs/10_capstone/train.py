"""Training: the loss, one optimizer step at a time, and a whole run."""
import torch
import torch.nn.functional as F

from . import data
from .model import ModelConfig, build_model


def loss_fn(model, inputs, targets):
    """Mean next-token cross-entropy of `model` over every position of the batch."""
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Trainer:
    def __init__(self, model, optimizer, batches, bf16: bool = False):
        self.model, self.optimizer, self.batches, self.bf16 = model, optimizer, batches, bf16

    def step(self) -> float:
        """One optimizer step on the next batch; returns its loss."""
        inputs, targets = next(self.batches)
        with torch.cpu.amp.autocast(enabled=self.bf16):
            loss = loss_fn(self.model, inputs, targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


def make_trainer(model_config: ModelConfig, batches, seed: int, lr: float = 3e-3) -> Trainer:
    """A trainer for a new model (`build_model(model_config, seed)`) with AdamW (`lr`, weight decay 0.01)
    on `batches`, an iterable of (inputs, targets)."""
    model = build_model(model_config, seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, foreach=False)
    return Trainer(model, optimizer, iter(batches))


def train(text: str, model_config: ModelConfig, batch_size: int, seq_len: int, steps: int, seed: int,
          lr: float = 3e-3):
    """Tokenize `text`, train a new model for `steps` steps; returns (trainer, losses, tokenizer)."""
    tokenizer = data.build_tokenizer(text, model_config.vocab_size)
    batches = data.make_batches(text, tokenizer, batch_size, seq_len, steps, seed)
    trainer = make_trainer(model_config, batches, seed, lr)
    losses = [trainer.step() for _ in range(steps)]
    return trainer, losses, tokenizer
