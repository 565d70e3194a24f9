# A Transfer-Encoding the server cannot read: 501 at once, not a connection waiting for a body whose
# end it cannot find.
RAW = True
EXPECT = 501


def request():
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n"
            b"Content-Type: application/json\r\n\r\n\x1f\x8b\x08\x00")
