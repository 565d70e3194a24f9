#!/usr/bin/env python3
"""Slow clients cannot lock others out of `ember serve`.

usage: slow_clients.py EMBER MODEL WORK_DIR [SOCKETS]

From one address (127.0.0.1), SOCKETS (300) connections trickle their request a byte at a time:
half of them their headers, half a body far shorter than the Content-Length they announced. While
they trickle, /health and a normal chat request (max_tokens 4) must still be answered within
ANSWER_LIMIT (issue #62's "within a second"; a sanitizer build answers both in a tenth of that).
Then the server must stop cleanly on SIGTERM, with no sanitizer report.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

LIMIT = 10.0  # seconds for a connection to give up
ANSWER_LIMIT = 1.0


def main():
    ember, model, work = sys.argv[1:4]
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 300
    os.makedirs(work, exist_ok=True)
    log = open(os.path.join(work, "slow_clients.log"), "w+")
    proc = subprocess.Popen([ember, "serve", "-m", model, "--port", "0", "--device", "cpu", "--threads", "2",
                             "--ctx", "512", "--kv-sequences", "2"], stdout=log, stderr=subprocess.STDOUT)
    address = None
    for _ in range(1200):
        log.seek(0)
        m = re.search(r"listening on http://([^ :]+):(\d+)", log.read())
        if m:
            address = (m.group(1), int(m.group(2)))
            break
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    if not address:
        log.seek(0)
        sys.exit("FAIL: ember serve did not start: " + log.read()[-2000:])

    stop = threading.Event()
    socks, opened, cut = [], [0], [0]

    def trickle(kind):
        try:
            s = socket.create_connection(address, timeout=5)
        except OSError:
            cut[0] += 1
            return
        opened[0] += 1
        if kind == "body":
            head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000000\r\n\r\n")
        else:
            head = b""
        text = head + b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10000
        socks.append(s)
        try:
            if head:
                s.sendall(head)
                text = b"{" * 10000
            for i in range(len(text)):
                if stop.is_set():
                    break
                s.sendall(text[i:i + 1])
                stop.wait(0.5)
        except OSError:
            cut[0] += 1  # the server cut it: what it should do to slow senders

    threads = [threading.Thread(target=trickle, args=("headers" if i % 2 else "body",), daemon=True)
               for i in range(count)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # all connected and trickling

    def timed(payload):
        started = time.time()
        s = socket.create_connection(address, timeout=LIMIT)
        s.sendall(payload)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        status = int(data[9:12]) if data.startswith(b"HTTP/1.") else 0
        return status, time.time() - started

    failures = 0
    try:
        health, health_s = timed(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        body = b'{"model":"x","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}'
        chat, chat_s = timed(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                             b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    except OSError as e:
        health, health_s, chat, chat_s = 0, 0, 0, 0
        print("FAIL a request during the trickle: %s" % e)
        failures += 1
    print("%d slow sockets opened (%d cut by the server so far); /health %d in %.3f s; chat %d in %.3f s"
          % (opened[0], cut[0], health, health_s, chat, chat_s))
    if health != 200 or health_s > ANSWER_LIMIT:
        print("FAIL /health during the trickle: %d after %.1f s" % (health, health_s))
        failures += 1
    if chat != 200 or chat_s > ANSWER_LIMIT:
        print("FAIL chat during the trickle: %d after %.1f s" % (chat, chat_s))
        failures += 1
    stop.set()
    for s in list(socks):
        try:
            s.close()
        except OSError:
            pass
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        print("FAIL the server did not stop within 60 s of SIGTERM")
        failures += 1
    if proc.returncode != 0:
        print("FAIL the server exited %s" % proc.returncode)
        failures += 1
    log.seek(0)
    text = log.read()
    if re.search(r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:", text):
        print("FAIL sanitizer report in the server's log:\n" + text[-4000:])
        failures += 1
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
