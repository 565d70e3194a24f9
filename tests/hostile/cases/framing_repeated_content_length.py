# The same Content-Length twice: still refused, one is all HTTP/1.1 allows a sender.
RAW = True
EXPECT = 400


def request():
    body = b'{"model":"x","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}'
    n = b"%d" % len(body)
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + n +
            b"\r\nContent-Length: " + n + b"\r\nConnection: close\r\n\r\n") + body
