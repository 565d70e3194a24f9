"""/tokenize and /detokenize (llama.cpp's server's), a token id past every vocabulary: a 400 in OpenAI's format naming tokens[1]."""
import json

EXPECT = 400


def request():
    body = {"tokens": [1, 99999999999]}
    return ("POST", "/detokenize", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    error = json.loads(body)["error"]
    if error["param"] != "tokens[1]" or not error["message"].startswith("tokens[1]: "):
        return "not an error naming tokens[1]: %s" % error
    return None
