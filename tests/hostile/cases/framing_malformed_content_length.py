# A Content-Length that is not a number: libmicrohttpd's own 400, judged before any callback of
# the server's; 0.9.75 writes that answer's head twice, which the server cannot prevent
# (docs/serve.md), so only the first head is checked.
RAW = True
EXPECT = 400
HEAD_TWICE = True


def request():
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\nConnection: close\r\n\r\n{}"
