#!/usr/bin/env python3
"""Replays the hostile-request corpus (tests/hostile/cases/*.py) against a real `ember serve`.

usage: run.py EMBER MODEL WORK_DIR [CASE.py ...]

Each case is a Python file defining `request()` and `EXPECT` (the HTTP status it must get):
  request() -> (method, path, headers_dict, body_bytes)   sent as one ordinary HTTP/1.1 request;
  with `RAW = True`, request() -> bytes                    sent as they are on a fresh socket;
  with `KEY = True`                                        sent to a server started with --api-key
                                                           (the key is `KEY_VALUE` below);
  with `HEAD_TWICE = True`                                 the one answer libmicrohttpd 0.9.75 writes
                                                           itself with its head twice (a malformed
                                                           Content-Length, docs/serve.md): only the
                                                           first head is checked.
For every case: the status must be EXPECT, the answer must come within LIMIT seconds and be one
well-formed HTTP response (a status line, headers, a body as long as its Content-Length or whole
chunks, nothing after it), and /health must answer 200 afterwards. The servers must then stop
cleanly on SIGTERM, with no sanitizer report in their logs.
"""
import glob
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time

LIMIT = 10.0  # seconds: generous, for a sanitizer build on a loaded machine; not a measurement
KEY_VALUE = "sk-hostile-test"


def start_server(ember, model, work, name, key):
    log = open(os.path.join(work, name + ".log"), "w+")
    args = [ember, "serve", "-m", model, "--port", "0", "--device", "cpu", "--threads", "2", "--ctx", "512",
            "--kv-sequences", "2"]
    if key:
        args += ["--api-key", key]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline:
        log.seek(0)
        m = re.search(r"listening on http://([^ :]+):(\d+)", log.read())
        if m:
            return proc, log, (m.group(1), int(m.group(2)))
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    log.seek(0)
    sys.exit("FAIL: ember serve did not start: " + log.read()[-2000:])


def encode(method, path, headers, body, address):
    lines = ["%s %s HTTP/1.1" % (method, path)]
    names = {k.lower() for k in headers}
    if "host" not in names:
        lines.append("Host: %s:%d" % address)
    if body is not None and "content-length" not in names and "transfer-encoding" not in names:
        lines.append("Content-Length: %d" % len(body))
    lines.append("Connection: close")
    lines += ["%s: %s" % (k, v) for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def read_response(sock, deadline, head_twice=False):
    """One response: (status, head, body), or raises ValueError saying what is malformed."""
    data = b""

    def more():
        nonlocal data
        sock.settimeout(max(0.01, deadline - time.time()))
        chunk = sock.recv(65536)
        if not chunk:
            return False
        data += chunk
        return True

    while b"\r\n\r\n" not in data:
        if not more():
            raise ValueError("the connection closed before a whole response head: %r" % data[:200])
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", lines[0] + b" ")
    if not m:
        raise ValueError("bad status line %r" % lines[0])
    fields = {}
    for line in lines[1:]:
        if b":" not in line:
            raise ValueError("bad header line %r" % line)
        k, v = line.split(b":", 1)
        k = k.strip().lower()
        if k in fields and k in (b"content-length", b"transfer-encoding"):
            raise ValueError("%s written twice in the response" % k.decode())
        fields[k] = v.strip()
    data = rest
    if b"chunked" in fields.get(b"transfer-encoding", b""):
        while not re.search(rb"(^|\r\n)0\r\n\r\n", data):
            if not more():
                raise ValueError("the chunked body ends early")
        body = data
    elif b"content-length" in fields:
        n = int(fields[b"content-length"])
        while len(data) < n:
            if not more():
                raise ValueError("the body is shorter than its Content-Length")
        body, data = data[:n], data[n:]
    else:
        while more():
            pass
        body, data = data, b""
    # Nothing may follow the response (the cases send one request): a second head is the bug of a
    # response written twice.
    end = time.time() + 0.3
    while not data and time.time() < end:
        try:
            sock.settimeout(0.3)
            chunk = sock.recv(65536)
        except (socket.timeout, ConnectionError):
            break
        if not chunk:
            break
        data += chunk
    if data and not head_twice:
        raise ValueError("%d bytes after the response: %r" % (len(data), data[:120]))
    return int(m.group(1)), head, body


def exchange(address, payload, head_twice=False):
    deadline = time.time() + LIMIT
    sock = socket.create_connection(address, timeout=LIMIT)
    try:
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading everything
        return read_response(sock, deadline, head_twice)
    finally:
        sock.close()


def load(path):
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    ember, model, work = sys.argv[1:4]
    here = os.path.dirname(os.path.abspath(__file__))
    paths = sys.argv[4:] or sorted(glob.glob(os.path.join(here, "cases", "*.py")))
    os.makedirs(work, exist_ok=True)
    cases = [(os.path.basename(p)[:-3], load(p)) for p in paths]
    servers = {}
    failures = 0
    for name, case in cases:
        keyed = getattr(case, "KEY", False)
        if keyed not in servers:
            servers[keyed] = start_server(ember, model, work, "serve-key" if keyed else "serve",
                                          KEY_VALUE if keyed else None)
        proc, log, address = servers[keyed]
        started = time.time()
        try:
            if getattr(case, "RAW", False):
                payload = case.request()
            else:
                method, path, headers, body = case.request()
                payload = encode(method, path, headers or {}, body, address)
            status, head, body = exchange(address, payload, getattr(case, "HEAD_TWICE", False))
            took = time.time() - started
            problem = None
            if status != case.EXPECT:
                problem = "status %d, expected %d: %s" % (status, case.EXPECT, body[:300])
            elif took > LIMIT:
                problem = "answered after %.1f s" % took
        except (ValueError, OSError) as e:
            took, problem = time.time() - started, "%s" % e
        if not problem:
            try:
                health = exchange(address, encode("GET", "/health", {}, None, address))[0]
                if health != 200:
                    problem = "/health answered %d afterwards" % health
            except (ValueError, OSError) as e:
                problem = "/health did not answer afterwards: %s" % e
        if proc.poll() is not None:
            problem = "the server exited (%s)" % proc.returncode
        if problem:
            failures += 1
            print("FAIL %-40s %s" % (name, problem))
        else:
            print("ok   %-40s %d in %.2f s" % (name, status, took))
        sys.stdout.flush()
        if proc.poll() is not None:
            break
    for keyed, (proc, log, address) in servers.items():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                failures += 1
                print("FAIL the server did not stop within 60 s of SIGTERM")
        if proc.returncode != 0:
            failures += 1
            print("FAIL the server exited %s" % proc.returncode)
        log.seek(0)
        text = log.read()
        if re.search(r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:", text):
            failures += 1
            print("FAIL sanitizer report in the server's log:\n" + text[-4000:])
    print("%d of %d cases failed" % (failures, len(cases)) if failures else "all %d cases passed" % len(cases))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
