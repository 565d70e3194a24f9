# A negative Content-Length: libmicrohttpd's own 400, its head written twice by 0.9.75 (see
# framing_malformed_content_length.py).
RAW = True
EXPECT = 400
HEAD_TWICE = True


def request():
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\nConnection: close\r\n\r\n{}"
