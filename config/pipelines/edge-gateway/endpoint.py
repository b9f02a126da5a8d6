#!/usr/bin/env python3
"""The edge gateway's local test endpoint: appends the body of every POST (one line of
JSON per request) to a file and answers 200.

    python3 endpoint.py [PORT] [OUTPUT]    (defaults: 8099, work/received.jsonl)

Prints "listening on PORT" once it accepts requests.
"""
import http.server
import sys

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 8099
OUTPUT = sys.argv[2] if len(sys.argv) > 2 else "work/received.jsonl"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        with open(OUTPUT, "ab") as f:
            f.write(body.replace(b"\n", b" ") + b"\n")
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, fmt, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", PORT), Handler)
print(f"listening on {server.server_address[1]}", flush=True)
server.serve_forever()
