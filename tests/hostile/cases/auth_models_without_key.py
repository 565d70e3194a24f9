# /v1/models needs the key too.
KEY = True
EXPECT = 401


def request():
    return ("GET", "/v1/models", {}, None)
