"""Ollama's API, model a number: a 400 in Ollama's format ({"error": "..."}) naming model."""
import json

EXPECT = 400


def request():
    body = {"model": 5}
    return ("POST", "/api/show", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "model" not in answer["error"]:
        return "not Ollama's error naming model: %s" % answer
    return None
