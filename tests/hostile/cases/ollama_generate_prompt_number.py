"""Ollama's API, prompt a number: a 400 in Ollama's format ({"error": "..."}) naming prompt."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "prompt": 42}
    return ("POST", "/api/generate", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "prompt" not in answer["error"]:
        return "not Ollama's error naming prompt: %s" % answer
    return None
