# A body that is not JSON at all.
EXPECT = 400


def request():
    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, b"\x00\xff\xfe not json")
