# Two Content-Length headers that disagree: which body is meant is ambiguous (request smuggling), so
# the request is refused before any body is read.
RAW = True
EXPECT = 400


def request():
    body = b'{"model":"x","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}'
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nContent-Length: 5\r\nConnection: close\r\n\r\n" % len(body)) + body
