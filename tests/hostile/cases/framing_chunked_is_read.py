# A chunked body is read (the encoding the server does support), and answered.
RAW = True
EXPECT = 200


def request():
    body = b'{"model":"x","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}'
    half = len(body) // 2
    chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\n\r\n") + chunks
