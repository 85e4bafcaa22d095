"""A client of serve.py: plain Python, it never imports torch.

    python client.py --socket PATH [--requests N] [--tokens 32] [--new 8]
                     [--out FILE] [--progress FILE]

Sends N requests one after another (0: until killed) and measures each one's
latency. --progress FILE holds the number of answered requests; --out FILE
gets a JSON summary at the end: requests, seconds, requests per second and
latency p50/p99 in milliseconds.
"""

import argparse
import json
import os
import socket
import time


def write_atomic(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values)) - 1))
    return sorted_values[i]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--requests", type=int, default=0, help="0: until killed")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--out")
    ap.add_argument("--progress")
    args = ap.parse_args()

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(args.socket)
    f = conn.makefile("rw")
    lat = []
    t0 = time.monotonic()
    while not args.requests or len(lat) < args.requests:
        t = time.monotonic()
        f.write(f"{args.tokens} {args.new}\n")
        f.flush()
        answer = f.readline().split()
        if len(answer) != args.new:
            raise SystemExit(f"client: bad answer {answer!r}")
        lat.append((time.monotonic() - t) * 1000)
        if args.progress:
            write_atomic(args.progress, f"{len(lat)}\n")
    secs = time.monotonic() - t0
    s = sorted(lat)
    summary = {"requests": len(lat), "seconds": round(secs, 3), "rps": round(len(lat) / secs, 3),
               "p50_ms": round(percentile(s, 50), 3), "p99_ms": round(percentile(s, 99), 3)}
    print(json.dumps(summary), flush=True)
    if args.out:
        write_atomic(args.out, json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
