"""/tokenize and /detokenize (llama.cpp's server's), content an object: a 400 in OpenAI's format naming content."""
import json

EXPECT = 400


def request():
    body = {"content": {"text": "hi"}}
    return ("POST", "/tokenize", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    error = json.loads(body)["error"]
    if error["param"] != "content" or not error["message"].startswith("content: "):
        return "not an error naming content: %s" % error
    return None
