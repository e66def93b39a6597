"""A stand-in rollout server for the lifecycle tests: `python fake_server.py PORT PIDFILE [MODE]`.

It starts a child process (as vLLM's server starts its engine core), writes both pids to PIDFILE,
and serves GET /health. MODE: `ok` (default); `hang` (answers /health, never answers /slow);
`exit` (exits with code 3 before serving, after printing a line to its log)."""

import http.server
import os
import subprocess
import sys
import time

port, pidfile = int(sys.argv[1]), sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "ok"
if mode == "exit":
    print("fake server: cannot load the model", flush=True)
    sys.exit(3)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
with open(pidfile, "w") as f:
    f.write(f"{os.getpid()} {child.pid}\n")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/slow":
            time.sleep(3600)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"ok": true}')

    def log_message(self, *args):
        pass


print("fake server: listening", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
