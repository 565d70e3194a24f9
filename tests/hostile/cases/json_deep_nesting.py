# JSON nested 100,000 deep: refused by the parser's depth limit, not a stack overflow.
EXPECT = 400


def request():
    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, b"[" * 100000 + b"]" * 100000)
