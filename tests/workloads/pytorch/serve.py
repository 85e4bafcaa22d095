"""A small transformer inference server, as a PyTorch user writes one.

    python serve.py --socket PATH [--layers 2] [--dim 128]

A TransformerEncoder language model with random weights (nothing is
downloaded) answers requests on a Unix socket: each request is one line,
"<tokens> <new>", the server encodes a prompt of <tokens> random token ids
and generates <new> tokens greedily, one forward pass each, and answers one
line with the generated ids. Runs on the CPU under torch.inference_mode().
--ready FILE is created once the model is built and the socket listens.
"""

import argparse
import os
import socket

import torch
import torch.nn as nn


class TinyLM(nn.Module):
    def __init__(self, vocab, dim, layers, heads):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)))


def generate(model, prompt, new):
    ids = prompt
    out = []
    for _ in range(new):
        nxt = model(ids)[:, -1].argmax(-1, keepdim=True)
        out.append(int(nxt))
        ids = torch.cat([ids, nxt], dim=1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ready", help="file created once the server listens")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.dim, args.layers, args.heads).eval()
    try:
        os.unlink(args.socket)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(args.socket)
    srv.listen(8)
    if args.ready:
        with open(args.ready + ".tmp", "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(args.ready + ".tmp", args.ready)
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        while True:
            conn, _ = srv.accept()
            with conn, conn.makefile("rw") as f:
                for line in f:
                    tokens, new = (int(v) for v in line.split())
                    prompt = torch.randint(0, args.vocab, (1, tokens), generator=gen)
                    f.write(" ".join(map(str, generate(model, prompt, new))) + "\n")
                    f.flush()


if __name__ == "__main__":
    main()
