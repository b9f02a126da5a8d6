#!/usr/bin/env python3
"""Issue 15: broker RSS under concurrent large HTTP produce bodies (admin API).

Starts `weir serve` (WEIR, default target/debug/weir; set CARGO_TARGET_DIR's) on free
ports in a temp dir, sends CONC (default 8) concurrent POST /topics/big/records bodies of
~100 MB (a JSON array of 1 KiB STRING records), ROUNDS (default 1) times, and prints each
answer's status and VmRSS / VmHWM (peak) / RssAnon / RssFile in MB, 5 s after each round.
A figure, not a test: RSS depends on the allocator.

    WEIR=/var/tmp/target-h1/debug/weir CONC=8 python3 benches/admin_rss.py
"""
import json, os, socket, subprocess, sys, tempfile, threading, time

d = tempfile.mkdtemp(prefix="weir-admin-rss-")
weir = os.environ.get("WEIR", "target/debug/weir")
p = subprocess.Popen([weir, "serve", "--override", "listeners=PLAINTEXT://127.0.0.1:0",
    "--override", f"log.dirs={d}", "--override", "admin.listeners=http://127.0.0.1:0",
    "--override", f"connect.allowed.paths={d}"] + sys.argv[1:],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
p.stdout.readline()
host, port = p.stdout.readline().strip().split("http://")[-1].split(":")


def rss():
    s = open(f"/proc/{p.pid}/status").read()
    g = lambda k: int([x for x in s.splitlines() if x.startswith(k)][0].split()[1]) // 1024
    return {k: g(k + ":") for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}


def post(body, out, i):
    s = socket.create_connection((host, int(port)))
    s.sendall(f"POST /topics/big/records HTTP/1.1\r\nHost: w\r\nContent-Type: application/json"
              f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    try:
        s.sendall(body)
    except OSError:
        pass  # a refused request is answered (and closed) before its body is read
    try:
        while c := s.recv(65536):
            data += c
    except OSError:
        pass
    out[i] = data.split(b"\r\n", 1)[0].decode(errors="replace")


rec = json.dumps({"value": {"type": "STRING", "data": "x" * 1000}})
body = ("[" + ",".join([rec] * (100_000_000 // (len(rec) + 1))) + "]").encode()
time.sleep(1)
print("body bytes", len(body), "before (MB)", rss())
for n in range(int(os.environ.get("ROUNDS", "1"))):
    k = int(os.environ.get("CONC", "8"))
    out = [None] * k
    ts = [threading.Thread(target=post, args=(body, out, i)) for i in range(k)]
    t0 = time.time()
    [t.start() for t in ts]
    [t.join() for t in ts]
    print("answers", out, "in", round(time.time() - t0), "s")
    time.sleep(5)
    print("round", n, "after (MB)", rss())
p.kill()
