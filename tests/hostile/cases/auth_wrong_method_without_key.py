# Nor can methods: a wrong method without the key is a 401, not a 405.
KEY = True
EXPECT = 401


def request():
    return ("DELETE", "/v1/chat/completions", {}, None)
