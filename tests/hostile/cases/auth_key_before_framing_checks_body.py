# Without the key, a large declared body is refused with 401 from the headers, never read.
KEY = True
EXPECT = 401


def request():
    return ("POST", "/v1/chat/completions", {"Content-Length": "3000000"}, b"{")
