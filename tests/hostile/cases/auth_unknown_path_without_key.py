# With a key set, an unknown path without the key is a 401, not a 404: routes cannot be enumerated.
KEY = True
EXPECT = 401


def request():
    return ("GET", "/v1/secret-admin", {}, None)
