# A chunk size that is not hexadecimal.
RAW = True
EXPECT = 400


def request():
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")
