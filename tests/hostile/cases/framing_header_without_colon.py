# A header line without a colon.
RAW = True
EXPECT = 400


def request():
    return b"GET /health HTTP/1.1\r\nHost: x\r\nthis is not a header\r\nConnection: close\r\n\r\n"
