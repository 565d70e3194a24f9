# A Content-Length far past --max-body (and past 2^64): refused from the headers, nothing read.
RAW = True
EXPECT = 413


def request():
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n"
            b"Connection: close\r\n\r\n{}")
