"""Pretrain a small BERT-style encoder in PyTorch (masked LM + next sentence) on records read by dlstore.

The model is written out below in plain torch: token, position and segment embeddings, a stack of
``nn.TransformerEncoderLayer``, a masked-LM head tied to the token embedding and a next-sentence
head on the [CLS] token. Data: dlstore's BERT pipeline (the seven pretraining features parsed in
C++ into fixed-shape batches) through :class:`dlstore.adapters.torch.TorchLoader`, which hands the
loader's arrays to torch without a copy (and copies them to the GPU from pinned memory when there
is one). Each rank reads its share of the records.

    python examples/pytorch_bert.py --steps 5 --batch-size 8
    mpirun -np 2 --allow-run-as-root python examples/pytorch_bert.py --steps 2
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from data_parallel import add_training_args, data_parallel, log, threads_per_rank

import dlstore
import dlstore.synthetic
from dlstore.adapters.torch import TorchLoader
from dlstore.pipeline import Bert, Loader

VOCAB_SIZE = 30522  # bert-base-uncased, as the synthetic set and create_pretraining_data.py use


class BertPretraining(nn.Module):
    """A BERT encoder with its two pretraining heads (sizes are arguments; BERT-base is 768/12/12)."""

    def __init__(self, hidden: int = 128, layers: int = 2, heads: int = 2, seq_len: int = 128,
                 vocab_size: int = VOCAB_SIZE):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, hidden)
        self.positions = nn.Embedding(seq_len, hidden)
        self.segments = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        layer = nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=4 * hidden, dropout=0.1,
                                           activation="gelu", batch_first=True, norm_first=False)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.mlm_transform = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=1e-12))
        self.mlm_bias = nn.Parameter(torch.zeros(vocab_size))
        self.pooler = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh())
        self.nsp = nn.Linear(hidden, 2)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, input_ids, input_mask, segment_ids, masked_lm_positions):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.norm(self.tokens(input_ids) + self.positions(positions) + self.segments(segment_ids))
        x = self.encoder(x, src_key_padding_mask=input_mask == 0)
        # Masked LM: only the masked positions go through the vocabulary projection.
        picked = torch.gather(x, 1, masked_lm_positions.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        mlm_logits = self.mlm_transform(picked) @ self.tokens.weight.T + self.mlm_bias
        nsp_logits = self.nsp(self.pooler(x[:, 0]))
        return mlm_logits, nsp_logits


def pretraining_loss(mlm_logits, nsp_logits, batch):
    """Masked-LM cross-entropy over the real predictions (``masked_lm_weights``) plus next-sentence loss."""
    weights = batch["masked_lm_weights"]
    per_slot = F.cross_entropy(mlm_logits.flatten(0, 1), batch["masked_lm_ids"].flatten(), reduction="none")
    mlm = (per_slot * weights.flatten()).sum() / weights.sum().clamp(min=1.0)
    nsp = F.cross_entropy(nsp_logits, batch["next_sentence_labels"].flatten())
    return mlm + nsp, mlm, nsp


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_training_args(parser, batch_size=16, steps=5, lr=1e-3)
    parser.add_argument("--seq-len", type=int, default=128, choices=[128, 384])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)

    world, average_gradients = data_parallel(args.dist)
    torch.manual_seed(args.seed)
    torch.set_num_threads(threads_per_rank(world))
    # The tiny synthetic set is made for seq 128; 384 is its own set (sequence and prediction slots).
    shape = {} if args.seq_len == 128 else {"seq_len": 384, "max_predictions": Bert(384).max_predictions}
    paths = args.data or dlstore.synthetic.cached_dataset("bert", "tiny", progress=world.rank == 0, **shape)

    # This rank's share of the records (a shuffled dlstore.Dataset), then the native loader (C++ parsing
    # in a background thread). The loader calls the dataset's set_epoch before each epoch: a new order
    # every epoch; remainder="drop" gives every rank the same number of full batches.
    dataset = dlstore.Dataset(paths, world=world, shuffle="block", seed=args.seed, remainder="drop")
    loader = Loader(dataset, Bert(seq_len=args.seq_len), args.batch_size, last_batch="DROP", seed=args.seed,
                    epochs=None)
    batches = TorchLoader(loader)
    model = BertPretraining(hidden=args.hidden, layers=args.layers, heads=max(1, args.hidden // 64),
                            seq_len=args.seq_len).to(batches.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    start = time.perf_counter()
    step = samples = 0
    for batch in batches:
        mlm_logits, nsp_logits = model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                                       batch["masked_lm_positions"])
        loss, mlm, nsp = pretraining_loss(mlm_logits, nsp_logits, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        average_gradients(model.parameters())
        optimizer.step()
        step += 1
        samples += batch["input_ids"].shape[0]
        log(world, f"step {step} loss {loss.item():.4f} (mlm {mlm.item():.4f}, nsp {nsp.item():.4f})")
        if step == args.steps:
            break
    loader.close()
    elapsed = time.perf_counter() - start
    if step == 0:
        raise SystemExit(f"rank {world.rank} got no full batch of {args.batch_size}: use a smaller --batch-size")
    stats = loader.stats()
    log(world, f"done: {step} steps, {samples} sequences in {elapsed:.1f} s; loader: {stats['batches']} batches, "
               f"waited {stats['consumer_wait_s']:.3f} s for data; engine {stats.get('engine')}")


if __name__ == "__main__":
    main()
