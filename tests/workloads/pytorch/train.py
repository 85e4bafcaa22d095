"""A small image-classification training job, as a PyTorch user writes one.

    python train.py [--workers 2] [--steps N] [--progress FILE] ...
    torchrun --nproc-per-node 2 train.py ...     (DDP over gloo)

Runs on the CPU. Samples are raw byte files that DataLoader worker processes
read and decode (a fixed amount of CPU per sample), the trainer runs a small
CNN forward and backward and an Adam step. Under torchrun (RANK and
WORLD_SIZE set) it joins a gloo process group, wraps the model in
DistributedDataParallel and shards the data with a DistributedSampler, so
every step ends in an all-reduce of the gradients.

The work is sized: a step is one batch, whatever the machine's speed. With
--progress FILE the number of finished steps is written there (atomically)
after each step; with --step-times FILE a line "STEP SECONDS" (the job's own
CLOCK_MONOTONIC) is appended there after each step, so that a rate can be
measured on the job's own clock, however late its reader looks; --steps 0
trains until killed. --ready FILE is created once
the first step has finished. With --notify FIFO a line "STEP" is written to
that named pipe after each step, so that a reader can block on it instead of
polling --progress; with --notify-at FILE as well, only once per number that
FILE holds (read after each step): after the first step at or past it. The
pipe is opened after the first step, when the DataLoader workers have
started, so only the trainer holds it and a reader sees end of file once the
trainer has gone.
"""

import argparse
import os
import random
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

SIDE = 32  # decoded images are 3 x SIDE x SIDE


class RawImages(Dataset):
    """Byte files in a directory, decoded into normalised, augmented images."""

    def __init__(self, root, files, count, decode_rounds):
        self.root = root
        self.files = files
        self.count = count
        self.decode_rounds = decode_rounds

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        name = os.path.join(self.root, f"{i % self.files:05d}.raw")
        with open(name, "rb") as f:
            raw = f.read()
        img = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float()
        img = img[: 3 * (2 * SIDE) ** 2].view(3, 2 * SIDE, 2 * SIDE) / 255.0
        # "Decoding" and augmentation: a fixed amount of CPU per sample.
        for _ in range(self.decode_rounds):
            img = F.avg_pool2d(F.pad(img, (1, 1, 1, 1), mode="reflect"), 3, stride=1)
            img = (img - img.mean()) / (img.std() + 1e-5)
        img = F.interpolate(img.unsqueeze(0), size=(SIDE, SIDE), mode="bilinear").squeeze(0)
        return img, i % 10


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * (SIDE // 4) ** 2, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def make_data(root, files):
    os.makedirs(root, exist_ok=True)
    for i in range(files):
        path = os.path.join(root, f"{i:05d}.raw")
        if not os.path.exists(path):
            with open(path + ".tmp", "wb") as f:
                f.write(random.Random(i).randbytes(3 * (2 * SIDE) ** 2))
            os.replace(path + ".tmp", path)


def write_atomic(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def read_int(path):
    """The number a file holds; None if it is missing, empty or half-written."""
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default="/tmp/zernel-train-data")
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--decode-rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=0, help="0: until killed")
    ap.add_argument("--progress", help="file that holds the number of finished steps")
    ap.add_argument("--step-times", help="file that gets a line 'STEP SECONDS' after each step")
    ap.add_argument("--ready", help="file created after the first step")
    ap.add_argument("--notify", help="named pipe that gets a line 'STEP' after each step")
    ap.add_argument("--notify-at", help="with --notify: file holding the step to write a line at (once per value)")
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    if rank == 0:
        make_data(args.data_dir, args.files)
    if world > 1:
        dist.barrier()

    torch.manual_seed(rank)
    data = RawImages(args.data_dir, args.files, 1 << 20, args.decode_rounds)
    sampler = DistributedSampler(data, shuffle=False) if world > 1 else None
    loader = DataLoader(data, batch_size=args.batch, num_workers=args.workers,
                        sampler=sampler, persistent_workers=args.workers > 0)
    model = Net()
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    suffix = f".{rank}" if world > 1 else ""
    step = 0
    t0 = time.monotonic()
    times = open(args.step_times + suffix, "a", buffering=1) if args.step_times else None
    notify, notified = None, None
    while not args.steps or step < args.steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if args.progress:
                write_atomic(args.progress + suffix, f"{step}\n")
            if times:
                times.write(f"{step} {time.monotonic():.3f}\n")
            if args.notify:
                # Opened here, not before the loop: the workers forked at the
                # loader's first batch must not hold the pipe.
                if notify is None:
                    notify = os.open(args.notify + suffix, os.O_WRONLY)
                want = read_int(args.notify_at + suffix) if args.notify_at else step
                if want is not None and step >= want and want != notified:
                    os.write(notify, f"{step}\n".encode())
                    notified = want
            if step == 1 and args.ready:
                write_atomic(args.ready + suffix, f"{os.getpid()}\n")
            if args.steps and step >= args.steps:
                break
    print(f"rank {rank}: {step} steps in {time.monotonic() - t0:.1f} s, loss {loss.item():.3f}", flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
