"""/tokenize and /detokenize (llama.cpp's server's), a token id that is not an integer: a 400 in OpenAI's format naming tokens[0]."""
import json

EXPECT = 400


def request():
    body = {"tokens": [1e+30]}
    return ("POST", "/detokenize", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    error = json.loads(body)["error"]
    if error["param"] != "tokens[0]" or not error["message"].startswith("tokens[0]: "):
        return "not an error naming tokens[0]: %s" % error
    return None
