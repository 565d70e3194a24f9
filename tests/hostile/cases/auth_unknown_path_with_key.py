# With the key, an unknown path is told apart.
KEY = True
EXPECT = 404


def request():
    return ("GET", "/v1/secret-admin", {"x-api-key": "sk-hostile-test"}, None)
