"""Ollama's API, raw a string: a 400 in Ollama's format ({"error": "..."}) naming raw."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "prompt": "hi", "raw": "yes"}
    return ("POST", "/api/generate", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "raw" not in answer["error"]:
        return "not Ollama's error naming raw: %s" % answer
    return None
