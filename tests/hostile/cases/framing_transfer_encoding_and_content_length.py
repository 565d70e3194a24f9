# Both Transfer-Encoding and Content-Length: the classic smuggling pair, refused.
RAW = True
EXPECT = 400


def request():
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Length: 4\r\nConnection: close\r\n\r\n0\r\n\r\n")
