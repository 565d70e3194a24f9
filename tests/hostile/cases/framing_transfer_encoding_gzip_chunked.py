# gzip, chunked: a coding on top of chunked is not supported either.
RAW = True
EXPECT = 501


def request():
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n"
            b"Connection: close\r\n\r\n4\r\n\x1f\x8b\x08\x00\r\n0\r\n\r\n")
