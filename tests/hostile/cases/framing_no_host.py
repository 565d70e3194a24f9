# HTTP/1.1 without Host (which the protocol requires).
RAW = True
EXPECT = 400


def request():
    return b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n"
