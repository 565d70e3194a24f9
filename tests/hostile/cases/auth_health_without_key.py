# /health stays open (probes send no credentials).
KEY = True
EXPECT = 200


def request():
    return ("GET", "/health", {}, None)
